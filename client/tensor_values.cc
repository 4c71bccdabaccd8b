#include "client/tensor_values.h"

#include <charconv>
#include <cmath>
#include <cstring>
#include <functional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "daemon/base/dtype.h"
#include "daemon/layout/cast.h"

namespace ckptd {
namespace {

template <typename T>
void AppendAs(const char* data, size_t count, std::vector<double>* out) {
  const size_t first = out->size();
  out->resize(first + count);
  for (size_t i = 0; i < count; ++i) {
    T value;
    std::memcpy(&value, data + i * sizeof(T), sizeof(T));
    (*out)[first + i] = static_cast<double>(value);
  }
}

template <typename T>
std::string Shortest(T value) {
  char buffer[64];
  const auto [end, ec] = std::to_chars(buffer, buffer + sizeof(buffer), value);
  std::string text(buffer, ec == std::errc() ? end : buffer);
  // Python writes an integral float with ".0", and its exponent as e+20, e-05.
  if (text.find_first_of(".en") == std::string::npos) text += ".0";
  return text;
}

}  // namespace

bool IsFloating(int dtype) {
  return dtype == kFloat || dtype == kDouble || dtype == kHalf || dtype == kBfloat16;
}

bool IsRealNumeric(int dtype) {
  switch (dtype) {
    case kFloat:
    case kDouble:
    case kHalf:
    case kBfloat16:
    case kInt8:
    case kInt16:
    case kInt32:
    case kInt64:
    case kUint8:
    case kUint16:
    case kUint32:
    case kUint64:
    case kBool:
      return true;
    default:
      return false;
  }
}

absl::Status ElementsAsDouble(int dtype, const char* data, size_t count, std::vector<double>* out) {
  switch (dtype) {
    case kFloat:
      AppendAs<float>(data, count, out);
      return absl::OkStatus();
    case kDouble:
      AppendAs<double>(data, count, out);
      return absl::OkStatus();
    case kInt8:
      AppendAs<int8_t>(data, count, out);
      return absl::OkStatus();
    case kInt16:
      AppendAs<int16_t>(data, count, out);
      return absl::OkStatus();
    case kInt32:
      AppendAs<int32_t>(data, count, out);
      return absl::OkStatus();
    case kInt64:
      AppendAs<int64_t>(data, count, out);
      return absl::OkStatus();
    case kUint8:
    case kBool:  // one byte, 0 or 1
      AppendAs<uint8_t>(data, count, out);
      return absl::OkStatus();
    case kUint16:
      AppendAs<uint16_t>(data, count, out);
      return absl::OkStatus();
    case kUint32:
      AppendAs<uint32_t>(data, count, out);
      return absl::OkStatus();
    case kUint64:
      AppendAs<uint64_t>(data, count, out);
      return absl::OkStatus();
    case kHalf:
    case kBfloat16: {
      const size_t first = out->size();
      out->resize(first + count);
      for (size_t i = 0; i < count; ++i) {
        uint16_t bits;
        std::memcpy(&bits, data + 2 * i, 2);
        (*out)[first + i] = dtype == kHalf ? HalfToFloat(bits) : Bfloat16ToFloat(bits);
      }
      return absl::OkStatus();
    }
    default:
      return absl::InvalidArgumentError(absl::StrCat(DataTypeName(dtype), " elements are not real numbers"));
  }
}

void TensorStats::Add(const std::vector<double>& values) {
  for (double v : values) {
    ++count;
    if (std::isnan(v)) {
      ++nan;
    } else if (std::isinf(v)) {
      ++(v > 0 ? pos_inf : neg_inf);
    } else {
      if (finite == 0 || v < min) min = v;
      if (finite == 0 || v > max) max = v;
      ++finite;
      sum += v;
    }
  }
}

bool IsClose(double a, double b, double atol, double rtol) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  if (std::isinf(a) || std::isinf(b)) return a == b;
  return std::fabs(a - b) <= atol + rtol * std::fabs(b);
}

void ValueDiff::Add(const std::vector<double>& a, const std::vector<double>& b, double atol, double rtol) {
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (std::isfinite(a[i]) && std::isfinite(b[i]))
      max_abs_diff = std::max(max_abs_diff, std::fabs(a[i] - b[i]));
    if (!IsClose(a[i], b[i], atol, rtol)) {
      if (mismatched++ == 0) first_index = compared + static_cast<int64_t>(i);
    }
  }
  compared += static_cast<int64_t>(std::min(a.size(), b.size()));
}

std::string FormatNumber(int dtype, double value) {
  if (dtype == kBool) return value != 0 ? "True" : "False";
  if (!IsFloating(dtype)) {
    if (dtype == kUint64) return absl::StrCat(static_cast<uint64_t>(value));
    return absl::StrCat(static_cast<int64_t>(value));
  }
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  if (dtype == kDouble) return Shortest(value);
  return Shortest(static_cast<float>(value));
}

std::string FormatBytes(absl::string_view bytes) {
  std::string out = "b'";
  for (char c : bytes) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '\'' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (u >= 0x20 && u < 0x7f) {
      out += c;
    } else {
      absl::StrAppendFormat(&out, "\\x%02x", u);
    }
  }
  return out + "'";
}

std::vector<int64_t> SummaryIndices(int64_t n) {
  std::vector<int64_t> out;
  if (n <= 6) {
    for (int64_t i = 0; i < n; ++i) out.push_back(i);
  } else {
    out = {0, 1, 2, n - 3, n - 2, n - 1};
  }
  return out;
}

std::string FormatNested(const Shape& shape, const std::vector<std::string>& elements, bool summarize) {
  if (shape.empty()) return elements.empty() ? "" : elements[0];
  // The grid actually held: per dimension, the shown indices.
  std::vector<int64_t> held;
  for (int64_t d : shape) held.push_back(summarize ? static_cast<int64_t>(SummaryIndices(d).size()) : d);
  std::vector<int64_t> stride(shape.size(), 1);
  for (size_t d = shape.size() - 1; d > 0; --d) stride[d - 1] = stride[d] * held[d];
  std::string out;
  const std::function<void(size_t, int64_t, int)> emit = [&](size_t dim, int64_t base, int indent) {
    out += '[';
    for (int64_t i = 0; i < held[dim]; ++i) {
      if (i > 0) {
        out += dim + 1 == shape.size() ? ", "
                                       : absl::StrCat(",", std::string(shape.size() - dim - 1, '\n'),
                                                      std::string(indent + 1, ' '));
      }
      if (summarize && shape[dim] > 6 && i == 3) {
        out += "...";
        out += dim + 1 == shape.size() ? ", "
                                       : absl::StrCat(",", std::string(shape.size() - dim - 1, '\n'),
                                                      std::string(indent + 1, ' '));
      }
      if (dim + 1 == shape.size()) {
        const size_t at = static_cast<size_t>(base + i);
        out += at < elements.size() ? elements[at] : "?";
      } else {
        emit(dim + 1, base + i * stride[dim], indent + 1);
      }
    }
    out += ']';
  };
  emit(0, 0, 0);
  return out;
}

}  // namespace ckptd
