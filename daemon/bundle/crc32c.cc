#include "daemon/bundle/crc32c.h"

#include <algorithm>
#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif
#if defined(CKPTD_HAVE_ISAL)
#include <isa-l/crc.h>
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

// Combining CRCs of neighbouring blocks (after Mark Adler's crc32c.c): the CRC
// register is linear over GF(2), so reg(A||B) = Shift(reg(A), |B|) ^ reg0(B), where
// Shift appends |B| zero bytes. Shift by a fixed length is a 32x32 bit matrix, kept
// as four 256-entry tables (one per byte of the register).
using ShiftTables = std::array<std::array<uint32_t, 256>, 4>;

uint32_t MatrixTimes(const uint32_t* matrix, uint32_t vec) {
  uint32_t sum = 0;
  for (; vec != 0; vec >>= 1, ++matrix) {
    if (vec & 1) sum ^= *matrix;
  }
  return sum;
}

void MatrixSquare(uint32_t* square, const uint32_t* matrix) {
  for (int n = 0; n < 32; ++n) square[n] = MatrixTimes(matrix, matrix[n]);
}

// The tables that append `len` (> 0) zero bytes to a CRC register.
ShiftTables MakeShiftTables(size_t len) {
  uint32_t odd[32], even[32];
  odd[0] = kPolynomial;  // one zero bit
  for (int n = 1; n < 32; ++n) odd[n] = uint32_t{1} << (n - 1);
  MatrixSquare(even, odd);  // two zero bits
  MatrixSquare(odd, even);  // four zero bits
  // Each square doubles the zeros: the first gives one byte; len is consumed bit by bit.
  const uint32_t* op = nullptr;
  while (true) {
    MatrixSquare(even, odd);
    len >>= 1;
    if (len == 0) {
      op = even;
      break;
    }
    MatrixSquare(odd, even);
    len >>= 1;
    if (len == 0) {
      op = odd;
      break;
    }
  }
  ShiftTables tables{};
  for (uint32_t n = 0; n < 256; ++n) {
    for (int b = 0; b < 4; ++b) tables[b][n] = MatrixTimes(op, n << (8 * b));
  }
  return tables;
}

uint32_t Shift(const ShiftTables& t, uint32_t crc) {
  return t[0][crc & 0xff] ^ t[1][(crc >> 8) & 0xff] ^ t[2][(crc >> 16) & 0xff] ^ t[3][crc >> 24];
}

#if defined(__x86_64__)
// Three independent streams: the crc32 instruction's latency is three times its
// issue interval, so one dependent chain uses a third of what the CPU can do.
template <size_t kBlock>
__attribute__((target("sse4.2"))) uint64_t ThreeWay(uint64_t c0, const char*& data, size_t& n,
                                                    const ShiftTables& shift) {
  while (n >= 3 * kBlock) {
    uint64_t c1 = 0, c2 = 0;
    for (size_t i = 0; i < kBlock; i += 8) {
      uint64_t w0, w1, w2;
      std::memcpy(&w0, data + i, 8);
      std::memcpy(&w1, data + kBlock + i, 8);
      std::memcpy(&w2, data + 2 * kBlock + i, 8);
      c0 = _mm_crc32_u64(c0, w0);
      c1 = _mm_crc32_u64(c1, w1);
      c2 = _mm_crc32_u64(c2, w2);
    }
    c0 = Shift(shift, static_cast<uint32_t>(c0)) ^ static_cast<uint32_t>(c1);
    c0 = Shift(shift, static_cast<uint32_t>(c0)) ^ static_cast<uint32_t>(c2);
    data += 3 * kBlock;
    n -= 3 * kBlock;
  }
  return c0;
}

__attribute__((target("sse4.2"))) uint32_t ExtendSse42(uint32_t crc, const char* data, size_t n) {
  constexpr size_t kLong = 8192, kShort = 256;
  static const ShiftTables long_shift = MakeShiftTables(kLong);
  static const ShiftTables short_shift = MakeShiftTables(kShort);
  uint64_t c = ~crc & 0xffffffffu;
  c = ThreeWay<kLong>(c, data, n, long_shift);
  c = ThreeWay<kShort>(c, data, n, short_shift);
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

// What Extend runs where the build has no ISA-L.
uint32_t ExtendWithoutIsaL(uint32_t crc, const char* data, size_t n) {
#if defined(__x86_64__)
  static const bool has_sse42 = __builtin_cpu_supports("sse4.2");
  if (has_sse42) return ExtendSse42(crc, data, n);
#endif
  return ExtendPortable(crc, data, n);
}

}  // namespace

uint32_t ExtendPortableForTesting(uint32_t crc, const char* data, size_t n) {
  return ExtendPortable(crc, data, n);
}

uint32_t CopyAndExtend(uint32_t crc, char* dst, const char* src, size_t n) {
  constexpr size_t kChunk = 256 << 10;  // well inside L2
  for (size_t at = 0; at < n; at += kChunk) {
    const size_t k = std::min(kChunk, n - at);
    crc = Extend(crc, src + at, k);
    std::memcpy(dst + at, src + at, k);
  }
  return crc;
}

uint32_t ExtendWithoutIsaLForTesting(uint32_t crc, const char* data, size_t n) {
  return ExtendWithoutIsaL(crc, data, n);
}

uint32_t Extend(uint32_t crc, const char* data, size_t n) {
#if defined(CKPTD_HAVE_ISAL)
  // ISA-L's register is the CRC before the final inversion, and it takes an int length.
  constexpr size_t kMost = size_t{1} << 30;
  for (size_t at = 0; at < n; at += kMost) {
    const size_t k = std::min(kMost, n - at);
    crc = ~crc32_iscsi(reinterpret_cast<unsigned char*>(const_cast<char*>(data + at)), static_cast<int>(k),
                       ~crc);
  }
  return crc;
#else
  return ExtendWithoutIsaL(crc, data, n);
#endif
}

}  // namespace ckptd::crc32c
