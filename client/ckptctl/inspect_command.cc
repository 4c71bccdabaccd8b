// ckptctl inspect: tensors, their values and statistics, and the checkpoint's facts.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/ckptctl/commands.h"
#include "client/ckptctl/offline_common.h"
#include "client/tensor_export.h"
#include "client/tensor_values.h"
#include "daemon/base/dtype.h"
#include "daemon/base/status.h"
#include "daemon/base/units.h"
#include "daemon/bundle/bundle.h"
#include "daemon/bundle/checkpoint_meta.h"
#include "daemon/bundle/crc32c.h"
#include "daemon/io/private_dir.h"
#include "daemon/layout/cast.h"
#include "daemon/store/checkpoint_store.h"

namespace ckptctl {
namespace {
absl::StatusOr<ckptd::TensorStats> Stats(BundleReader& reader, const ckptd::TensorInfo& info) {
  ckptd::TensorStats stats;
  ckptd::Numbers values;
  RETURN_IF_ERROR(ForEachChunk(reader, info, [&](const std::string& bytes) {
    values.clear();
    RETURN_IF_ERROR(ckptd::AppendNumbers(info.dtype, bytes.data(),
                                         bytes.size() / ckptd::DataTypeSize(info.dtype), &values));
    stats.Add(values);
    return absl::OkStatus();
  }));
  return stats;
}

// An exact integer as JSON: every value of an integer dtype fits int64 or uint64.
json IntegerJson(ckptd::ExactInt v) {
  if (v < 0) return static_cast<int64_t>(v);
  return static_cast<uint64_t>(v);
}

json StatsJson(const ckptd::TensorStats& s) {
  json j = {{"count", s.count}, {"nan", s.nan}, {"pos_inf", s.pos_inf}, {"neg_inf", s.neg_inf}};
  if (s.finite > 0) {
    j["min"] = s.integral ? IntegerJson(s.integer_min) : json(s.min);
    j["max"] = s.integral ? IntegerJson(s.integer_max) : json(s.max);
    j["mean"] = s.mean();
    // Integer tensors: whether "mean" (a double) and mean_text (6 decimals) are rounded.
    if (s.integral) {
      j["mean_text"] = s.MeanText();
      j["mean_rounded"] = s.mean_rounded();
    }
  } else {
    j["min"] = j["max"] = j["mean"] = nullptr;
  }
  return j;
}

std::string StatsText(int dtype, const ckptd::TensorStats& s) {
  if (s.finite == 0) {
    return absl::StrCat("no finite value; nan ", s.nan, " +inf ", s.pos_inf, " -inf ", s.neg_inf);
  }
  if (s.integral) {
    return absl::StrCat("min ", ckptd::FormatInteger(dtype, s.integer_min), " max ",
                        ckptd::FormatInteger(dtype, s.integer_max), " mean ", s.MeanText(),
                        s.mean_rounded() ? " (rounded)" : "");
  }
  return absl::StrCat("min ", ckptd::FormatNumber(dtype, s.min), " max ", ckptd::FormatNumber(dtype, s.max),
                      " mean ", s.MeanText(), " nan ", s.nan, " +inf ", s.pos_inf, " -inf ", s.neg_inf);
}

// numpy prints every element up to this many, else a summary.
constexpr int64_t kSummarizeAbove = 1000;
// --values --json holds every element; beyond this, export is the tool.
constexpr int64_t kMaxJsonValues = 10'000'000;

json NestedJson(const ckptd::Shape& shape, const std::vector<json>& flat, size_t dim, size_t* next) {
  if (dim == shape.size()) return flat[(*next)++];
  json out = json::array();
  for (int64_t i = 0; i < shape[dim]; ++i) out.push_back(NestedJson(shape, flat, dim + 1, next));
  return out;
}

// Element `i` as JSON: integers exactly, bools as true/false, non-finite floats as
// strings ("nan", "inf", "-inf"; JSON has no such numbers).
json NumberJson(int dtype, const ckptd::Numbers& numbers, size_t i) {
  if (numbers.integral) {
    if (dtype == ckptd::kBool) return numbers.integers[i] != 0;
    return IntegerJson(numbers.integers[i]);
  }
  const double v = numbers.reals[i];
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return v;
}

// inspect --values NAME: the tensor's elements, numpy-style (summarized beyond 1000
// elements, as numpy prints), or every one of them in JSON.
// The elements at every index tuple of `axes` (row-major), as text and JSON: from
// `strings` or `numbers` (the whole tensor, flat) or, summarized, read one by one.
absl::Status ShownValues(BundleReader& reader, const ckptd::TensorInfo& info,
                         const std::vector<std::string>& strings, const ckptd::Numbers& numbers,
                         const std::vector<std::vector<int64_t>>& axes, bool summarize,
                         std::vector<std::string>* shown, std::vector<json>* shown_json) {
  const size_t rank = info.shape.size();
  std::vector<size_t> at(rank, 0);
  ckptd::Box one{ckptd::Shape(rank, 0), ckptd::Shape(rank, 1)};
  std::string element(static_cast<size_t>(ckptd::DataTypeSize(info.dtype)), '\0');
  while (true) {
    int64_t flat = 0;
    for (size_t d = 0; d < rank; ++d) {
      one.start[d] = axes[d][at[d]];
      flat = flat * info.shape[d] + one.start[d];
    }
    const auto index = static_cast<size_t>(flat);
    if (info.dtype == ckptd::kString) {
      shown->push_back(ckptd::FormatBytes(strings[index]));
      shown_json->push_back(strings[index]);
    } else {
      ckptd::Numbers single;
      if (summarize) {
        RETURN_IF_ERROR(reader.ReadBox(info, one, element.data()));
        RETURN_IF_ERROR(ckptd::AppendNumbers(info.dtype, element.data(), 1, &single));
      }
      const ckptd::Numbers& from = summarize ? single : numbers;
      const size_t at_index = summarize ? 0 : index;
      shown->push_back(ckptd::FormatNumberAt(info.dtype, from, at_index));
      shown_json->push_back(NumberJson(info.dtype, from, at_index));
    }
    size_t d = rank;  // the next index tuple, row-major
    while (d > 0 && ++at[d - 1] == axes[d - 1].size()) at[--d] = 0;
    if (d == 0) return absl::OkStatus();
  }
}

int PrintValues(BundleReader& reader, const std::string& name, bool as_json) {
  auto info = reader.Lookup(name);
  if (!info.ok()) return Error(info.status());
  int64_t count = 0;
  if (absl::Status s = ckptd::CheckShape(info->shape, &count); !s.ok()) return Error(s);
  const bool is_string = info->dtype == ckptd::kString;
  if (!is_string && !ckptd::IsRealNumeric(info->dtype)) {
    return Error(absl::UnimplementedError(
        absl::StrCat("'", name, "': ", ckptd::DataTypeName(info->dtype), " values cannot be shown")));
  }
  std::vector<std::string> strings;
  if (is_string) {
    auto decoded = ReadStrings(reader, *info);
    if (!decoded.ok()) return Error(decoded.status());
    strings = std::move(*decoded);
  }
  const bool summarize = !as_json && count > kSummarizeAbove;
  if (as_json && count > kMaxJsonValues) {
    return Error(absl::InvalidArgumentError(
        absl::StrCat("'", name, "' has ", count, " elements; --values --json prints at most ", kMaxJsonValues,
                     " (use ckptctl export for whole arrays)")));
  }
  // Row-major flat values of the whole tensor, or (summarized) of the grid shown.
  ckptd::Numbers numbers;
  if (!is_string && summarize) {
    if (absl::Status s = reader.CheckBoxReadable(*info, ckptd::Box::Full(info->shape)); !s.ok())
      return Error(s);
  }
  if (!is_string && !summarize) {
    absl::Status s = ForEachChunk(reader, *info, [&](const std::string& bytes) {
      return ckptd::AppendNumbers(info->dtype, bytes.data(), bytes.size() / ckptd::DataTypeSize(info->dtype),
                                  &numbers);
    });
    if (!s.ok()) return Error(s);
  }
  std::vector<std::vector<int64_t>> axes;
  for (int64_t d : info->shape) {
    std::vector<int64_t> all(static_cast<size_t>(d));
    for (int64_t i = 0; i < d; ++i) all[static_cast<size_t>(i)] = i;
    axes.push_back(summarize ? ckptd::SummaryIndices(d) : all);
  }
  bool empty = false;
  for (const auto& a : axes) empty = empty || a.empty();
  std::vector<std::string> shown;
  std::vector<json> shown_json;
  if (!empty) {
    if (absl::Status s = ShownValues(reader, *info, strings, numbers, axes, summarize, &shown, &shown_json);
        !s.ok()) {
      return Error(s);
    }
  }
  if (as_json) {
    size_t next = 0;
    PrintJson({{"name", name},
               {"dtype", ckptd::DataTypeName(info->dtype)},
               {"shape", info->shape},
               {"values", empty ? json::array() : NestedJson(info->shape, shown_json, 0, &next)}});
    return kOk;
  }
  std::printf("%s %s %s\n", name.c_str(), ckptd::DataTypeName(info->dtype).c_str(),
              ShapeString(info->shape).c_str());
  std::printf("%s\n", empty ? "[]" : ckptd::FormatNested(info->shape, shown, summarize).c_str());
  return kOk;
}

// ckptd.json's facts about the step, for inspect.
json MetaJson(const ckptd::CheckpointMeta& meta) {
  json hosts = json::array();
  for (const ckptd::CheckpointMeta::Host& h : meta.hosts) {
    hosts.push_back({{"rank", h.rank},
                     {"host", h.host},
                     {"file", h.file},
                     {"bytes", h.bytes},
                     {"write_seconds", h.write_seconds},
                     {"copies", h.copies}});
  }
  json out = {{"run", meta.run},
              {"step", meta.step},
              {"version", meta.version},
              {"storage", meta.storage},
              {"trainer_count", meta.trainer_count},
              {"num_hosts", meta.num_hosts},
              {"created_unix", meta.created_unix},
              {"commit_seconds", meta.commit_seconds},
              {"max_write_seconds", meta.max_write_seconds},
              {"hosts", hosts}};
  if (!meta.imported_from.empty()) out["imported_from"] = meta.imported_from;
  return out;
}

void PrintMeta(const ckptd::CheckpointMeta& meta) {
  if (!meta.imported_from.empty()) {
    std::printf("run %s, step %lld, imported from a %s by ckptctl %s at %s; %d data file(s)\n",
                meta.run.c_str(), static_cast<long long>(meta.step), meta.imported_from.c_str(),
                meta.version.c_str(), LocalTime(static_cast<double>(meta.created_unix)).c_str(),
                meta.num_hosts);
    return;
  }
  std::printf("run %s, step %lld, saved by ckptd %s at %s; %d trainer(s) on %d host(s), storage %s\n",
              meta.run.c_str(), static_cast<long long>(meta.step), meta.version.c_str(),
              LocalTime(static_cast<double>(meta.created_unix)).c_str(), meta.trainer_count, meta.num_hosts,
              meta.storage.c_str());
  std::printf("commit %s, slowest host write %s\n", ckptd::FormatSeconds(meta.commit_seconds).c_str(),
              ckptd::FormatSeconds(meta.max_write_seconds).c_str());
  for (const ckptd::CheckpointMeta::Host& h : meta.hosts) {
    std::printf(
        "  rank %d%s: %s, %s, written in %.3f s%s\n", h.rank,
        h.host.empty() ? "" : absl::StrCat(" (", h.host, ")").c_str(), h.file.c_str(),
        HumanBytes(static_cast<double>(h.bytes)).c_str(), h.write_seconds,
        h.copies.empty() ? "" : absl::StrCat(", copies on rank ", absl::StrJoin(h.copies, ",")).c_str());
  }
}

// Trainer state (kTrainerStatePrefix + "<trainer>/<key>") among `names`:
// trainer -> key -> value.
absl::StatusOr<std::map<std::string, std::map<std::string, std::string>>> TrainerState(
    BundleReader& reader, const std::vector<std::string>& names) {
  std::map<std::string, std::map<std::string, std::string>> out;
  for (const std::string& name : names) {
    if (!absl::StartsWith(name, ckptd::kTrainerStatePrefix)) continue;
    const std::string rest = name.substr(std::strlen(ckptd::kTrainerStatePrefix));
    const size_t slash = rest.find('/');
    if (slash == std::string::npos) continue;
    ASSIGN_OR_RETURN(ckptd::TensorInfo info, reader.Lookup(name));
    if (info.dtype != ckptd::kString || !info.shape.empty()) continue;
    ASSIGN_OR_RETURN(std::vector<std::string> value, ReadStrings(reader, info));
    out[rest.substr(0, slash)][rest.substr(slash + 1)] = value.empty() ? "" : value[0];
  }
  return out;
}

}  // namespace

// --- inspect ----------------------------------------------------------------------

namespace {

// One tensor of inspect: its entry in *entries (JSON), or its lines printed.
absl::Status InspectTensor(BundleReader& reader, const std::string& name,
                           const std::map<std::string, std::string>& layouts, const InspectOptions& options,
                           bool as_json, json* entries) {
  auto info = reader.Lookup(name);
  if (!info.ok()) return info.status();
  const ckptd::tf::BundleEntryProto& e = *reader.Find(name);
  json j = {{"key", name},          {"dtype", ckptd::DataTypeName(info->dtype)},
            {"shape", info->shape}, {"shard", e.shard_id()},
            {"offset", e.offset()}, {"size", e.size()}};
  if (e.slices_size() > 0) {
    json slices = json::array();
    for (const ckptd::SavedPiece& p : info->pieces) {
      slices.push_back({{"slice", p.box.ToSliceString(info->shape)},
                        {"shard", p.entry.shard_id()},
                        {"offset", p.entry.offset()},
                        {"size", p.entry.size()}});
    }
    j["slices"] = slices;
  }
  const auto layout = layouts.find(name);
  if (layout != layouts.end()) j["layout"] = layout->second;
  std::optional<ckptd::TensorStats> stats;
  if (options.stats && ckptd::IsRealNumeric(info->dtype)) {
    auto computed = Stats(reader, *info);
    if (!computed.ok()) return computed.status();
    stats = *computed;
    j["stats"] = StatsJson(*stats);
  }
  if (as_json) {
    entries->push_back(j);
    return absl::OkStatus();
  }
  int64_t bytes = 0;
  for (const ckptd::SavedPiece& p : info->pieces) bytes += p.entry.size();
  std::printf("  %-60s %-9s %-20s %12lld bytes", name.c_str(), ckptd::DataTypeName(info->dtype).c_str(),
              ShapeString(info->shape).c_str(), static_cast<long long>(bytes));
  if (e.slices_size() == 0) {
    std::printf("  shard %d\n", e.shard_id());
  } else {
    std::printf("  %zu slices\n", info->pieces.size());
  }
  if (stats) std::printf("      %s\n", StatsText(info->dtype, *stats).c_str());
  if (layout != layouts.end()) std::printf("      layout %s\n", layout->second.c_str());
  if (e.slices_size() > 0) {
    for (const ckptd::SavedPiece& p : info->pieces) {
      std::printf("      slice %-28s shard %d offset %lld size %lld\n",
                  p.box.ToSliceString(info->shape).c_str(), p.entry.shard_id(),
                  static_cast<long long>(p.entry.offset()), static_cast<long long>(p.entry.size()));
    }
  }
  return absl::OkStatus();
}

}  // namespace

int Inspect(const Context& ctx, const std::string& arg, const std::string& pattern, bool as_json,
            const InspectOptions& options) {
  std::string prefix;
  auto reader = OpenCheckpoint(ctx, arg, &prefix);
  if (!reader.ok()) return Error(reader.status());
  if (!options.values.empty()) return PrintValues(**reader, options.values, as_json);
  auto names = SelectNames(**reader, pattern);
  if (!names.ok()) return Error(names.status());
  // ckptd.json, when the checkpoint is ours, adds the mesh and each tensor's layout.
  const ckptd::CheckpointMeta meta = ReadMeta(ctx, prefix);
  const bool ours = !meta.run.empty();
  const HostPart part = PartHere(ctx, prefix, meta);
  const std::string mesh = meta.mesh;
  std::map<std::string, std::string> layouts;
  for (const ckptd::CheckpointMeta::Tensor& t : meta.tensors) {
    if (!t.layout.empty()) layouts[t.name] = t.layout;
  }
  if (options.stats && !part.elsewhere.empty()) {
    return Error(absl::FailedPreconditionError(absl::StrCat("cannot compute --stats: ", part.Note(prefix))));
  }
  auto state = TrainerState(**reader, *names);
  if (!state.ok() && part.elsewhere.empty()) return Error(state.status());
  json entries = json::array();
  if (!as_json) {
    std::printf("%s: %d shard(s), %zu tensor(s)%s\n", prefix.c_str(), (*reader)->header().num_shards(),
                names->size(), pattern.empty() ? "" : absl::StrCat(" matching '", pattern, "'").c_str());
    if (ours) PrintMeta(meta);
    if (!mesh.empty()) std::printf("mesh: %s\n", mesh.c_str());
    if (!part.elsewhere.empty()) std::printf("note: %s\n", part.Note(prefix).c_str());
  }
  for (const std::string& name : *names) {
    if (absl::Status s = InspectTensor(**reader, name, layouts, options, as_json, &entries); !s.ok()) {
      return Error(s);
    }
  }
  if (as_json) {
    json out = {{"num_shards", (*reader)->header().num_shards()}, {"entries", entries}};
    if (!mesh.empty()) out["mesh"] = mesh;
    if (ours) out["checkpoint"] = MetaJson(meta);
    if (state.ok() && !state->empty()) out["trainer_state"] = *state;
    if (!part.elsewhere.empty()) out["shards_elsewhere"] = part.elsewhere;
    PrintJson(out);
  } else if (state.ok() && !state->empty()) {
    std::printf("trainer state:\n");
    for (const auto& [trainer, keys] : *state) {
      for (const auto& [key, value] : keys) {
        std::printf("  trainer %s  %s = %s\n", trainer.c_str(), key.c_str(),
                    ckptd::FormatBytes(value).c_str());
      }
    }
  }
  return kOk;
}

}  // namespace ckptctl
