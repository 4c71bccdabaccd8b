// Request validation for the gRPC service: turns wire messages into checked internal
// values, or INVALID_ARGUMENT naming the field. Pure; thread-safe.
#ifndef CKPTD_DAEMON_SERVICE_VALIDATION_H_
#define CKPTD_DAEMON_SERVICE_VALIDATION_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "ckptd/v1/ckptd.pb.h"
#include "daemon/layout/box.h"

namespace ckptd {

inline constexpr size_t kMaxChunkBytes = 4 << 20;
inline constexpr size_t kMaxRunNameLength = 128;
inline constexpr size_t kMaxTensorNameLength = 4096;
inline constexpr int kMaxRank = 32;

// A run name becomes a directory: 1-128 characters of [A-Za-z0-9._-], not "." or "..".
absl::Status ValidateRunName(const std::string& run);

struct CheckedTensor {
  std::string name;
  int dtype = 0;
  Shape shape;
  Box box;
  int64_t bytes = 0;
};

// Checks every descriptor of a Save header (name, dtype, shape, box, duplicates).
absl::Status ValidateSaveHeader(const v1::SaveHeader& header, std::vector<CheckedTensor>* out);

// Box from the wire; an unset box means the whole tensor.
Box BoxFromProto(const v1::Box& proto, const Shape& shape, bool has_box);

}  // namespace ckptd

#endif  // CKPTD_DAEMON_SERVICE_VALIDATION_H_
