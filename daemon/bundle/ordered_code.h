// TensorFlow's OrderedCode encodings, just what slice keys need: the key of one slice
// of a tensor in a V2 bundle (tensorflow/core/util/saved_tensor_slice_util.cc).
// Pure; thread-safe.
#ifndef CKPTD_DAEMON_BUNDLE_ORDERED_CODE_H_
#define CKPTD_DAEMON_BUNDLE_ORDERED_CODE_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "daemon/layout/box.h"

namespace ckptd::ordered_code {

void WriteNumIncreasing(std::string* dest, uint64_t value);
void WriteSignedNumIncreasing(std::string* dest, int64_t value);
void WriteString(std::string* dest, absl::string_view s);

// Key under which a bundle stores one slice of tensor `name`. A dimension the box
// covers whole is written as TF writes a full extent (start 0, length -1).
std::string EncodeTensorNameSlice(absl::string_view name, const Box& box, const Shape& shape);

}  // namespace ckptd::ordered_code

#endif  // CKPTD_DAEMON_BUNDLE_ORDERED_CODE_H_
