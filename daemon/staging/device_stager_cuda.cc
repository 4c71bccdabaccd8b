// The CUDA DeviceStager. CUDA runtime calls live here and nowhere else in the daemon;
// every cudaError_t becomes an absl::Status where it occurs.
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "daemon/base/status.h"
#include "daemon/staging/device_stager.h"

namespace ckptd {
namespace {

absl::Status CudaToStatus(cudaError_t error, absl::string_view what) {
  if (error == cudaSuccess) return absl::OkStatus();
  const std::string message =
      absl::StrCat(what, ": ", cudaGetErrorName(error), " (", cudaGetErrorString(error), ")");
  switch (error) {
    case cudaErrorInvalidValue:
    case cudaErrorInvalidResourceHandle:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorMapBufferObjectFailed:
      return absl::InvalidArgumentError(message);
    case cudaErrorMemoryAllocation:
    case cudaErrorHostMemoryAlreadyRegistered:
      return absl::ResourceExhaustedError(message);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorDevicesUnavailable:
    case cudaErrorInvalidDevice:
      return absl::FailedPreconditionError(message);
    default:
      return absl::InternalError(message);
  }
}

std::string UuidText(const std::string& uuid) { return absl::StrCat("GPU-", absl::BytesToHexString(uuid)); }

// Host ranges this process pinned, by start. Registration is process-wide in CUDA, so
// this is too.
class PinnedRanges {
 public:
  static PinnedRanges& Get() {
    static PinnedRanges* ranges = new PinnedRanges;  // never destroyed: used by frees at exit
    return *ranges;
  }

  absl::Status Ensure(char* p, int64_t bytes) {
    absl::MutexLock lock(&mu_);
    auto it = pinned_.find(p);
    if (it != pinned_.end() && it->second >= bytes) return absl::OkStatus();
    if (it != pinned_.end()) {  // cannot happen for pooled buffers; be safe anyway
      cudaHostUnregister(p);
      pinned_.erase(it);
    }
    if (absl::Status s = CudaToStatus(
            cudaHostRegister(p, static_cast<size_t>(bytes), cudaHostRegisterDefault), "pin staging memory");
        !s.ok()) {
      return s;
    }
    pinned_[p] = bytes;
    any_.store(true, std::memory_order_release);
    return absl::OkStatus();
  }

  void Forget(char* p) {
    if (!any_.load(std::memory_order_acquire)) return;
    absl::MutexLock lock(&mu_);
    auto it = pinned_.find(p);
    if (it == pinned_.end()) return;
    cudaHostUnregister(p);
    pinned_.erase(it);
  }

 private:
  absl::Mutex mu_;
  std::map<char*, int64_t> pinned_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> any_{false};
};

// An IPC allocation opened for one copy; closed when done.
class OpenedHandle {
 public:
  static absl::StatusOr<std::unique_ptr<OpenedHandle>> Open(const DeviceMemoryRef& ref, int device) {
    if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) return CudaToStatus(e, "select device");
    cudaIpcMemHandle_t handle;
    std::memcpy(&handle, ref.ipc_handle.data(), sizeof(handle));
    void* base = nullptr;
    if (cudaError_t e = cudaIpcOpenMemHandle(&base, handle, cudaIpcMemLazyEnablePeerAccess);
        e != cudaSuccess) {
      return CudaToStatus(e, "device_memory.ipc_handle: open");
    }
    return std::unique_ptr<OpenedHandle>(new OpenedHandle(static_cast<char*>(base)));
  }
  ~OpenedHandle() { cudaIpcCloseMemHandle(base_); }
  char* base() const { return base_; }

 private:
  explicit OpenedHandle(char* base) : base_(base) {}
  char* base_;
};

class CudaStream {
 public:
  static absl::StatusOr<std::unique_ptr<CudaStream>> Create() {
    cudaStream_t stream = nullptr;
    if (cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking); e != cudaSuccess) {
      return CudaToStatus(e, "create stream");
    }
    return std::unique_ptr<CudaStream>(new CudaStream(stream));
  }
  ~CudaStream() { cudaStreamDestroy(stream_); }
  cudaStream_t get() const { return stream_; }

 private:
  explicit CudaStream(cudaStream_t stream) : stream_(stream) {}
  cudaStream_t stream_;
};

class CudaDeviceStager : public DeviceStager {
 public:
  CudaDeviceStager() {
    int count = 0;
    std::string first_name;
    if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
      available_ = CudaToStatus(e, "device_memory: no usable CUDA device");
      if (absl::IsInternal(available_)) {  // an unexpected code still means "no device"
        available_ = absl::FailedPreconditionError(std::string(available_.message()));
      }
      return;
    }
    if (count == 0) {
      available_ = absl::FailedPreconditionError("device_memory: this host has no CUDA device");
      return;
    }
    for (int i = 0; i < count; ++i) {
      cudaDeviceProp prop;
      if (cudaError_t e = cudaGetDeviceProperties(&prop, i); e != cudaSuccess) {
        available_ = CudaToStatus(e, absl::StrCat("properties of device ", i));
        return;
      }
      uuids_.emplace_back(prop.uuid.bytes, sizeof(prop.uuid.bytes));
      if (i == 0) first_name = prop.name;
    }
    int runtime = 0, driver = 0;
    cudaRuntimeGetVersion(&runtime);
    cudaDriverGetVersion(&driver);
    description_ =
        absl::StrCat("CUDA runtime ", runtime / 1000, ".", runtime % 1000 / 10, ", driver ", driver / 1000,
                     ".", driver % 1000 / 10, ", ", count, " device(s), first ", first_name);
  }

  absl::Status Available() const override { return available_; }

  // Fixed at start: Status reports it every coordination round.
  std::string Describe() const override {
    return available_.ok() ? description_ : absl::StrCat("refused (", available_.message(), ")");
  }

  Totals CopyTotals() const override {
    absl::MutexLock lock(&totals_mu_);
    return totals_;
  }

  absl::Status CopyToHost(const DeviceMemoryRef& src, StagedBuffer& dst) override {
    return Copy(src, dst, cudaMemcpyDeviceToHost);
  }
  absl::Status CopyToDevice(StagedBuffer& src, const DeviceMemoryRef& dst) override {
    return Copy(dst, src, cudaMemcpyHostToDevice);
  }

 private:
  absl::StatusOr<int> DeviceOf(const std::string& uuid) const {
    for (size_t i = 0; i < uuids_.size(); ++i) {
      if (uuids_[i] == uuid) return static_cast<int>(i);
    }
    return absl::FailedPreconditionError(
        absl::StrCat("device_memory.device_uuid: ", UuidText(uuid),
                     " is not a device this daemon sees (CUDA_VISIBLE_DEVICES?)"));
  }

  absl::Status Copy(const DeviceMemoryRef& device_memory, StagedBuffer& host, cudaMemcpyKind kind) {
    if (!available_.ok()) return available_;
    if (host.size() == 0) return absl::OkStatus();
    ASSIGN_OR_RETURN(int device, DeviceOf(device_memory.device_uuid));
    // Borrowed memory is not ours to pin; the daemon only stages device copies in
    // owned buffers, so that is a bug if it happens.
    if (host.capacity() == 0) return absl::InternalError("device copy into borrowed staging memory");
    RETURN_IF_ERROR(PinnedRanges::Get().Ensure(host.data(), host.capacity()));
    ASSIGN_OR_RETURN(std::unique_ptr<OpenedHandle> opened, OpenedHandle::Open(device_memory, device));
    ASSIGN_OR_RETURN(std::unique_ptr<CudaStream> stream, CudaStream::Create());
    char* on_device = opened->base() + device_memory.offset;
    const size_t n = static_cast<size_t>(host.size());
    const absl::Time start = absl::Now();
    cudaError_t e = kind == cudaMemcpyDeviceToHost
                        ? cudaMemcpyAsync(host.data(), on_device, n, kind, stream->get())
                        : cudaMemcpyAsync(on_device, host.data(), n, kind, stream->get());
    if (e == cudaSuccess) e = cudaStreamSynchronize(stream->get());
    if (e == cudaSuccess) {
      const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
      absl::MutexLock lock(&totals_mu_);
      if (kind == cudaMemcpyDeviceToHost) {
        totals_.to_host_bytes += host.size();
        totals_.to_host_seconds += seconds;
      } else {
        totals_.to_device_bytes += host.size();
        totals_.to_device_seconds += seconds;
      }
    }
    return CudaToStatus(e,
                        kind == cudaMemcpyDeviceToHost ? "copy from device memory" : "copy to device memory");
  }

  absl::Status available_ = absl::OkStatus();
  std::vector<std::string> uuids_;  // by device ordinal
  std::string description_;
  mutable absl::Mutex totals_mu_;
  Totals totals_ ABSL_GUARDED_BY(totals_mu_);
};

}  // namespace

std::unique_ptr<DeviceStager> DeviceStager::Create() { return std::make_unique<CudaDeviceStager>(); }

namespace internal {
void ReleasePinnedBeforeFree(char* p) { PinnedRanges::Get().Forget(p); }
}  // namespace internal

}  // namespace ckptd
