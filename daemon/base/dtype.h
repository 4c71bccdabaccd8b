// TensorFlow DataType numbers, their lower-case names as TensorFlow prints them, and
// element sizes. Pure functions; thread-safe.
#ifndef CKPTD_DAEMON_BASE_DTYPE_H_
#define CKPTD_DAEMON_BASE_DTYPE_H_

#include <cstddef>
#include <optional>
#include <string>

namespace ckptd {

enum DataType : int {
  kInvalid = 0,
  kFloat = 1,
  kDouble = 2,
  kInt32 = 3,
  kUint8 = 4,
  kInt16 = 5,
  kInt8 = 6,
  kString = 7,
  kComplex64 = 8,
  kInt64 = 9,
  kBool = 10,
  kQint8 = 11,
  kQuint8 = 12,
  kQint32 = 13,
  kBfloat16 = 14,
  kQint16 = 15,
  kQuint16 = 16,
  kUint16 = 17,
  kComplex128 = 18,
  kHalf = 19,
  kResource = 20,
  kVariant = 21,
  kUint32 = 22,
  kUint64 = 23,
};

// "float", "int64", "bfloat16", "string"... or "dtype_<n>" for a number TF lacks.
std::string DataTypeName(int dtype);

// Parses a dtype name: as DataTypeName prints it (TF's: float, half, bfloat16, int64,
// ...), as numpy and PyTorch users write it (float32, float16, torch.bfloat16, fp16,
// long), or as TF's enum (DT_FLOAT); any case. nullopt if unknown.
std::optional<int> DataTypeFromName(const std::string& name);

// Bytes per element of a fixed-size type; 0 for variable-size or unknown types.
size_t DataTypeSize(int dtype);

// True for the types ckptd accepts in Save: every fixed-size numeric type and bool.
bool IsSupportedSaveType(int dtype);

}  // namespace ckptd

#endif  // CKPTD_DAEMON_BASE_DTYPE_H_
