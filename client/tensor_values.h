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

// Integer and bool dtypes: their elements are read, compared and summed exactly.
bool IsIntegral(int dtype);

// Appends `count` little-endian elements of `dtype` at `data` to *out as doubles
// (64-bit integers beyond 2^53 round: see Numbers for exact values). INVALID_ARGUMENT
// for a dtype IsRealNumeric rejects.
absl::Status ElementsAsDouble(int dtype, const char* data, size_t count, std::vector<double>* out);

// A 128-bit integer holds every value of every integer dtype, int64 and uint64 alike,
// and their sums over any tensor that fits in memory.
using ExactInt = __int128;

// A tensor's elements as numbers: floating dtypes as doubles, integer and bool dtypes
// exactly. Which one `integral` says; the other vector stays empty.
struct Numbers {
  Numbers() = default;  // not an aggregate: a braced list of doubles is not Numbers

  bool integral = false;
  std::vector<double> reals;
  std::vector<ExactInt> integers;

  size_t size() const { return integral ? integers.size() : reals.size(); }
  void clear() {
    reals.clear();
    integers.clear();
  }
};

// Appends `count` little-endian elements of `dtype` at `data` to *out (which takes
// `dtype`'s kind). INVALID_ARGUMENT for a dtype IsRealNumeric rejects.
absl::Status AppendNumbers(int dtype, const char* data, size_t count, Numbers* out);

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
  // Integer dtypes: min, max and sum exact (min, max and sum above are then unused).
  bool integral = false;
  ExactInt integer_min = 0;
  ExactInt integer_max = 0;
  ExactInt integer_sum = 0;

  void Add(const std::vector<double>& values);
  void Add(const Numbers& values);
  // The mean as a double; for integers the nearest one to the exact mean.
  double mean() const;
  // The mean as text: shortest round-trip for floats; for integers the exact mean,
  // to at most 6 decimals, prefixed "~" when it was rounded to get there.
  std::string MeanText() const;
  bool mean_rounded() const;
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
  // Integer dtypes: differences are exact, and so is the tolerance's bound
  // (|a - b| <= atol + rtol * |b|, computed without rounding a or b).
  bool integral = false;
  ExactInt max_abs_integer_diff = 0;

  void Add(const std::vector<double>& a, const std::vector<double>& b, double atol, double rtol);
  void Add(const Numbers& a, const Numbers& b, double atol, double rtol);
  // The largest difference as text: exact for integers.
  std::string MaxAbsDiffText() const;
};

// A value as Python would print it: shortest round-trip for floats ("0.1", "nan",
// "inf", "-inf"), integers exactly, bools as True/False.
std::string FormatNumber(int dtype, double value);
// An exact integer in decimal; True/False for kBool.
std::string FormatInteger(int dtype, ExactInt value);
// Element `i` of `numbers` (of `dtype`), as FormatNumber or FormatInteger prints it.
std::string FormatNumberAt(int dtype, const Numbers& numbers, size_t i);
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
