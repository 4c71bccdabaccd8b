#include "daemon/base/dtype.h"

#include <array>
#include <map>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"

namespace ckptd {
namespace {

struct TypeInfo {
  int dtype;
  absl::string_view name;
  size_t size;
  bool saveable;
};

constexpr std::array<TypeInfo, 23> kTypes = {{
    {kFloat, "float", 4, true},      {kDouble, "double", 8, true},
    {kInt32, "int32", 4, true},      {kUint8, "uint8", 1, true},
    {kInt16, "int16", 2, true},      {kInt8, "int8", 1, true},
    {kString, "string", 0, false},   {kComplex64, "complex64", 8, true},
    {kInt64, "int64", 8, true},      {kBool, "bool", 1, true},
    {kQint8, "qint8", 1, false},     {kQuint8, "quint8", 1, false},
    {kQint32, "qint32", 4, false},   {kBfloat16, "bfloat16", 2, true},
    {kQint16, "qint16", 2, false},   {kQuint16, "quint16", 2, false},
    {kUint16, "uint16", 2, true},    {kComplex128, "complex128", 16, true},
    {kHalf, "half", 2, true},        {kResource, "resource", 0, false},
    {kVariant, "variant", 0, false}, {kUint32, "uint32", 4, true},
    {kUint64, "uint64", 8, true},
}};

const TypeInfo* Find(int dtype) {
  for (const TypeInfo& info : kTypes) {
    if (info.dtype == dtype) return &info;
  }
  return nullptr;
}

}  // namespace

std::string DataTypeName(int dtype) {
  const TypeInfo* info = Find(dtype);
  if (info == nullptr) return "dtype_" + std::to_string(dtype);
  return std::string(info->name);
}

std::optional<int> DataTypeFromName(const std::string& name) {
  std::string n = absl::AsciiStrToLower(name);
  // "torch.float32", "np.float32", "tf.float32", "DT_FLOAT": the same names.
  for (absl::string_view prefix : {"torch.", "numpy.", "np.", "tf.", "dt_"}) {
    if (absl::StartsWith(n, prefix)) {
      n = n.substr(prefix.size());
      break;
    }
  }
  static const std::map<std::string, std::string, std::less<>> kAliases = {
      {"float32", "float"}, {"float64", "double"},   {"float16", "half"},      {"fp32", "float"},
      {"fp64", "double"},   {"fp16", "half"},        {"bf16", "bfloat16"},     {"f32", "float"},
      {"f64", "double"},    {"f16", "half"},         {"long", "int64"},        {"short", "int16"},
      {"bool_", "bool"},    {"cfloat", "complex64"}, {"cdouble", "complex128"}};
  if (auto alias = kAliases.find(n); alias != kAliases.end()) n = alias->second;
  for (const TypeInfo& info : kTypes) {
    if (info.name == n) return info.dtype;
  }
  return std::nullopt;
}

size_t DataTypeSize(int dtype) {
  const TypeInfo* info = Find(dtype);
  return info == nullptr ? 0 : info->size;
}

bool IsSupportedSaveType(int dtype) {
  const TypeInfo* info = Find(dtype);
  return info != nullptr && info->saveable;
}

}  // namespace ckptd
