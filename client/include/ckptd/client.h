// ckptd's C++ client library: what a trainer links to save and restore its shards
// through the daemon on its host. Depends on gRPC and the generated API only, never on
// daemon code. A Client is thread-safe except Barrier, whose sequence number assumes
// one caller per trainer; every call takes a deadline.
#ifndef CKPTD_CLIENT_CLIENT_H_
#define CKPTD_CLIENT_CLIENT_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ckptd/v1/ckptd.grpc.pb.h"

namespace ckptd {

// TensorFlow DataType numbers most trainers need.
enum ClientDataType : int {
  kDtFloat = 1, kDtDouble = 2, kDtInt32 = 3, kDtUint8 = 4, kDtInt16 = 5, kDtInt8 = 6,
  kDtInt64 = 9, kDtBool = 10, kDtBfloat16 = 14, kDtUint16 = 17, kDtHalf = 19,
  kDtUint32 = 22, kDtUint64 = 23,
};

// One shard a trainer saves: `data` holds the box's elements row-major.
struct TensorShard {
  std::string name;
  int dtype = kDtFloat;
  std::vector<int64_t> shape;       // global shape
  std::vector<int64_t> box_start;   // empty (with box_length) = the whole tensor
  std::vector<int64_t> box_length;
  const void* data = nullptr;
  size_t size = 0;                  // bytes
};

// Where a restored box goes. dtype 0 and an empty shape skip those checks.
struct RestoreTarget {
  std::string name;
  int dtype = 0;
  std::vector<int64_t> shape;
  std::vector<int64_t> box_start;   // empty = the whole tensor
  std::vector<int64_t> box_length;
  void* data = nullptr;
  size_t size = 0;                  // must equal the box's bytes exactly
};

struct SaveResult {
  int64_t bytes_staged = 0;
  double staging_seconds = 0;
};

class Client {
 public:
  // `address` is "unix:/path", a plain socket path, or empty for $CKPTD_ADDRESS.
  // Waits up to `timeout` for the daemon to accept connections.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const std::string& address = "",
                                                         absl::Duration timeout = absl::Seconds(10));

  // Stages this trainer's shards for (run, step); returns once they are in daemon memory.
  absl::StatusOr<SaveResult> Save(const std::string& run, int64_t step, int trainer_id, int trainer_count,
                                  const std::vector<TensorShard>& shards,
                                  absl::Duration timeout = absl::Minutes(10));
  // Returns once (run, step) is committed on every host, or with the step's error.
  absl::Status Wait(const std::string& run, int64_t step, absl::Duration timeout = absl::Minutes(10));
  // Fills every target from (run, step), or from the newest committed step when `step`
  // is nullopt; returns the step restored.
  absl::StatusOr<int64_t> Restore(const std::string& run, std::optional<int64_t> step,
                                  const std::vector<RestoreTarget>& targets,
                                  absl::Duration timeout = absl::Minutes(10));
  // Returns once every trainer of the job has called Barrier the same number of times.
  absl::Status Barrier(const std::string& run, int trainer_id, int trainer_count,
                       absl::Duration timeout = absl::Minutes(10));
  absl::StatusOr<v1::StatusResponse> Status(absl::Duration timeout = absl::Seconds(10));
  absl::StatusOr<v1::ListCheckpointsResponse> ListCheckpoints(const std::string& run,
                                                              absl::Duration timeout = absl::Seconds(30));

 private:
  explicit Client(std::shared_ptr<grpc::Channel> channel);

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Ckptd::Stub> stub_;
  std::map<std::string, int64_t> barrier_sequence_;
};

// grpc::Status -> absl::Status, same code and message.
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace ckptd

#endif  // CKPTD_CLIENT_CLIENT_H_
