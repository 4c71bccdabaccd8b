// Lending CUDA device memory to ckptd (built only when CUDA is; link ckptd_client_cuda).
//
//   float* w;  cudaMalloc(&w, bytes);
//   auto lent = ckptd::ExportDeviceMemory(w, 0);
//   shard.device_memory = *lent;   // Save copies it to the daemon's pinned staging
//
// The handle stays valid while the allocation lives; a trainer must not free or
// overwrite the bytes until Save returns (Save returns once they are staged).
#ifndef CKPTD_CLIENT_CUDA_H_
#define CKPTD_CLIENT_CUDA_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "ckptd/client.h"

namespace ckptd {

// Describes the bytes at `offset` of the device allocation whose base is
// `allocation_base` (a pointer cudaMalloc returned): its IPC handle and device UUID.
// FAILED_PRECONDITION when there is no usable device, INVALID_ARGUMENT when the
// pointer is not the base of a device allocation.
absl::StatusOr<DeviceMemory> ExportDeviceMemory(const void* allocation_base, int64_t offset);

// How many CUDA devices this process sees; 0 (with the reason in `why`) when none.
int CudaDeviceCount(std::string* why);

}  // namespace ckptd

#endif  // CKPTD_CLIENT_CUDA_H_
