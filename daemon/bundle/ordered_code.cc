#include "daemon/bundle/ordered_code.h"

namespace ckptd::ordered_code {

void WriteNumIncreasing(std::string* dest, uint64_t value) {
  // One length byte, then the value big-endian without leading zero bytes.
  char buf[9];
  int len = 0;
  while (value > 0) {
    buf[8 - len] = static_cast<char>(value & 0xff);
    value >>= 8;
    ++len;
  }
  buf[8 - len] = static_cast<char>(len);
  dest->append(buf + 8 - len, len + 1);
}

void WriteSignedNumIncreasing(std::string* dest, int64_t value) {
  // The header bits of the first two bytes give the length; see TF's ordered_code.cc.
  static constexpr unsigned char kHeader[11][2] = {{0, 0},    {0x80, 0},    {0xc0, 0},   {0xe0, 0},
                                                   {0xf0, 0}, {0xf8, 0},    {0xfc, 0},   {0xfe, 0},
                                                   {0xff, 0}, {0xff, 0x80}, {0xff, 0xc0}};
  const uint64_t x = value < 0 ? ~static_cast<uint64_t>(value) : static_cast<uint64_t>(value);
  if (x < 64) {
    dest->push_back(static_cast<char>(kHeader[1][0] ^ static_cast<unsigned char>(value)));
    return;
  }
  const int bits = 64 - __builtin_clzll(x);
  const int len = (bits + 7) / 7;
  unsigned char buf[10];
  const unsigned char sign = value < 0 ? 0xff : 0x00;
  buf[0] = sign;
  buf[1] = sign;
  for (int i = 0; i < 8; ++i) {
    buf[2 + i] = static_cast<unsigned char>(static_cast<uint64_t>(value) >> (56 - 8 * i));
  }
  unsigned char* begin = buf + sizeof(buf) - len;
  begin[0] ^= kHeader[len][0];
  begin[1] ^= kHeader[len][1];
  dest->append(reinterpret_cast<const char*>(begin), len);
}

void WriteString(std::string* dest, absl::string_view s) {
  for (char c : s) {
    if (c == '\0') {
      dest->append("\x00\xff", 2);
    } else if (c == '\xff') {
      dest->append("\xff\x00", 2);
    } else {
      dest->push_back(c);
    }
  }
  dest->append("\x00\x01", 2);
}

std::string EncodeTensorNameSlice(absl::string_view name, const Box& box, const Shape& shape) {
  std::string key;
  WriteNumIncreasing(&key, 0);
  WriteString(&key, name);
  WriteNumIncreasing(&key, box.rank());
  for (size_t d = 0; d < box.rank(); ++d) {
    if (box.start[d] == 0 && d < shape.size() && box.length[d] == shape[d]) {
      WriteSignedNumIncreasing(&key, 0);
      WriteSignedNumIncreasing(&key, -1);
    } else {
      WriteSignedNumIncreasing(&key, box.start[d]);
      WriteSignedNumIncreasing(&key, box.length[d]);
    }
  }
  return key;
}

}  // namespace ckptd::ordered_code
