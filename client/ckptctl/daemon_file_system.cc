#include "client/ckptctl/daemon_file_system.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace ckptctl {
namespace {

struct StepFile {
  std::string run;
  int64_t step = 0;
  std::string file;
};

absl::StatusOr<StepFile> ParsePath(const std::string& path) {
  std::vector<std::string> parts = absl::StrSplit(path, '/', absl::SkipEmpty());
  long long step = 0;
  char tail = 0;
  if (parts.size() != 3 || std::sscanf(parts[1].c_str(), "step-%lld%c", &step, &tail) != 1) {
    return absl::NotFoundError(absl::StrCat(path, ": not a file of a step (want /RUN/step-N/FILE)"));
  }
  return StepFile{parts[0], step, parts[2]};
}

class DaemonFile final : public ckptd::RandomAccessFile {
 public:
  DaemonFile(ckptd::Client* client, const DaemonFlags& flags, StepFile where, uint64_t size)
      : client_(client), flags_(flags), where_(std::move(where)), size_(size) {}
  absl::Status Read(uint64_t offset, size_t n, char* dst) const override {
    if (offset + n > size_) return absl::OutOfRangeError(absl::StrCat("read past the end of ", where_.file));
    return client_
        ->ReadStepFile(where_.run, where_.step, where_.file, static_cast<int64_t>(offset),
                       static_cast<int64_t>(n), dst, flags_.Left(absl::Minutes(1)))
        .status();
  }
  uint64_t Size() const override { return size_; }

 private:
  ckptd::Client* client_;
  const DaemonFlags& flags_;
  StepFile where_;
  uint64_t size_;
};

absl::Status ReadOnly(const std::string& path) {
  return absl::UnimplementedError(absl::StrCat(path, ": checkpoints read through a daemon are read-only"));
}

}  // namespace

std::string DaemonFileSystem::Prefix(const std::string& run, int64_t step) {
  return absl::StrFormat("/%s/step-%08d/ckpt", run, step);
}

absl::StatusOr<uint64_t> DaemonFileSystem::FileSize(const std::string& path) {
  absl::StatusOr<StepFile> where = ParsePath(path);
  if (!where.ok()) return where.status();
  absl::StatusOr<int64_t> size = client_->ReadStepFile(where->run, where->step, where->file, 0, 0, nullptr,
                                                       flags_.Left(absl::Minutes(1)));
  if (!size.ok()) return size.status();
  return static_cast<uint64_t>(*size);
}

absl::StatusOr<std::unique_ptr<ckptd::RandomAccessFile>> DaemonFileSystem::NewRandomAccessFile(
    const std::string& path) {
  absl::StatusOr<StepFile> where = ParsePath(path);
  if (!where.ok()) return where.status();
  absl::StatusOr<uint64_t> size = FileSize(path);
  if (!size.ok()) return size.status();
  return std::make_unique<DaemonFile>(client_, flags_, *std::move(where), *size);
}

absl::StatusOr<std::unique_ptr<ckptd::WritableFile>> DaemonFileSystem::NewWritableFile(
    const std::string& path) {
  return ReadOnly(path);
}
absl::Status DaemonFileSystem::CreateDir(const std::string& path, uint32_t) { return ReadOnly(path); }
absl::Status DaemonFileSystem::SetMode(const std::string& path, uint32_t) { return ReadOnly(path); }
absl::Status DaemonFileSystem::Rename(const std::string& from, const std::string&) { return ReadOnly(from); }
absl::Status DaemonFileSystem::SyncDir(const std::string& path) { return ReadOnly(path); }
absl::Status DaemonFileSystem::DeleteFile(const std::string& path) { return ReadOnly(path); }
absl::Status DaemonFileSystem::DeleteRecursively(const std::string& path) { return ReadOnly(path); }
absl::StatusOr<std::vector<std::string>> DaemonFileSystem::ListDir(const std::string& path) {
  return absl::UnimplementedError(
      absl::StrCat(path, ": a daemon's checkpoints are listed with ckptctl ls --address"));
}

}  // namespace ckptctl
