// ckptctl diff: two checkpoints' logical tensors compared.
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
#include "daemon/bundle/bundle.h"
#include "daemon/bundle/checkpoint_meta.h"
#include "daemon/bundle/crc32c.h"
#include "daemon/io/private_dir.h"
#include "daemon/layout/cast.h"
#include "daemon/store/checkpoint_store.h"

namespace ckptctl {
namespace {

// crc32c of a string tensor's bytes as saved.
absl::StatusOr<uint32_t> StringChecksum(BundleReader& reader, const ckptd::TensorInfo& info) {
  ASSIGN_OR_RETURN(std::string bytes, ReadEntryBytes(reader, info.pieces[0]));
  return ckptd::crc32c::Value(bytes.data(), bytes.size());
}

// Two tensors of one dtype and shape read side by side, row chunk by row chunk, each
// assembled from its own slices: whether their bytes are equal and, for numbers,
// how their values differ under the tolerance.
struct Comparison {
  bool bytes_equal = true;
  ckptd::ValueDiff values;
};

absl::StatusOr<Comparison> Compare(BundleReader& a, const ckptd::TensorInfo& ia, BundleReader& b,
                                   const ckptd::TensorInfo& ib, double atol, double rtol) {
  Comparison out;
  const ckptd::Box full = ckptd::Box::Full(ia.shape);
  RETURN_IF_ERROR(a.CheckBoxReadable(ia, full));
  RETURN_IF_ERROR(b.CheckBoxReadable(ib, full));
  const int64_t element_bytes = ckptd::DataTypeSize(ia.dtype);
  const bool numeric = ckptd::IsRealNumeric(ia.dtype);
  std::string bytes_a, bytes_b;
  ckptd::Numbers values_a, values_b;
  for (const ckptd::Box& box : RowChunks(ia.shape, ia.dtype)) {
    const auto size = static_cast<size_t>(box.NumElements() * element_bytes);
    bytes_a.resize(size);
    bytes_b.resize(size);
    RETURN_IF_ERROR(a.ReadBox(ia, box, bytes_a.data()));
    RETURN_IF_ERROR(b.ReadBox(ib, box, bytes_b.data()));
    out.bytes_equal = out.bytes_equal && bytes_a == bytes_b;
    if (!numeric) continue;
    values_a.clear();
    values_b.clear();
    const size_t count = size / static_cast<size_t>(element_bytes);
    RETURN_IF_ERROR(ckptd::AppendNumbers(ia.dtype, bytes_a.data(), count, &values_a));
    RETURN_IF_ERROR(ckptd::AppendNumbers(ib.dtype, bytes_b.data(), count, &values_b));
    out.values.Add(values_a, values_b, atol, rtol);
  }
  return out;
}

// A row-major index as "[i, j, k]".
std::string IndexString(const ckptd::Shape& shape, int64_t flat) {
  std::vector<int64_t> index(shape.size());
  for (size_t d = shape.size(); d > 0; --d) {
    index[d - 1] = shape[d - 1] == 0 ? 0 : flat % shape[d - 1];
    flat = shape[d - 1] == 0 ? 0 : flat / shape[d - 1];
  }
  return absl::StrCat("[", absl::StrJoin(index, ", "), "]");
}

// Sets (*change)["kind"] and ["change"] (and the counts of a values change) when
// tensor `ia` of a and `ib` of b differ: dtype, shape, or values (compared within
// atol and rtol when `tolerant`, else byte for byte).
absl::Status CompareTensors(BundleReader& a, const ckptd::TensorInfo& ia, BundleReader& b,
                            const ckptd::TensorInfo& ib, bool tolerant, double atol, double rtol,
                            json* change) {
  if (ia.dtype != ib.dtype) {
    (*change)["kind"] = "dtype";
    (*change)["change"] =
        absl::StrCat("dtype ", ckptd::DataTypeName(ia.dtype), " -> ", ckptd::DataTypeName(ib.dtype));
  } else if (ia.shape != ib.shape) {
    (*change)["kind"] = "shape";
    (*change)["change"] = absl::StrCat("shape ", ShapeString(ia.shape), " -> ", ShapeString(ib.shape));
  } else if (ia.dtype == ckptd::kString ||
             (!ckptd::IsRealNumeric(ia.dtype) && ia.pieces.size() == 1 && ib.pieces.size() == 1)) {
    // Strings (never sliced) and other whole entries of types without numbers: their
    // bytes, by checksum.
    auto ca = ia.dtype == ckptd::kString ? StringChecksum(a, ia) : ia.pieces[0].entry.crc32c();
    auto cb = ib.dtype == ckptd::kString ? StringChecksum(b, ib) : ib.pieces[0].entry.crc32c();
    if (!ca.ok()) return ca.status();
    if (!cb.ok()) return cb.status();
    if (*ca != *cb) {
      (*change)["kind"] = "values";
      (*change)["change"] = absl::StrFormat("bytes differ (crc32c %08x -> %08x)", *ca, *cb);
    }
  } else {
    // Whole entries on both sides compare by their checksums without reading; any
    // other pair (or a difference) is read side by side as logical tensors,
    // whatever slices each was saved as.
    const bool both_whole = ia.pieces.size() == 1 && ib.pieces.size() == 1 &&
                            ia.pieces[0].box.IsFull(ia.shape) && ib.pieces[0].box.IsFull(ib.shape);
    if (tolerant || !both_whole || ia.pieces[0].entry.crc32c() != ib.pieces[0].entry.crc32c()) {
      auto compared = Compare(a, ia, b, ib, atol, rtol);
      if (!compared.ok()) return compared.status();
      const ckptd::ValueDiff& v = compared->values;
      const bool differs = tolerant ? v.mismatched > 0 : !compared->bytes_equal;
      if (differs) {
        (*change)["kind"] = "values";
        (*change)["compared"] = v.compared;
        (*change)["mismatched"] = v.mismatched;
        // Two elements of one integer dtype differ by less than 2^64.
        (*change)["max_abs_diff"] =
            v.integral ? json(static_cast<uint64_t>(v.max_abs_integer_diff)) : json(v.max_abs_diff);
        if (v.first_index >= 0) (*change)["first_mismatch"] = IndexString(ia.shape, v.first_index);
        (*change)["change"] =
            v.mismatched == 0
                ? std::string("bytes differ, values equal (signed zeros or NaN payloads)")
                : absl::StrCat("values: ", v.mismatched, " of ", v.compared, " element(s) differ",
                               tolerant ? absl::StrCat(" beyond atol ", atol, " rtol ", rtol) : "",
                               ", max abs diff ", v.MaxAbsDiffText(), ", first at ",
                               IndexString(ia.shape, v.first_index));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

int Diff(const Context& ctx, const std::string& a_arg, const std::string& b_arg, const std::string& pattern,
         const DiffOptions& options, bool as_json) {
  std::string a_prefix, b_prefix;
  auto a = OpenCheckpoint(ctx, a_arg, &a_prefix);
  if (!a.ok()) return Error(a.status());
  auto b = OpenCheckpoint(ctx, b_arg, &b_prefix);
  if (!b.ok()) return Error(b.status());
  for (const std::string& prefix : {a_prefix, b_prefix}) {
    if (const HostPart part = PartHere(ctx, prefix, ReadMeta(ctx, prefix)); !part.elsewhere.empty()) {
      return Error(
          absl::FailedPreconditionError(absl::StrCat("cannot compare contents: ", part.Note(prefix))));
    }
  }
  const bool tolerant = options.atol.has_value() || options.rtol.has_value();
  const double atol = options.atol.value_or(0), rtol = options.rtol.value_or(0);
  auto a_names = SelectNames(**a, pattern);
  auto b_names = SelectNames(**b, pattern);
  if (!a_names.ok()) return Error(a_names.status());
  if (!b_names.ok()) return Error(b_names.status());
  const std::set<std::string> in_a(a_names->begin(), a_names->end()), in_b(b_names->begin(), b_names->end());
  json added = json::array(), removed = json::array(), changed = json::array();
  int same = 0;
  std::set<std::string> all = in_a;
  all.insert(in_b.begin(), in_b.end());
  for (const std::string& name : all) {
    if (in_a.count(name) == 0) {
      added.push_back(name);
      continue;
    }
    if (in_b.count(name) == 0) {
      removed.push_back(name);
      continue;
    }
    auto ia = (*a)->Lookup(name);
    auto ib = (*b)->Lookup(name);
    if (!ia.ok()) return Error(ia.status());
    if (!ib.ok()) return Error(ib.status());
    json change = {{"name", name},
                   {"a", {{"dtype", ckptd::DataTypeName(ia->dtype)}, {"shape", ia->shape}}},
                   {"b", {{"dtype", ckptd::DataTypeName(ib->dtype)}, {"shape", ib->shape}}}};
    if (absl::Status s = CompareTensors(**a, *ia, **b, *ib, tolerant, atol, rtol, &change); !s.ok()) {
      return Error(s);
    }
    if (change.contains("kind")) {
      changed.push_back(change);
    } else {
      ++same;
    }
  }
  const bool differ = !added.empty() || !removed.empty() || !changed.empty();
  if (as_json) {
    json out = {{"a", a_prefix},      {"b", b_prefix},      {"added", added},
                {"removed", removed}, {"changed", changed}, {"unchanged", same}};
    if (tolerant) out["tolerance"] = {{"atol", atol}, {"rtol", rtol}};
    PrintJson(out);
  } else {
    for (const auto& n : added) std::printf("+ %s\n", n.get<std::string>().c_str());
    for (const auto& n : removed) std::printf("- %s\n", n.get<std::string>().c_str());
    for (const auto& c : changed) {
      std::printf("~ %s: %s\n", c["name"].get<std::string>().c_str(), c["change"].get<std::string>().c_str());
    }
    std::printf("%zu added, %zu removed, %zu changed, %d unchanged\n", added.size(), removed.size(),
                changed.size(), same);
  }
  return differ ? kFound : kOk;
}

}  // namespace ckptctl
