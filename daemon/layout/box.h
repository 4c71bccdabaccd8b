// Boxes: the axis-aligned part of a tensor a shard holds (start and length per
// dimension), their validation, intersection, tiling checks and the strided copy of
// one box's bytes into another's. Pure value code; thread-safe.
#ifndef CKPTD_DAEMON_LAYOUT_BOX_H_
#define CKPTD_DAEMON_LAYOUT_BOX_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"

namespace ckptd {

// Dims, starts and lengths are held inline up to rank 4 (most tensors): a save or
// restore of 100,000 tensors makes and copies several of each per tensor, and each
// would otherwise be a heap allocation.
using Shape = absl::InlinedVector<int64_t, 4>;

struct Box {
  Shape start;
  Shape length;

  size_t rank() const { return start.size(); }
  // Product of lengths; 1 for a scalar box.
  int64_t NumElements() const;
  // The box covering all of `shape`.
  static Box Full(const Shape& shape);
  bool IsFull(const Shape& shape) const;
  // TF's slice string: "0,2:-" (start,length per dim; "-" = whole dim of `shape`).
  std::string ToSliceString(const Shape& shape) const;
  std::string ToString() const;  // "[0:2, 0:4]" half-open, for messages

  friend bool operator==(const Box& a, const Box& b) { return a.start == b.start && a.length == b.length; }
  friend bool operator!=(const Box& a, const Box& b) { return !(a == b); }
  friend bool operator<(const Box& a, const Box& b) {
    return a.start != b.start ? a.start < b.start : a.length < b.length;
  }
};

// Product of dims; 1 for a scalar. Fails on a negative dim or int64 overflow.
absl::Status CheckShape(const Shape& shape, int64_t* num_elements);

// OK when `box` has shape's rank, starts and lengths >= 0, and
// lies inside shape. The message names the dimension.
absl::Status CheckBoxInShape(const Box& box, const Shape& shape);

// The common part of two boxes of equal rank, or nullopt if they do not meet.
// Zero-length boxes never meet anything.
std::optional<Box> Intersect(const Box& a, const Box& b);

// OK when `boxes` (distinct, each inside `shape`) cover `shape` exactly: no gap, no
// overlap. Otherwise INVALID_ARGUMENT saying which boxes overlap or how much is
// missing; `what` (e.g. "tensor 'w'") starts the message.
absl::Status CheckTiling(const std::vector<Box>& boxes, const Shape& shape, const std::string& what);

// When the row-major elements of `inner` (a box inside `outer`) form one contiguous
// run of a row-major buffer holding `outer`, the element index where that run starts;
// otherwise nullopt. Lets a reader fill such a region with one read instead of a read
// into a temporary buffer and a strided copy.
std::optional<int64_t> ContiguousOffset(const Box& inner, const Box& outer);

// Copies the elements of `region` (inside both src_box and dst_box) from a row-major
// buffer holding src_box to one holding dst_box.
void CopyRegion(const Box& region, const Box& src_box, const char* src, const Box& dst_box, char* dst,
                size_t element_size);

}  // namespace ckptd

#endif  // CKPTD_DAEMON_LAYOUT_BOX_H_
