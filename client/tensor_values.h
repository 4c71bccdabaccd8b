// Reading tensor elements as numbers or strings, for `ckptctl inspect --values/--stats`
// and `ckptctl diff --atol/--rtol`: element decoding for every real numeric dtype,
// summary statistics, tolerance comparison, TF's string tensor encoding and
// numpy-like printing. Pure functions and value types; thread-compatible.
#ifndef CKPTD_CLIENT_TENSOR_VALUES_H_
#define CKPTD_CLIENT_TENSOR_VALUES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "daemon/layout/box.h"

namespace ckptd {

// True for the dtypes whose elements are real numbers (floating, integer, bool):
// those ElementsAsDouble reads. Complex, quantized and string types are not.
bool IsRealNumeric(int dtype);
bool IsFloating(int dtype);

// Appends `count` little-endian elements of `dtype` at `data` to *out as doubles
// (64-bit integers beyond 2^53 round). INVALID_ARGUMENT for a dtype IsRealNumeric
// rejects.
absl::Status ElementsAsDouble(int dtype, const char* data, size_t count, std::vector<double>* out);

// Running statistics over a tensor's elements, fed in chunks. min, max and mean are
// over the finite elements only (as numpy's nanmin/nanmax/nanmean over finite
// values); NaN and infinities are counted apart.
struct TensorStats {
  int64_t count = 0;
  int64_t finite = 0;
  int64_t nan = 0;
  int64_t pos_inf = 0;
  int64_t neg_inf = 0;
  double min = 0;
  double max = 0;
  long double sum = 0;

  void Add(const std::vector<double>& values);
  double mean() const { return finite > 0 ? static_cast<double>(sum / finite) : 0; }
};

// numpy.isclose(b, a, rtol, atol) with equal_nan: |a - b| <= atol + rtol * |b|, NaN
// equal to NaN, an infinity equal only to the same infinity.
bool IsClose(double a, double b, double atol, double rtol);

// How two tensors' values differ under a tolerance, fed chunk by chunk.
struct ValueDiff {
  int64_t compared = 0;
  int64_t mismatched = 0;    // elements outside the tolerance
  int64_t first_index = -1;  // row-major index of the first mismatch
  double max_abs_diff = 0;   // over finite pairs

  void Add(const std::vector<double>& a, const std::vector<double>& b, double atol, double rtol);
};

// A value as Python would print it: shortest round-trip for floats ("0.1", "nan",
// "inf", "-inf"), integers exactly, bools as True/False.
std::string FormatNumber(int dtype, double value);
// A string element as a Python bytes literal: b'abc', b'\x00\xff'.
std::string FormatBytes(absl::string_view bytes);

// Nested-bracket text of a row-major tensor of `shape` whose elements are already
// formatted (numpy's layout: one innermost row per line). With `summarize`, a
// dimension longer than 6 shows its first 3 and last 3 entries around "...", and
// `elements` need only hold those: see SummaryRows.
std::string FormatNested(const Shape& shape, const std::vector<std::string>& elements, bool summarize);
// The indices along a dimension of length n that a summarized print shows: all of
// them for n <= 6, else 0,1,2,n-3,n-2,n-1.
std::vector<int64_t> SummaryIndices(int64_t n);

}  // namespace ckptd

#endif  // CKPTD_CLIENT_TENSOR_VALUES_H_
