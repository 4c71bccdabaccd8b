#include "daemon/layout/cast.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "daemon/base/dtype.h"

namespace ckptd {
namespace {

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

float FromBits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

float Load(int dtype, const char* p) {
  uint16_t h;
  switch (dtype) {
    case kFloat: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case kBfloat16:
      std::memcpy(&h, p, 2);
      return Bfloat16ToFloat(h);
    default:
      std::memcpy(&h, p, 2);
      return HalfToFloat(h);
  }
}

void Store(int dtype, float f, char* p) {
  uint16_t h;
  switch (dtype) {
    case kFloat:
      std::memcpy(p, &f, 4);
      return;
    case kBfloat16:
      h = FloatToBfloat16(f);
      std::memcpy(p, &h, 2);
      return;
    default:
      h = FloatToHalf(f);
      std::memcpy(p, &h, 2);
      return;
  }
}

bool IsFloatLike(int dtype) { return dtype == kFloat || dtype == kBfloat16 || dtype == kHalf; }

}  // namespace

uint16_t FloatToBfloat16(float value) {
  const uint32_t bits = Bits(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);  // quiet NaN
  const uint32_t lsb = (bits >> 16) & 1u;
  return static_cast<uint16_t>((bits + 0x7fffu + lsb) >> 16);
}

float Bfloat16ToFloat(uint16_t bits) { return FromBits(static_cast<uint32_t>(bits) << 16); }

uint16_t FloatToHalf(float value) {
  const uint32_t bits = Bits(value);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));  // NaN
  if (abs >= 0x47800000u) {
    // >= 65536: infinity. Values in [65520, 65536) also round to infinity below.
    return static_cast<uint16_t>(sign | 0x7c00u);
  }
  if (abs < 0x38800000u) {
    // Below the smallest normal half (2^-14): a subnormal or zero. Shift the full
    // mantissa (with its implicit bit) into place, rounding to nearest even.
    if (abs < 0x33000000u) return sign;  // < 2^-25 rounds to zero
    const uint32_t exponent = abs >> 23;
    const uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exponent;  // 14 + (127 - exponent) - 10 - 1 + 1
    const uint32_t half_bits = mantissa >> shift;
    const uint32_t rest = mantissa & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    uint32_t rounded = half_bits + ((rest > halfway || (rest == halfway && (half_bits & 1u))) ? 1u : 0u);
    return static_cast<uint16_t>(sign | rounded);
  }
  // Normal: rebias the exponent (127 -> 15) and round the mantissa from 23 to 10 bits.
  uint32_t v = abs - 0x38000000u;  // exponent - 112
  const uint32_t lsb = (v >> 13) & 1u;
  v += 0xfffu + lsb;
  v >>= 13;
  if (v >= 0x7c00u) v = 0x7c00u;  // rounded up to infinity
  return static_cast<uint16_t>(sign | v);
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return FromBits(sign | 0x7f800000u | (mantissa << 13));  // inf / NaN
  if (exponent == 0) {
    if (mantissa == 0) return FromBits(sign);
    // Subnormal: normalize.
    int e = -1;
    do {
      ++e;
      mantissa <<= 1;
    } while ((mantissa & 0x400u) == 0);
    return FromBits(sign | ((112 - e) << 23) | ((mantissa & 0x3ffu) << 13));
  }
  return FromBits(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

bool IsConvertible(int from_dtype, int to_dtype) { return IsFloatLike(from_dtype) && IsFloatLike(to_dtype); }

absl::Status ConvertElements(int from_dtype, const char* src, int to_dtype, char* dst, size_t count) {
  if (!IsConvertible(from_dtype, to_dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot convert ", DataTypeName(from_dtype), " to ", DataTypeName(to_dtype)));
  }
  const size_t in = DataTypeSize(from_dtype), out = DataTypeSize(to_dtype);
  for (size_t i = 0; i < count; ++i) Store(to_dtype, Load(from_dtype, src + i * in), dst + i * out);
  return absl::OkStatus();
}

}  // namespace ckptd
