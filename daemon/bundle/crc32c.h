// CRC-32C (Castagnoli) as TensorFlow and LevelDB use it, including their "masked"
// form stored in files. Uses ISA-L where the build found it, else SSE4.2 when the CPU
// has it (three interleaved streams over long inputs). Pure; thread-safe.
#ifndef CKPTD_DAEMON_BUNDLE_CRC32C_H_
#define CKPTD_DAEMON_BUNDLE_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace ckptd::crc32c {

// CRC of data[0, n) continuing from `crc` (the CRC of the bytes before them).
uint32_t Extend(uint32_t crc, const char* data, size_t n);
inline uint32_t Value(const char* data, size_t n) { return Extend(0, data, n); }
// Copies src[0, n) to dst and returns Extend(crc, src, n), in one pass over memory:
// each chunk is checksummed and then copied while it is still in the CPU's cache.
uint32_t CopyAndExtend(uint32_t crc, char* dst, const char* src, size_t n);
// The table-driven form Extend falls back to without SSE4.2; tests compare the two.
uint32_t ExtendPortableForTesting(uint32_t crc, const char* data, size_t n);
// Extend as it runs where the build has no ISA-L: SSE4.2 where the CPU has it.
uint32_t ExtendWithoutIsaLForTesting(uint32_t crc, const char* data, size_t n);

// A CRC stored next to the data it covers is masked, so that CRCs of data containing
// embedded CRCs stay well distributed.
inline uint32_t Mask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }
inline uint32_t Unmask(uint32_t masked) {
  uint32_t rot = masked - 0xa282ead8u;
  return (rot >> 17) | (rot << 15);
}

}  // namespace ckptd::crc32c

#endif  // CKPTD_DAEMON_BUNDLE_CRC32C_H_
