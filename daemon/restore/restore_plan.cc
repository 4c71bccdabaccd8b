#include "daemon/restore/restore_plan.h"

#include <algorithm>
#include <atomic>
#include <set>
#include <thread>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "ckptd/v1/wire.h"
#include "daemon/base/dtype.h"
#include "daemon/base/status.h"
#include "daemon/layout/cast.h"

namespace ckptd {
namespace {

// Whether ReadBox reads `piece` for `box`: it overlaps the box, or is the box (an
// empty tensor's piece overlaps nothing, yet is read).
bool PieceHolds(const SavedPiece& piece, const Box& box) {
  return piece.box == box || Intersect(piece.box, box).has_value();
}

// The boxes `want` asks for, each checked against the stored shape.
absl::StatusOr<std::vector<Box>> WantedBoxes(const TensorWant& want, const TensorInfo& info,
                                             const Placement& placement, const std::string& field) {
  if (want.layout.has_value()) {
    auto boxes = DeviceBoxes(*want.layout, info.shape, placement);
    if (!boxes.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".layout ('", want.name, "'): ", boxes.status().message()));
    }
    return std::move(*boxes);
  }
  Box box = want.box.value_or(Box::Full(info.shape));
  if (absl::Status s = CheckBoxInShape(box, info.shape); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".box ('", want.name, "'): ", s.message()));
  }
  return std::vector<Box>{std::move(box)};
}

absl::StatusOr<RestoreItem> PlanOne(BundleReader& reader, const TensorWant& want, const Placement& placement,
                                    const std::string& field) {
  ASSIGN_OR_RETURN(TensorInfo info, reader.Lookup(want.name));
  const int dtype = want.dtype == 0 ? info.dtype : want.dtype;
  if (dtype != info.dtype && !IsConvertible(info.dtype, dtype)) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".dtype: tensor '", want.name, "' is stored as ",
                                                   DataTypeName(info.dtype), " and cannot be restored as ",
                                                   DataTypeName(dtype)));
  }
  if (DataTypeSize(info.dtype) == 0) {
    return absl::UnimplementedError(absl::StrCat("tensor '", want.name, "' has dtype ",
                                                 DataTypeName(info.dtype), ", which Restore cannot return"));
  }
  if (!want.shape.empty() && want.shape != info.shape) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".shape: tensor '", want.name, "' has a different stored shape"));
  }
  ASSIGN_OR_RETURN(std::vector<Box> boxes, WantedBoxes(want, info, placement, field));
  // Sizes in an index are claims: checked against the data files before anything
  // they imply is allocated.
  for (const Box& box : boxes) RETURN_IF_ERROR(reader.CheckBoxReadable(info, box));
  int64_t bytes = 0;
  for (const Box& box : boxes) bytes += box.NumElements() * static_cast<int64_t>(DataTypeSize(dtype));
  return RestoreItem{.info = std::move(info), .dtype = dtype, .boxes = std::move(boxes), .bytes = bytes};
}

}  // namespace

absl::StatusOr<RestorePlan> PlanRestore(BundleReader& reader, const std::vector<TensorWant>& wants,
                                        const Placement& placement) {
  RestorePlan plan;
  plan.items.reserve(wants.size());
  for (size_t i = 0; i < wants.size(); ++i) {
    ASSIGN_OR_RETURN(RestoreItem item,
                     PlanOne(reader, wants[i], placement, absl::StrCat("tensors[", i, "]")));
    if (!wants[i].outside_reply) {
      item.shared_memory_offset = wire::SharedMemoryOffset(plan.shared_memory_bytes, item.bytes);
      plan.shared_memory_bytes = item.shared_memory_offset + item.bytes;
    }
    plan.items.push_back(std::move(item));
  }
  return plan;
}

std::vector<ReadCache::Range> StoredRanges(const BundleReader& reader, const RestorePlan& plan) {
  std::vector<ReadCache::Range> ranges;
  ranges.reserve(plan.items.size());
  for (const RestoreItem& item : plan.items) {
    for (const SavedPiece& piece : item.info.pieces) {
      if (!absl::c_any_of(item.boxes, [&](const Box& box) { return PieceHolds(piece, box); })) continue;
      ranges.push_back({.path = reader.DataFile(piece.entry.shard_id()),
                        .offset = static_cast<uint64_t>(piece.entry.offset()),
                        .size = static_cast<uint64_t>(piece.entry.size())});
    }
  }
  return ranges;
}

absl::Status ReadPlan(BundleReader& reader, const RestorePlan& plan, const std::vector<char*>& outputs,
                      int threads) {
  return ReadPlanItems(reader, plan, outputs, threads, 0, plan.items.size());
}

namespace {

// One box of one item, and where its bytes go.
struct BoxRead {
  const RestoreItem* item;
  const Box* box;
  char* out;
};

// Neighbouring small entries of one data file, read with one request.
struct ReadBatch {
  uint64_t offset = 0, span = 0;
  std::vector<BundleReader::EntryRead> entries;
  std::vector<size_t> reads;  // what it reads; the first is where its failure is reported
};

// Opens every data file `items` read first: the files stay readable whatever happens
// to the directory meanwhile (retention), and a missing one fails before any read.
// Only those: on local disks the other hosts' files are not here.
absl::Status OpenDataFilesOf(BundleReader& reader, absl::Span<const RestoreItem> items) {
  std::set<int> shards;
  for (const RestoreItem& item : items) {
    for (const Box& box : item.boxes) {
      for (const SavedPiece& piece : item.info.pieces) {
        if (PieceHolds(piece, box)) shards.insert(piece.entry.shard_id());
      }
    }
  }
  for (int shard : shards) RETURN_IF_ERROR(reader.OpenDataFile(shard));
  return absl::OkStatus();
}

// The batches of `reads` (marked in *batched); the others are read box by box.
std::vector<ReadBatch> BatchSmallReads(const std::vector<BoxRead>& reads, std::vector<bool>* batched) {
  // Small boxes that are each one whole saved piece in the restore's own dtype are
  // read in batches of neighbours in their data file, one request per batch: with
  // many small tensors the requests, not the bytes, are the cost.
  constexpr uint64_t kSmallEntry = 256 << 10, kMaxGap = 64 << 10, kMaxBatch = 8 << 20;
  struct Small {
    size_t read;
    const SavedPiece* piece;
  };
  std::vector<Small> small;
  for (size_t i = 0; i < reads.size(); ++i) {
    const BoxRead& r = reads[i];
    if (r.item->dtype != r.item->info.dtype) continue;
    // The piece ReadBox would read first: it reads this one alone, straight into place.
    for (const SavedPiece& piece : r.item->info.pieces) {
      if (!PieceHolds(piece, *r.box)) continue;
      if (piece.box == *r.box && static_cast<uint64_t>(piece.entry.size()) <= kSmallEntry) {
        small.push_back({i, &piece});
        (*batched)[i] = true;
      }
      break;
    }
  }
  absl::c_sort(small, [](const Small& a, const Small& b) {
    return std::make_pair(a.piece->entry.shard_id(), a.piece->entry.offset()) <
           std::make_pair(b.piece->entry.shard_id(), b.piece->entry.offset());
  });
  std::vector<ReadBatch> batches;
  for (const Small& one : small) {
    const tf::BundleEntryProto& entry = one.piece->entry;
    const uint64_t begin = static_cast<uint64_t>(entry.offset()), end = begin + entry.size();
    ReadBatch* last = batches.empty() ? nullptr : &batches.back();
    const bool joins = last != nullptr && last->entries.front().entry->shard_id() == entry.shard_id() &&
                       begin >= last->offset + last->span && begin - (last->offset + last->span) <= kMaxGap &&
                       end - last->offset <= kMaxBatch;
    if (!joins) {
      batches.push_back({.offset = begin, .span = 0, .entries = {}, .reads = {}});
      last = &batches.back();
    }
    last->span = end - last->offset;
    last->entries.push_back({.label = one.piece->label, .entry = &entry, .dst = reads[one.read].out});
    last->reads.push_back(one.read);
  }
  return batches;
}

}  // namespace

absl::Status ReadPlanItems(BundleReader& reader, const RestorePlan& plan, const std::vector<char*>& outputs,
                           int threads, size_t begin, size_t end,
                           const std::function<void(size_t item)>& on_item_read) {
  if (outputs.size() != plan.items.size() || begin > end || end > plan.items.size()) {
    return absl::InternalError(absl::StrCat("ReadPlanItems: ", outputs.size(), " outputs for ",
                                            plan.items.size(), " items, range [", begin, ", ", end, ")"));
  }
  const auto items = absl::MakeConstSpan(plan.items).subspan(begin, end - begin);
  RETURN_IF_ERROR(OpenDataFilesOf(reader, items));
  std::vector<BoxRead> reads;
  // Reads of each item not yet done, for on_item_read.
  std::vector<std::atomic<size_t>> unread(end - begin);
  for (size_t i = begin; i < end; ++i) {
    char* out = outputs[i];
    if (out == nullptr) continue;  // sent from where it is kept
    for (const Box& box : plan.items[i].boxes) {
      reads.push_back({.item = &plan.items[i], .box = &box, .out = out});
      out += box.NumElements() * static_cast<int64_t>(DataTypeSize(plan.items[i].dtype));
    }
    unread[i - begin] = plan.items[i].boxes.size();
    if (plan.items[i].boxes.empty() && on_item_read) on_item_read(i);
  }
  auto read_done = [&](size_t read) {
    const size_t item = static_cast<size_t>(reads[read].item - plan.items.data());
    if (unread[item - begin].fetch_sub(1) == 1 && on_item_read) on_item_read(item);
  };
  std::vector<bool> batched(reads.size(), false);
  const std::vector<ReadBatch> batches = BatchSmallReads(reads, &batched);
  // Work units: the batches, then every other read on its own.
  std::vector<size_t> singles;
  for (size_t i = 0; i < reads.size(); ++i) {
    if (!batched[i]) singles.push_back(i);
  }
  const size_t units = batches.size() + singles.size();
  std::atomic<size_t> next{0};
  std::vector<absl::Status> failures(reads.size());
  auto read_boxes = [&] {
    std::string stored;
    for (size_t u = next++; u < units; u = next++) {
      if (u < batches.size()) {
        const ReadBatch& batch = batches[u];
        failures[batch.reads.front()] = reader.ReadEntries(batch.offset, batch.span, batch.entries);
        if (failures[batch.reads.front()].ok()) absl::c_for_each(batch.reads, read_done);
        continue;
      }
      const size_t i = singles[u - batches.size()];
      const BoxRead& r = reads[i];
      const TensorInfo& info = r.item->info;
      if (r.item->dtype == info.dtype) {
        failures[i] = reader.ReadBox(info, *r.box, r.out);
      } else {
        const size_t count = static_cast<size_t>(r.box->NumElements());
        stored.resize(count * DataTypeSize(info.dtype));
        failures[i] = reader.ReadBox(info, *r.box, stored.data());
        if (failures[i].ok())
          failures[i] = ConvertElements(info.dtype, stored.data(), r.item->dtype, r.out, count);
      }
      if (failures[i].ok()) read_done(i);
    }
  };
  std::vector<std::thread> helpers;
  const size_t wanted = std::min<size_t>(units, static_cast<size_t>(std::max(threads, 1)));
  for (size_t i = 1; i < wanted; ++i) helpers.emplace_back(read_boxes);
  read_boxes();
  for (std::thread& t : helpers) t.join();
  for (const absl::Status& failure : failures) RETURN_IF_ERROR(failure);
  return absl::OkStatus();
}

absl::StatusOr<std::map<std::string, std::string>> ReadTrainerState(BundleReader& reader, int trainer_id) {
  std::map<std::string, std::string> state;
  const std::string prefix = TrainerStateName(trainer_id, "");
  for (const std::string& name : reader.TensorNames()) {
    if (name.rfind(prefix, 0) != 0) continue;
    const tf::BundleEntryProto& entry = *reader.Find(name);
    const std::string label = PieceLabel(name, Box{}, Shape{}, /*sliced=*/false);
    RETURN_IF_ERROR(reader.CheckEntryRange(label, entry));
    std::string encoded(static_cast<size_t>(entry.size()), '\0');
    RETURN_IF_ERROR(reader.ReadEntry(label, entry, encoded.data()));
    ASSIGN_OR_RETURN(state[name.substr(prefix.size())], DecodeStringScalar(encoded));
  }
  return state;
}

}  // namespace ckptd
