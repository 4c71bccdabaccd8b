#include "client/tensor_export.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "daemon/base/dtype.h"
#include "daemon/base/status.h"

namespace ckptd {
namespace {

const char* NpyDescr(int dtype) {
  switch (dtype) {
    case kFloat:
      return "<f4";
    case kDouble:
      return "<f8";
    case kHalf:
      return "<f2";
    case kInt8:
      return "|i1";
    case kInt16:
      return "<i2";
    case kInt32:
      return "<i4";
    case kInt64:
      return "<i8";
    case kUint8:
      return "|u1";
    case kUint16:
      return "<u2";
    case kUint32:
      return "<u4";
    case kUint64:
      return "<u8";
    case kBool:
      return "|b1";
    default:
      return nullptr;
  }
}

bool SafeByte(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
         c == '-';
}

}  // namespace

absl::StatusOr<std::string> NpyHeader(int dtype, const Shape& shape) {
  const char* descr = NpyDescr(dtype);
  if (descr == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("NumPy has no dtype for ", DataTypeName(dtype)));
  }
  std::string dims = absl::StrJoin(shape, ", ");
  if (shape.size() == 1) dims += ",";  // a one-element Python tuple
  std::string dict =
      absl::StrCat("{'descr': '", descr, "', 'fortran_order': False, 'shape': (", dims, "), }");
  // magic (6) + version (2) + header length (2) + dict + padding + '\n'.
  const size_t unpadded = 10 + dict.size() + 1;
  dict.append((64 - unpadded % 64) % 64, ' ');
  dict.push_back('\n');
  std::string header("\x93NUMPY\x01\x00", 8);
  header.push_back(static_cast<char>(dict.size() & 0xff));
  header.push_back(static_cast<char>(dict.size() >> 8));
  return header + dict;
}

absl::StatusOr<std::string> SafetensorsDtype(int dtype) {
  switch (dtype) {
    case kFloat:
      return std::string("F32");
    case kDouble:
      return std::string("F64");
    case kHalf:
      return std::string("F16");
    case kBfloat16:
      return std::string("BF16");
    case kInt8:
      return std::string("I8");
    case kInt16:
      return std::string("I16");
    case kInt32:
      return std::string("I32");
    case kInt64:
      return std::string("I64");
    case kUint8:
      return std::string("U8");
    case kUint16:
      return std::string("U16");
    case kUint32:
      return std::string("U32");
    case kUint64:
      return std::string("U64");
    case kBool:
      return std::string("BOOL");
    default:
      return absl::InvalidArgumentError(absl::StrCat("safetensors has no dtype for ", DataTypeName(dtype)));
  }
}

std::string TensorFileName(absl::string_view name) {
  std::vector<std::string> parts;
  for (absl::string_view part : absl::StrSplit(name, '/')) {
    std::string out;
    const bool dots_only = part.empty() || part == "." || part == "..";
    for (char c : part) {
      if (SafeByte(c) && !(dots_only && c == '.')) {
        out.push_back(c);
      } else {
        absl::StrAppendFormat(&out, "%%%02X", static_cast<unsigned char>(c));
      }
    }
    if (out.empty()) out.push_back('%');  // an empty part: "a//b" keeps its shape, visibly
    parts.push_back(std::move(out));
  }
  return absl::StrJoin(parts, "/");
}

absl::Status WriteSafetensors(FileSystem* fs, const std::string& path,
                              const std::vector<ExportTensor>& tensors,
                              const std::vector<std::pair<std::string, std::string>>& metadata,
                              const std::function<absl::Status(size_t, std::string*)>& read) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header["__metadata__"] = meta;
  }
  uint64_t offset = 0;
  std::vector<uint64_t> sizes;
  for (const ExportTensor& t : tensors) {
    ASSIGN_OR_RETURN(std::string dtype, SafetensorsDtype(t.dtype));
    if (header.contains(t.name))
      return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "' twice"));
    uint64_t bytes = DataTypeSize(t.dtype);
    for (int64_t d : t.shape) bytes *= static_cast<uint64_t>(d);
    header[t.name] = {{"dtype", dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    sizes.push_back(bytes);
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  std::string prefix(8, '\0');
  for (int i = 0; i < 8; ++i)
    prefix[i] = static_cast<char>((static_cast<uint64_t>(text.size()) >> (8 * i)) & 0xff);
  ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, fs->NewWritableFile(path));
  RETURN_IF_ERROR(file->Append(prefix));
  RETURN_IF_ERROR(file->Append(text));
  std::string bytes;
  for (size_t i = 0; i < tensors.size(); ++i) {
    bytes.clear();
    RETURN_IF_ERROR(read(i, &bytes));
    if (bytes.size() != sizes[i]) {
      return absl::InternalError(absl::StrCat("tensor '", tensors[i].name, "': ", bytes.size(),
                                              " bytes read, ", sizes[i], " expected"));
    }
    RETURN_IF_ERROR(file->Append(bytes));
  }
  RETURN_IF_ERROR(file->Sync());
  return file->Close();
}

absl::Status WriteNpy(FileSystem* fs, const std::string& path, int dtype, const Shape& shape,
                      absl::string_view data) {
  ASSIGN_OR_RETURN(std::string header, NpyHeader(dtype, shape));
  ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, fs->NewWritableFile(path));
  RETURN_IF_ERROR(file->Append(header));
  RETURN_IF_ERROR(file->Append(data));
  RETURN_IF_ERROR(file->Sync());
  return file->Close();
}

}  // namespace ckptd
