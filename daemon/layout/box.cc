#include "daemon/layout/box.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/base/status.h"

namespace ckptd {

int64_t Box::NumElements() const {
  int64_t n = 1;
  for (int64_t len : length) n *= len;
  return n;
}

Box Box::Full(const Shape& shape) {
  Box box;
  box.start.assign(shape.size(), 0);
  box.length = shape;
  return box;
}

bool Box::IsFull(const Shape& shape) const { return *this == Full(shape); }

std::string Box::ToSliceString(const Shape& shape) const {
  std::vector<std::string> parts;
  for (size_t d = 0; d < rank(); ++d) {
    if (d < shape.size() && start[d] == 0 && length[d] == shape[d]) {
      parts.push_back("-");
    } else {
      parts.push_back(absl::StrCat(start[d], ",", length[d]));
    }
  }
  return absl::StrJoin(parts, ":");
}

std::string Box::ToString() const {
  std::vector<std::string> parts;
  for (size_t d = 0; d < rank(); ++d) {
    parts.push_back(absl::StrCat(start[d], ":", start[d] + length[d]));
  }
  return absl::StrCat("[", absl::StrJoin(parts, ", "), "]");
}

absl::Status CheckShape(const Shape& shape, int64_t* num_elements) {
  int64_t n = 1;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] < 0) {
      return absl::InvalidArgumentError(absl::StrCat("shape dim ", d, " is negative (", shape[d], ")"));
    }
    if (shape[d] != 0 && n > INT64_MAX / shape[d]) {
      return absl::InvalidArgumentError("shape has more than 2^63 elements");
    }
    n *= shape[d];
  }
  if (num_elements != nullptr) *num_elements = n;
  return absl::OkStatus();
}

absl::Status CheckBoxInShape(const Box& box, const Shape& shape) {
  if (box.start.size() != box.length.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("box has ", box.start.size(), " starts but ", box.length.size(), " lengths"));
  }
  if (box.rank() != shape.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("box rank ", box.rank(), " differs from shape rank ", shape.size()));
  }
  for (size_t d = 0; d < box.rank(); ++d) {
    if (box.start[d] < 0 || box.length[d] < 0 || box.start[d] > shape[d] ||
        box.length[d] > shape[d] - box.start[d]) {
      return absl::InvalidArgumentError(absl::StrCat("box dim ", d, " [", box.start[d], ", +", box.length[d],
                                                     ") lies outside shape dim ", shape[d]));
    }
  }
  return absl::OkStatus();
}

std::optional<int64_t> ContiguousOffset(const Box& inner, const Box& outer) {
  if (inner.rank() != outer.rank()) return std::nullopt;
  const size_t rank = inner.rank();
  // Contiguous: below some dimension k every length is 1, above it every dimension is
  // whole in `outer`; dimension k itself may be any part.
  size_t k = 0;
  while (k < rank && inner.length[k] == 1) ++k;
  for (size_t d = k + 1; d < rank; ++d) {
    if (inner.start[d] != outer.start[d] || inner.length[d] != outer.length[d]) return std::nullopt;
  }
  int64_t offset = 0;
  for (size_t d = 0; d < rank; ++d) {
    if (inner.start[d] < outer.start[d] ||
        inner.start[d] + inner.length[d] > outer.start[d] + outer.length[d]) {
      return std::nullopt;
    }
    offset = offset * outer.length[d] + (inner.start[d] - outer.start[d]);
  }
  return offset;
}

std::optional<Box> Intersect(const Box& a, const Box& b) {
  if (a.rank() != b.rank()) return std::nullopt;
  Box out;
  out.start.resize(a.rank());
  out.length.resize(a.rank());
  for (size_t d = 0; d < a.rank(); ++d) {
    int64_t lo = std::max(a.start[d], b.start[d]);
    int64_t hi = std::min(a.start[d] + a.length[d], b.start[d] + b.length[d]);
    if (hi <= lo) return std::nullopt;
    out.start[d] = lo;
    out.length[d] = hi - lo;
  }
  return out;
}

absl::Status CheckTiling(const std::vector<Box>& boxes, const Shape& shape, const std::string& what) {
  int64_t total = 0;
  if (absl::Status s = CheckShape(shape, &total); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", s.message()));
  }
  // Sorting by start makes the overlap scan stop early on the first dimension.
  std::vector<const Box*> sorted;
  for (const Box& b : boxes) sorted.push_back(&b);
  std::sort(sorted.begin(), sorted.end(), [](const Box* x, const Box* y) { return *x < *y; });
  int64_t covered = 0;
  for (size_t i = 0; i < sorted.size(); ++i) {
    covered += sorted[i]->NumElements();
    for (size_t j = i + 1; j < sorted.size(); ++j) {
      if (shape.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": scalar saved more than once with different boxes"));
      }
      if (sorted[j]->start[0] >= sorted[i]->start[0] + sorted[i]->length[0]) break;
      if (Intersect(*sorted[i], *sorted[j]).has_value()) {
        return absl::InvalidArgumentError(absl::StrCat(what, ": boxes ", sorted[i]->ToString(), " and ",
                                                       sorted[j]->ToString(), " overlap"));
      }
    }
  }
  if (covered != total) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": boxes cover ", covered, " of ", total, " elements; the tensor has a gap"));
  }
  return absl::OkStatus();
}

void CopyRegion(const Box& region, const Box& src_box, const char* src, const Box& dst_box, char* dst,
                size_t element_size) {
  const size_t rank = region.rank();
  if (rank == 0) {
    std::memcpy(dst, src, element_size);
    return;
  }
  if (region.NumElements() == 0) return;
  // Row-major strides, in elements, of both buffers.
  std::vector<int64_t> src_stride(rank, 1), dst_stride(rank, 1);
  for (size_t d = rank - 1; d > 0; --d) {
    src_stride[d - 1] = src_stride[d] * src_box.length[d];
    dst_stride[d - 1] = dst_stride[d] * dst_box.length[d];
  }
  // Merge trailing dimensions that are contiguous in both buffers into one run.
  size_t inner = rank - 1;
  int64_t run = region.length[inner];
  while (inner > 0 && region.length[inner] == src_box.length[inner] &&
         region.length[inner] == dst_box.length[inner]) {
    --inner;
    run *= region.length[inner];
  }
  const size_t run_bytes = static_cast<size_t>(run) * element_size;
  std::vector<int64_t> index(inner, 0);  // position in the outer dims of `region`
  while (true) {
    int64_t src_off = 0, dst_off = 0;
    for (size_t d = 0; d <= inner; ++d) {
      int64_t pos = region.start[d] + (d < inner ? index[d] : 0);
      src_off += (pos - src_box.start[d]) * src_stride[d];
      dst_off += (pos - dst_box.start[d]) * dst_stride[d];
    }
    std::memcpy(dst + dst_off * element_size, src + src_off * element_size, run_bytes);
    size_t d = inner;
    while (d > 0) {
      --d;
      if (++index[d] < region.length[d]) break;
      index[d] = 0;
      if (d == 0) return;
    }
    if (inner == 0) return;
  }
}

}  // namespace ckptd
