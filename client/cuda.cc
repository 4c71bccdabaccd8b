#include "ckptd/cuda.h"

#include <cuda_runtime_api.h>

#include <cstring>

#include "absl/strings/str_cat.h"

namespace ckptd {
namespace {

absl::Status CudaError(cudaError_t error, absl::string_view what, absl::StatusCode code) {
  return absl::Status(
      code, absl::StrCat(what, ": ", cudaGetErrorName(error), " (", cudaGetErrorString(error), ")"));
}

}  // namespace

int CudaDeviceCount(std::string* why) {
  int count = 0;
  if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
    if (why != nullptr) *why = absl::StrCat(cudaGetErrorName(e), ": ", cudaGetErrorString(e));
    return 0;
  }
  if (count == 0 && why != nullptr) *why = "no CUDA device";
  return count;
}

absl::StatusOr<DeviceMemory> ExportDeviceMemory(const void* allocation_base, int64_t offset) {
  cudaPointerAttributes attributes;
  if (cudaError_t e = cudaPointerGetAttributes(&attributes, allocation_base); e != cudaSuccess) {
    return CudaError(e, "device memory", absl::StatusCode::kFailedPrecondition);
  }
  if (attributes.type != cudaMemoryTypeDevice) {
    return absl::InvalidArgumentError("device memory: the pointer is not CUDA device memory");
  }
  cudaIpcMemHandle_t handle;
  if (cudaError_t e = cudaIpcGetMemHandle(&handle, const_cast<void*>(allocation_base)); e != cudaSuccess) {
    return CudaError(e, "device memory: IPC handle (is the pointer an allocation's base?)",
                     absl::StatusCode::kInvalidArgument);
  }
  cudaDeviceProp prop;
  if (cudaError_t e = cudaGetDeviceProperties(&prop, attributes.device); e != cudaSuccess) {
    return CudaError(e, "device properties", absl::StatusCode::kFailedPrecondition);
  }
  DeviceMemory out;
  out.ipc_handle.assign(reinterpret_cast<const char*>(&handle), sizeof(handle));
  out.offset = offset;
  out.device_uuid.assign(prop.uuid.bytes, sizeof(prop.uuid.bytes));
  return out;
}

}  // namespace ckptd
