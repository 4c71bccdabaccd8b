// A read-only FileSystem over a running daemon: "/RUN/step-NNNNNNNN/FILE" is that
// file of a committed step as the daemon reads it (other hosts' data files through
// their daemons with storage: local), via ReadStepFile. Lets ckptctl's offline
// commands inspect, verify and export a checkpoint whose files it cannot see.
// Everything that would change files is UNIMPLEMENTED. Borrows the client and the
// flags (whose --timeout bounds every read), which must outlive it; one thread at a time.
#ifndef CKPTD_CLIENT_CKPTCTL_DAEMON_FILE_SYSTEM_H_
#define CKPTD_CLIENT_CKPTCTL_DAEMON_FILE_SYSTEM_H_

#include <memory>
#include <string>
#include <vector>

#include "ckptd/client.h"
#include "client/ckptctl/cli.h"
#include "daemon/io/file_system.h"

namespace ckptctl {

class DaemonFileSystem final : public ckptd::FileSystem {
 public:
  DaemonFileSystem(ckptd::Client* client, const DaemonFlags& flags) : client_(client), flags_(flags) {}

  // The bundle prefix of a step in this file system's paths.
  static std::string Prefix(const std::string& run, int64_t step);

  absl::StatusOr<std::unique_ptr<ckptd::RandomAccessFile>> NewRandomAccessFile(
      const std::string& path) override;
  absl::StatusOr<uint64_t> FileSize(const std::string& path) override;
  bool Exists(const std::string& path) override { return FileSize(path).ok(); }
  bool IsDirectory(const std::string&) override { return false; }

  absl::StatusOr<std::unique_ptr<ckptd::WritableFile>> NewWritableFile(const std::string& path) override;
  absl::Status CreateDir(const std::string& path, uint32_t mode) override;
  absl::Status SetMode(const std::string& path, uint32_t mode) override;
  absl::Status Rename(const std::string& from, const std::string& to) override;
  absl::Status SyncDir(const std::string& path) override;
  absl::Status DeleteFile(const std::string& path) override;
  absl::Status DeleteRecursively(const std::string& path) override;
  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& path) override;

 private:
  ckptd::Client* client_;
  const DaemonFlags& flags_;
};

}  // namespace ckptctl

#endif  // CKPTD_CLIENT_CKPTCTL_DAEMON_FILE_SYSTEM_H_
