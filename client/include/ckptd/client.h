// ckptd's C++ client library: what a trainer links to save and restore its shards
// through the daemon on its host. Depends on gRPC and the generated API only, never on
// daemon code. A Client is thread-safe except Barrier, whose sequence number assumes
// one caller per trainer; every call takes a deadline. A Client owns the shared-
// memory segments it hands the daemon (memfds; see the proto's SharedMemory).
#ifndef CKPTD_CLIENT_CLIENT_H_
#define CKPTD_CLIENT_CLIENT_H_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ckptd/v1/ckptd.grpc.pb.h"

namespace ckptd {

// TensorFlow DataType numbers most trainers need.
enum ClientDataType : int {
  kDtFloat = 1,
  kDtDouble = 2,
  kDtInt32 = 3,
  kDtUint8 = 4,
  kDtInt16 = 5,
  kDtInt8 = 6,
  kDtInt64 = 9,
  kDtBool = 10,
  kDtBfloat16 = 14,
  kDtUint16 = 17,
  kDtHalf = 19,
  kDtUint32 = 22,
  kDtUint64 = 23,
};

// One shard a trainer saves: `data` holds the box's elements row-major. With
// use_layout, the tensor follows a DTensor layout over the options' mesh instead, and
// device_data holds one buffer per device of options.device_ids, in that order.
// A tensor's bytes in CUDA device memory, lent to the daemon by a CUDA IPC handle of
// the allocation's base (see ckptd/cuda.h, ExportDeviceMemory). The daemon must see
// the device; one built without CUDA, or on a host without a GPU, refuses with
// UNIMPLEMENTED or FAILED_PRECONDITION before the step counts.
struct DeviceMemory {
  std::string ipc_handle;   // cudaIpcMemHandle_t, 64 bytes
  int64_t offset = 0;       // of the tensor's bytes in the allocation
  std::string device_uuid;  // cudaDeviceProp.uuid, 16 bytes
};

// Host memory the daemon on this host can write restored bytes straight into: a
// sealed memfd mapped into this process. A RestoreTarget whose bytes lie in one names
// it (host_buffer) and is filled by the daemon directly, one copy from the daemon's
// memory instead of two (into a reply segment, then out of it), on the shared-memory
// path; streamed restores fill it like any memory. Keep a trainer's tensors in a few
// large buffers rather than many small ones: the daemon keeps its mappings of at most
// 16 segments per trainer process. Buffers of 4 MiB or more go in huge pages where
// the kernel has them to give (vm.nr_hugepages or vm.nr_overcommit_hugepages;
// CKPTD_HUGE_PAGES=0 turns that off), which the daemon reads into with O_DIRECT in
// place. Owns its memory; not copyable.
class HostBuffer {
 public:
  static absl::StatusOr<std::unique_ptr<HostBuffer>> Allocate(size_t bytes);
  ~HostBuffer();
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;

  char* data() const { return data_; }
  size_t size() const { return size_; }
  int fd() const { return fd_; }  // the memfd, as the daemon is told of it
  // In huge pages (see Allocate): the daemon reads into it with O_DIRECT in place.
  bool huge_pages() const { return huge_pages_; }
  bool Contains(const void* p, size_t n) const {
    const char* c = static_cast<const char*>(p);
    return c >= data_ && c <= data_ + size_ && n <= static_cast<size_t>(data_ + size_ - c);
  }

 private:
  HostBuffer(int fd, char* data, size_t size, size_t mapped, bool huge_pages)
      : fd_(fd), data_(data), size_(size), mapped_(mapped), huge_pages_(huge_pages) {}
  int fd_;
  char* data_;
  size_t size_;
  size_t mapped_;  // size_, rounded up to whole huge pages when in them
  bool huge_pages_;
};

struct TensorShard {
  std::string name{};
  int dtype = kDtFloat;
  std::vector<int64_t> shape{};      // global shape
  std::vector<int64_t> box_start{};  // empty (with box_length) = the whole tensor
  std::vector<int64_t> box_length{};
  const void* data = nullptr;
  size_t size = 0;  // bytes
  bool use_layout = false;
  std::vector<std::string> sharding_specs{};  // per dimension: a mesh dimension or "unsharded"
  std::vector<std::pair<const void*, size_t>> device_data{};
  // Instead of data/size: the box's bytes lie in device memory (not with use_layout).
  std::optional<DeviceMemory> device_memory{};
};

// Where a restored box goes. dtype 0 and an empty shape skip those checks; a dtype
// other than the stored one converts between float32, bfloat16 and float16. With
// use_layout, device_data receives one box per device of options.device_ids.
struct RestoreTarget {
  std::string name{};
  int dtype = 0;
  std::vector<int64_t> shape{};
  std::vector<int64_t> box_start{};  // empty = the whole tensor
  std::vector<int64_t> box_length{};
  void* data = nullptr;
  size_t size = 0;  // must equal the box's bytes exactly
  bool use_layout = false;
  std::vector<std::string> sharding_specs{};
  std::vector<std::pair<void*, size_t>> device_data{};
  // Instead of data/size: deliver the box's bytes into device memory (not with use_layout).
  std::optional<DeviceMemory> device_memory{};
  // The HostBuffer that data/size lie in, when they do: the daemon writes them there
  // itself (not with use_layout or device_memory).
  const HostBuffer* host_buffer = nullptr;
};

// How bytes travel between trainer and daemon. kAuto uses shared memory when the
// daemon is on a unix socket (and falls back to streaming, for good, if the daemon
// cannot map the client's segments); kStream always streams over gRPC.
enum class Transport { kAuto, kStream, kSharedMemory };

struct SaveOptions {
  // DTensor mesh string ("|x=2,y=4|0,...,7|0,1|/job:...,..."); needed for layouts.
  std::string mesh{};
  std::vector<int64_t> device_ids{};  // this trainer's global device ids on the mesh
  bool store_float32_as_bfloat16 = false;
  std::map<std::string, std::string> trainer_state{};  // opaque, returned to this trainer id only
  absl::Duration timeout = absl::Minutes(10);
  Transport transport = Transport::kAuto;
};

// What one restore cost, as the daemon reports it: bytes of data files it read from
// storage for this call (blocks its read cache held, because another restore or host
// had just read them, are not counted), bytes it received from other hosts' daemons,
// and bytes delivered into the targets.
struct RestoreStats {
  int64_t storage_bytes_read = 0;
  int64_t peer_bytes_received = 0;
  int64_t bytes_delivered = 0;
  // The daemon wrote the bytes into the targets itself (on this host, where the
  // kernel lets it): no shared-memory segment was filled or copied out of.
  bool into_trainer_memory = false;
};

struct RestoreOptions {
  std::string mesh{};  // may differ from the mesh the checkpoint was saved on
  std::vector<int64_t> device_ids{};
  int trainer_id = 0;
  std::map<std::string, std::string>* trainer_state = nullptr;  // filled when set
  RestoreStats* stats = nullptr;                                // filled when set
  absl::Duration timeout = absl::Minutes(10);
  Transport transport = Transport::kAuto;
  // A restore that fails (DATA_LOSS: a checksum) may have filled some targets already:
  // each tensor lands in its target as soon as the daemon has read and verified it
  // (written there by the daemon itself, or copied out of the segment), so that
  // delivery overlaps the reads. With this set, the targets are written only once
  // every tensor has read cleanly (over shared memory, copied out of the segment by
  // the client; the gRPC stream always delivers as it reads), and a failed restore
  // leaves them as they were. The copies then follow the reads.
  bool keep_targets_on_failure = false;
};

struct SaveResult {
  int64_t bytes_staged = 0;
  double staging_seconds = 0;  // as the daemon measured it
  bool shared_memory = false;  // which path the bytes took
};

// For name-based save and restore (DTensor's name_based_save / name_based_restore):
// a tensor's dtype, global shape, layout over the call's mesh, and one buffer per
// device of the call's device_ids.
struct NamedTensor {
  int dtype = kDtFloat;
  std::vector<int64_t> shape;
  std::vector<std::string> sharding_specs;
  std::vector<std::pair<void*, size_t>> device_data;
};
using NamedTensors = std::vector<std::pair<std::string, NamedTensor>>;  // saved in this order

// PEM files for a daemon's TCP listener, which only speaks mutual TLS.
struct TlsFiles {
  std::string cert;  // this client's certificate...
  std::string key;   // ...and its key
  std::string ca;    // the CA the daemon's certificate must chain to
};

// The socket a daemon started without flags listens on: /tmp/ckptd-<uid>/ckptd-0.sock.
std::string DefaultSocketPath();

// The gRPC target an address names, as people write addresses: "unix:PATH" as it is;
// a value that contains a '/' or names an existing file is a unix socket (relative
// paths from the working directory); anything else is "host:port" (TCP). Empty:
// $CKPTD_ADDRESS, else the default socket (DefaultSocketPath).
std::string DaemonTarget(const std::string& address);

// How the daemon is looked for when it is not there.
enum class WaitForDaemon {
  // Wait up to the timeout for a daemon to listen: a trainer may start before it.
  kUpToTimeout,
  // A unix socket that is missing, or that nothing accepts on, is UNAVAILABLE at
  // once, saying so (an operator's tool, asking a daemon that should be running).
  kNo,
};

// What Wait does with a run its daemon has never seen (no step of it staged, being
// committed or on disk): say so at once, or wait for it (a watcher that starts before
// the run's first save).
enum class UnknownRun { kNotFound, kWait };

class Client {
 public:
  // `address` as DaemonTarget reads it ("host:port" needs `tls`). Waits up to
  // `timeout` for the daemon to accept (see WaitForDaemon); an error names the
  // address tried and how it was chosen.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const std::string& address = "",
                                                         absl::Duration timeout = absl::Seconds(10),
                                                         const TlsFiles* tls = nullptr,
                                                         WaitForDaemon wait = WaitForDaemon::kUpToTimeout);

  // Stages this trainer's shards for (run, step); returns once they are in daemon
  // memory, after which the shards' buffers may be reused. On the shared-memory path
  // the bytes are copied once, into a segment the daemon writes from; the client
  // reuses a segment after Wait has reported its step committed.
  absl::StatusOr<SaveResult> Save(const std::string& run, int64_t step, int trainer_id, int trainer_count,
                                  const std::vector<TensorShard>& shards, const SaveOptions& options = {});
  absl::StatusOr<SaveResult> SaveByName(const std::string& run, int64_t step, int trainer_id,
                                        int trainer_count, const NamedTensors& tensors,
                                        const SaveOptions& options);
  // Returns once (run, step) is committed on every host, or with the step's error.
  // Frees the shared-memory segments of the run's saves up to that step for reuse.
  // A run the daemon has never seen is NOT_FOUND at once, unless UnknownRun::kWait.
  absl::Status Wait(const std::string& run, int64_t step, absl::Duration timeout = absl::Minutes(10),
                    UnknownRun unknown_run = UnknownRun::kNotFound);
  // Fills every target from (run, step), or from the newest committed step when `step`
  // is nullopt; returns the step restored. On failure the targets' contents are
  // undefined, unless options.keep_targets_on_failure (see there).
  absl::StatusOr<int64_t> Restore(const std::string& run, std::optional<int64_t> step,
                                  const std::vector<RestoreTarget>& targets,
                                  const RestoreOptions& options = {});
  absl::StatusOr<int64_t> RestoreByName(const std::string& run, std::optional<int64_t> step,
                                        const NamedTensors& tensors, const RestoreOptions& options);
  // Returns once every trainer of the job has called Barrier the same number of times.
  // With a mesh, the daemons also check that the devices all trainers declared make
  // up the mesh (FAILED_PRECONDITION otherwise).
  absl::Status Barrier(const std::string& run, int trainer_id, int trainer_count,
                       absl::Duration timeout = absl::Minutes(10), const std::string& mesh = "",
                       const std::vector<int64_t>& device_ids = {});
  absl::StatusOr<v1::StatusResponse> Status(absl::Duration timeout = absl::Seconds(10));
  absl::StatusOr<v1::ListCheckpointsResponse> ListCheckpoints(const std::string& run,
                                                              absl::Duration timeout = absl::Seconds(30));
  // Reads [offset, offset + size) of one file of a committed step (ckpt.index,
  // ckptd.json or a data file) through the daemon into dst; size 0 only asks for the
  // file's size. Returns the file's size.
  absl::StatusOr<int64_t> ReadStepFile(const std::string& run, int64_t step, const std::string& file,
                                       int64_t offset, int64_t size, char* dst,
                                       absl::Duration timeout = absl::Minutes(1));
  // Every tensor of a committed step (nullopt: the newest), name, dtype and global
  // shape, in name order: all pages of ListTensors in one reply. `timeout` is per page.
  absl::StatusOr<v1::ListTensorsResponse> ListTensors(const std::string& run, std::optional<int64_t> step,
                                                      absl::Duration timeout = absl::Seconds(30));

  ~Client();

 private:
  using Segment = HostBuffer;  // the reply and save segments the client pools
  Client(std::shared_ptr<grpc::Channel> channel, bool local);
  // Both send the request they are given, setting or clearing its shared-memory
  // fields for this try: a fallback reuses it, and nothing copies a request of
  // 100,000 tensors.
  absl::StatusOr<SaveResult> SaveVia(bool shared_memory, v1::SaveRequest* message,
                                     const std::vector<std::pair<const void*, size_t>>& pieces,
                                     const SaveOptions& options);
  absl::StatusOr<int64_t> RestoreVia(bool shared_memory, v1::RestoreRequest* request,
                                     const std::vector<RestoreTarget>& targets,
                                     const std::vector<std::vector<std::pair<void*, size_t>>>& pieces,
                                     const std::vector<size_t>& capacity, const RestoreOptions& options);
  bool UseSharedMemory(Transport transport) const;
  // A free segment of at least `size` bytes, or a new one.
  absl::StatusOr<std::unique_ptr<Segment>> TakeSegment(size_t size);
  void ReturnSegment(std::unique_ptr<Segment> segment);

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Ckptd::Stub> stub_;
  std::map<std::string, int64_t> barrier_sequence_;
  const bool local_;
  mutable std::mutex mu_;  // guards the segment pools and shared_memory_works_
  bool shared_memory_works_ = true;
  std::vector<std::unique_ptr<Segment>> free_segments_;
  // Segments the daemon may still write from, by (run, step), until Wait.
  std::map<std::pair<std::string, int64_t>, std::unique_ptr<Segment>> busy_segments_;
};

// Sets this process's malloc (glibc) to keep the large blocks gRPC allocates for every
// message it moves: blocks up to 32 MiB come from the heap instead of fresh mappings,
// and up to 512 MiB of freed heap is kept rather than handed back to the kernel. Without
// it, each 4 MiB reply of a streamed restore may land in pages the kernel must fault in
// again, and on a VM that can halve the restore (docs/operations.md has the figures).
// The daemon sets the same. Optional and process-wide, so it is the trainer's choice:
// call it once, early in main, before other threads allocate. Python trainers get the
// same from the environment: GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:
// glibc.malloc.trim_threshold=536870912. A no-op where malloc is not glibc's.
void KeepFreedMemoryForReuse();

// grpc::Status -> absl::Status, same code and message; except that a call's own
// deadline passing (gRPC's DEADLINE_EXCEEDED with no word from the daemon) says so:
// its message starts with kClientTimeout. The daemon's DEADLINE_EXCEEDED (a step or
// barrier that failed its commit timeout, naming the missing trainers) never does.
inline constexpr char kClientTimeout[] = "client-side timeout";
absl::Status FromGrpcStatus(const grpc::Status& status);
// True for a status from this client's own deadline, not from the daemon.
bool IsClientTimeout(const absl::Status& status);

}  // namespace ckptd

#endif  // CKPTD_CLIENT_CLIENT_H_
