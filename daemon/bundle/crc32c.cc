#include "daemon/bundle/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace ckptd::crc32c {
namespace {

constexpr uint32_t kPolynomial = 0x82f63b78u;  // reflected Castagnoli

std::array<uint32_t, 256> MakeTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPolynomial : c >> 1;
    table[i] = c;
  }
  return table;
}

uint32_t ExtendPortable(uint32_t crc, const char* data, size_t n) {
  static const std::array<uint32_t, 256> table = MakeTable();
  uint32_t c = ~crc;
  for (size_t i = 0; i < n; ++i) {
    c = table[(c ^ static_cast<uint8_t>(data[i])) & 0xff] ^ (c >> 8);
  }
  return ~c;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t ExtendSse42(uint32_t crc, const char* data, size_t n) {
  uint64_t c = ~crc & 0xffffffffu;
  while (n >= 8) {
    uint64_t word;
    std::memcpy(&word, data, 8);
    c = _mm_crc32_u64(c, word);
    data += 8;
    n -= 8;
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  while (n > 0) {
    c32 = _mm_crc32_u8(c32, static_cast<uint8_t>(*data));
    ++data;
    --n;
  }
  return ~c32;
}
#endif

}  // namespace

uint32_t Extend(uint32_t crc, const char* data, size_t n) {
#if defined(__x86_64__)
  static const bool has_sse42 = __builtin_cpu_supports("sse4.2");
  if (has_sse42) return ExtendSse42(crc, data, n);
#endif
  return ExtendPortable(crc, data, n);
}

}  // namespace ckptd::crc32c
