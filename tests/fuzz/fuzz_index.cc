// libFuzzer harness: a hostile ckpt.index. The bytes are served as PREFIX.index from
// memory next to a small data file; opening, looking up, verifying and reading must
// end in a Status, never a crash or an allocation the data file cannot back.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>

#include "daemon/base/dtype.h"
#include "daemon/bundle/bundle.h"

namespace {

class MemoryFile : public ckptd::RandomAccessFile {
 public:
  explicit MemoryFile(const std::string* data) : data_(data) {}
  absl::Status Read(uint64_t offset, size_t n, char* dst) const override {
    if (offset > data_->size() || n > data_->size() - offset) return absl::OutOfRangeError("past the end");
    std::memcpy(dst, data_->data() + offset, n);
    return absl::OkStatus();
  }
  uint64_t Size() const override { return data_->size(); }

 private:
  const std::string* data_;
};

// Read-only, in memory: the files a BundleReader opens.
class MemoryFileSystem : public ckptd::FileSystem {
 public:
  std::map<std::string, std::string> files;
  absl::StatusOr<std::unique_ptr<ckptd::WritableFile>> NewWritableFile(const std::string&) override {
    return absl::UnimplementedError("read-only");
  }
  absl::StatusOr<std::unique_ptr<ckptd::RandomAccessFile>> NewRandomAccessFile(
      const std::string& path) override {
    auto it = files.find(path);
    if (it == files.end()) return absl::NotFoundError(path);
    return std::unique_ptr<ckptd::RandomAccessFile>(new MemoryFile(&it->second));
  }
  absl::Status CreateDir(const std::string&, uint32_t) override {
    return absl::UnimplementedError("read-only");
  }
  absl::Status SetMode(const std::string&, uint32_t) override {
    return absl::UnimplementedError("read-only");
  }
  absl::Status Rename(const std::string&, const std::string&) override {
    return absl::UnimplementedError("read-only");
  }
  absl::Status SyncDir(const std::string&) override { return absl::OkStatus(); }
  absl::Status DeleteFile(const std::string&) override { return absl::UnimplementedError("read-only"); }
  absl::Status DeleteRecursively(const std::string&) override {
    return absl::UnimplementedError("read-only");
  }
  absl::StatusOr<std::vector<std::string>> ListDir(const std::string&) override {
    return std::vector<std::string>();
  }
  absl::StatusOr<uint64_t> FileSize(const std::string& path) override {
    auto it = files.find(path);
    if (it == files.end()) return absl::NotFoundError(path);
    return it->second.size();
  }
  bool IsDirectory(const std::string&) override { return false; }
  bool Exists(const std::string& path) override { return files.count(path) > 0; }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  MemoryFileSystem fs;
  fs.files["/c/ckpt.index"] = std::string(reinterpret_cast<const char*>(data), size);
  for (int shards = 1; shards <= 2; ++shards) {
    for (int s = 0; s < shards; ++s)
      fs.files[ckptd::DataPath("/c/ckpt", s, shards)] = std::string(4096, '\x5a');
  }
  auto reader = ckptd::BundleReader::Open(&fs, "/c/ckpt", 1 << 20);
  if (!reader.ok()) return 0;
  std::vector<std::string> problems;
  int64_t bytes = 0;
  (*reader)->VerifyAll(&problems, &bytes);
  for (const std::string& name : (*reader)->TensorNames()) {
    auto info = (*reader)->Lookup(name);
    if (!info.ok() || ckptd::DataTypeSize(info->dtype) == 0) continue;
    const ckptd::Box box = ckptd::Box::Full(info->shape);
    if (!(*reader)->CheckBoxReadable(*info, box).ok()) continue;
    std::string out(static_cast<size_t>(box.NumElements()) * ckptd::DataTypeSize(info->dtype), '\0');
    (*reader)->ReadBox(*info, box, out.data()).IgnoreError();
  }
  return 0;
}
