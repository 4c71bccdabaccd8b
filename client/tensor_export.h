// Writers for whole tensors in formats other tools read: NumPy's .npy (one file per
// tensor) and safetensors (one file, a JSON header then the bytes). Used by
// `ckptctl export` and `ckptctl restore`. Stateless functions; thread-compatible.
#ifndef CKPTD_CLIENT_TENSOR_EXPORT_H_
#define CKPTD_CLIENT_TENSOR_EXPORT_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "daemon/io/file_system.h"
#include "daemon/layout/box.h"

namespace ckptd {

// The .npy header (format 1.0, padded so the data starts 64-byte aligned) for a
// little-endian C-order array. INVALID_ARGUMENT for dtypes NumPy has no type for
// (bfloat16: convert to float32 first; strings).
absl::StatusOr<std::string> NpyHeader(int dtype, const Shape& shape);

// safetensors' dtype name ("F32", "BF16", "I64", "BOOL"...); INVALID_ARGUMENT if none.
absl::StatusOr<std::string> SafetensorsDtype(int dtype);

// A relative path for a tensor name: its '/'-separated parts become directories;
// parts that are empty, "." or "..", and bytes outside [A-Za-z0-9._-], are written
// %XX, so that no name can lead outside the output directory.
std::string TensorFileName(absl::string_view name);

struct ExportTensor {
  std::string name;
  int dtype = 0;
  Shape shape;
};

// Writes `path` as a safetensors file holding `tensors` in that order; read(i, dst)
// must fill dst with tensor i's row-major bytes. Only one tensor is in memory at a
// time. `metadata` becomes the header's "__metadata__" (string values).
absl::Status WriteSafetensors(FileSystem* fs, const std::string& path,
                              const std::vector<ExportTensor>& tensors,
                              const std::vector<std::pair<std::string, std::string>>& metadata,
                              const std::function<absl::Status(size_t, std::string*)>& read);

// Writes one .npy file.
absl::Status WriteNpy(FileSystem* fs, const std::string& path, int dtype, const Shape& shape,
                      absl::string_view data);

}  // namespace ckptd

#endif  // CKPTD_CLIENT_TENSOR_EXPORT_H_
