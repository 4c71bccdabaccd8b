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

// Appends `count` little-endian elements of type T at `data` to *out, converted to
// its element type (double, or ExactInt for integers).
template <typename T, typename To>
void AppendAs(const char* data, size_t count, std::vector<To>* out) {
  const size_t first = out->size();
  out->resize(first + count);
  for (size_t i = 0; i < count; ++i) {
    T value;
    std::memcpy(&value, data + i * sizeof(T), sizeof(T));
    (*out)[first + i] = static_cast<To>(value);
  }
}

// Calls fn with a value of the C++ type an integer (or bool) dtype's elements have;
// false for other dtypes.
template <typename Fn>
bool WithIntegerType(int dtype, Fn&& fn) {
  switch (dtype) {
    case kInt8:
      fn(int8_t{});
      return true;
    case kInt16:
      fn(int16_t{});
      return true;
    case kInt32:
      fn(int32_t{});
      return true;
    case kInt64:
      fn(int64_t{});
      return true;
    case kUint8:
    case kBool:  // one byte, 0 or 1
      fn(uint8_t{});
      return true;
    case kUint16:
      fn(uint16_t{});
      return true;
    case kUint32:
      fn(uint32_t{});
      return true;
    case kUint64:
      fn(uint64_t{});
      return true;
    default:
      return false;
  }
}

ExactInt Abs(ExactInt v) { return v < 0 ? -v : v; }

std::string Decimal(ExactInt v) {
  if (v == 0) return "0";
  const bool negative = v < 0;
  std::string digits;
  for (ExactInt rest = Abs(v); rest > 0; rest /= 10) digits.push_back(static_cast<char>('0' + rest % 10));
  if (negative) digits.push_back('-');
  return std::string(digits.rbegin(), digits.rend());
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

bool IsIntegral(int dtype) { return IsRealNumeric(dtype) && !IsFloating(dtype); }

absl::Status AppendNumbers(int dtype, const char* data, size_t count, Numbers* out) {
  out->integral = IsIntegral(dtype);
  if (WithIntegerType(dtype, [&](auto type) { AppendAs<decltype(type)>(data, count, &out->integers); })) {
    return absl::OkStatus();
  }
  return ElementsAsDouble(dtype, data, count, &out->reals);
}

absl::Status ElementsAsDouble(int dtype, const char* data, size_t count, std::vector<double>* out) {
  if (WithIntegerType(dtype, [&](auto type) { AppendAs<decltype(type)>(data, count, out); })) {
    return absl::OkStatus();
  }
  switch (dtype) {
    case kFloat:
      AppendAs<float>(data, count, out);
      return absl::OkStatus();
    case kDouble:
      AppendAs<double>(data, count, out);
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

void TensorStats::Add(const Numbers& values) {
  if (!values.integral) {
    Add(values.reals);
    return;
  }
  integral = true;
  for (ExactInt v : values.integers) {
    if (finite == 0 || v < integer_min) integer_min = v;
    if (finite == 0 || v > integer_max) integer_max = v;
    ++finite;
    ++count;
    integer_sum += v;
  }
}

double TensorStats::mean() const {
  if (finite == 0) return 0;
  if (!integral) return static_cast<double>(sum / finite);
  // The quotient exactly, then the remainder's share: no precision lost to the sum.
  const ExactInt quotient = integer_sum / finite, remainder = integer_sum % finite;
  return static_cast<double>(static_cast<long double>(quotient) +
                             static_cast<long double>(remainder) / static_cast<long double>(finite));
}

namespace {
constexpr int64_t kMeanScale = 1'000'000;  // 6 decimals
}  // namespace

bool TensorStats::mean_rounded() const {
  return integral && finite > 0 && (Abs(integer_sum) * kMeanScale) % finite != 0;
}

std::string TensorStats::MeanText() const {
  if (!integral || finite == 0) return FormatNumber(kDouble, mean());
  // |sum| < 2^104 for any tensor that fits in memory, so |sum| * 2 * 10^6 < 2^126.
  const ExactInt magnitude = Abs(integer_sum);
  const ExactInt scaled = (magnitude * kMeanScale * 2 + finite) / (ExactInt{2} * finite);  // rounded half up
  std::string text = absl::StrCat(mean_rounded() ? "~" : "", integer_sum < 0 && scaled != 0 ? "-" : "",
                                  Decimal(scaled / kMeanScale));
  std::string decimals = Decimal(scaled % kMeanScale + kMeanScale).substr(1);  // 6 digits, leading zeros kept
  while (!decimals.empty() && decimals.back() == '0') decimals.pop_back();
  if (!decimals.empty()) absl::StrAppend(&text, ".", decimals);
  return text;
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

void ValueDiff::Add(const Numbers& a, const Numbers& b, double atol, double rtol) {
  if (!a.integral || !b.integral) {
    Add(a.reals, b.reals, atol, rtol);
    return;
  }
  integral = true;
  for (size_t i = 0; i < a.integers.size() && i < b.integers.size(); ++i) {
    const ExactInt difference = Abs(a.integers[i] - b.integers[i]);
    max_abs_integer_diff = std::max(max_abs_integer_diff, difference);
    // The bound's integer part: the difference is an integer, so it is within the
    // bound exactly when it is within its floor.
    const long double bound = static_cast<long double>(atol) +
                              static_cast<long double>(rtol) * static_cast<long double>(Abs(b.integers[i]));
    const bool within = bound >= 0x1p126L || difference <= static_cast<ExactInt>(std::floor(bound));
    if (!within && mismatched++ == 0) first_index = compared + static_cast<int64_t>(i);
  }
  compared += static_cast<int64_t>(std::min(a.integers.size(), b.integers.size()));
}

std::string ValueDiff::MaxAbsDiffText() const {
  return integral ? Decimal(max_abs_integer_diff) : absl::StrCat(max_abs_diff);
}

std::string FormatInteger(int dtype, ExactInt value) {
  if (dtype == kBool) return value != 0 ? "True" : "False";
  return Decimal(value);
}

std::string FormatNumberAt(int dtype, const Numbers& numbers, size_t i) {
  return numbers.integral ? FormatInteger(dtype, numbers.integers[i]) : FormatNumber(dtype, numbers.reals[i]);
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
