// Element conversions between float32, bfloat16 and float16, rounding to nearest even
// and keeping NaN (as a quiet NaN of the same sign) and infinities. Pure; thread-safe.
#ifndef CKPTD_DAEMON_LAYOUT_CAST_H_
#define CKPTD_DAEMON_LAYOUT_CAST_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"

namespace ckptd {

uint16_t FloatToBfloat16(float value);
float Bfloat16ToFloat(uint16_t bits);
uint16_t FloatToHalf(float value);
float HalfToFloat(uint16_t bits);

// True for the float32 / bfloat16 / float16 pairs ConvertElements supports.
bool IsConvertible(int from_dtype, int to_dtype);
// Converts `count` elements; dst holds count x sizeof(to). INVALID_ARGUMENT for any
// pair IsConvertible rejects.
absl::Status ConvertElements(int from_dtype, const char* src, int to_dtype, char* dst, size_t count);

}  // namespace ckptd

#endif  // CKPTD_DAEMON_LAYOUT_CAST_H_
