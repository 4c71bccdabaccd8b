// DeviceStager: copies between a trainer's CUDA device memory (lent through a CUDA IPC
// handle) and the daemon's staging memory. This and device_stager_cuda.cc are the only
// places that touch CUDA; a build without CUDA links device_stager_none.cc instead,
// whose stager refuses every copy with UNIMPLEMENTED.
//
// The stager copies on a stream of its own and waits for it: a Save's bytes are in
// host memory when CopyToHost returns, a Restore's on the device when CopyToDevice
// does. Host staging buffers are pinned (cudaHostRegister) the first time a copy uses
// them and stay pinned while the staging pool keeps them, so repeated checkpoints pay
// for pinning once; StagingArea unpins a buffer before freeing it.
//
// Thread-safe: gRPC handler threads call it concurrently. Owned by the daemon's main.
#ifndef CKPTD_DAEMON_STAGING_DEVICE_STAGER_H_
#define CKPTD_DAEMON_STAGING_DEVICE_STAGER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "daemon/staging/staging_area.h"

namespace ckptd {

// Where a tensor's bytes lie in a trainer's device memory.
struct DeviceMemoryRef {
  static constexpr size_t kHandleBytes = 64;  // sizeof(cudaIpcMemHandle_t)
  static constexpr size_t kUuidBytes = 16;    // sizeof(cudaUUID_t)
  std::string ipc_handle;                     // of the allocation's base
  int64_t offset = 0;                         // of the tensor's bytes in that allocation
  std::string device_uuid;                    // the device the allocation lives on
};

class DeviceStager {
 public:
  virtual ~DeviceStager() = default;

  // The CUDA stager when built with CUDA, otherwise the refusing one. Never fails:
  // a machine without a GPU gets a stager whose Available() says why.
  static std::unique_ptr<DeviceStager> Create();

  // OK when copies can work: UNIMPLEMENTED without CUDA in the build,
  // FAILED_PRECONDITION when no device is usable (the message says why).
  virtual absl::Status Available() const = 0;
  // For the start-up log line: "CUDA 13.0, 1 device(s)" or why not.
  virtual std::string Describe() const = 0;

  struct Totals {
    int64_t to_host_bytes = 0;
    double to_host_seconds = 0;
    int64_t to_device_bytes = 0;
    double to_device_seconds = 0;
  };
  // Bytes copied each way since start and the seconds the copies took.
  virtual Totals CopyTotals() const = 0;

  // Copies dst.size() bytes at `src` into the staging buffer `dst`.
  virtual absl::Status CopyToHost(const DeviceMemoryRef& src, StagedBuffer& dst) = 0;
  // Copies src.size() bytes of the staging buffer `src` to `dst`.
  virtual absl::Status CopyToDevice(StagedBuffer& src, const DeviceMemoryRef& dst) = 0;
};

namespace internal {
// Unpins `p` if a stager pinned it; StagingArea calls it before freeing owned memory.
void ReleasePinnedBeforeFree(char* p);
}  // namespace internal

}  // namespace ckptd

#endif  // CKPTD_DAEMON_STAGING_DEVICE_STAGER_H_
