// Host-memory staging: where a trainer's bytes live between Save and the write of
// its step. Buffers are allocated without zero-filling (the stream overwrites them)
// and counted so that Status can report staged bytes. StagingArea is thread-safe;
// a StagedTensor belongs to one owner at a time (handler, then registry, then writer).
#ifndef CKPTD_DAEMON_STAGING_STAGING_AREA_H_
#define CKPTD_DAEMON_STAGING_STAGING_AREA_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/layout/box.h"

namespace ckptd {

class StagingArea;

// One buffer of staged bytes; returns its bytes to the area's count when destroyed.
class StagedBuffer {
 public:
  StagedBuffer() = default;
  // Adopts `bytes` (size bytes) and counts them against `area`.
  StagedBuffer(StagingArea* area, std::unique_ptr<char[]> bytes, int64_t size);
  ~StagedBuffer();
  StagedBuffer(StagedBuffer&& other) noexcept { *this = std::move(other); }
  StagedBuffer& operator=(StagedBuffer&& other) noexcept;

  bool allocated() const { return bytes_ != nullptr; }
  char* data() { return bytes_.get(); }
  const char* data() const { return bytes_.get(); }
  int64_t size() const { return size_; }

 private:
  StagingArea* area_ = nullptr;
  std::unique_ptr<char[]> bytes_;
  int64_t size_ = 0;
};

struct StagedTensor {
  std::string name;
  int dtype = 0;
  Shape shape;
  Box box;
  StagedBuffer bytes;
  bool has_layout = false;                  // saved with a DTensor layout...
  std::vector<std::string> sharding_specs;  // ...these specs over the trainer's mesh
};

// All tensors one trainer staged for one step, and where its devices sit.
struct TrainerPayload {
  int trainer_id = 0;
  std::string mesh;  // DTensor mesh string; empty when the trainer sent boxes only
  std::vector<int64_t> device_ids;
  std::vector<StagedTensor> tensors;
};

class StagingArea {
 public:
  // RESOURCE_EXHAUSTED when the memory cannot be had, instead of throwing.
  absl::StatusOr<StagedBuffer> Allocate(int64_t size);
  int64_t bytes_staged() const { return bytes_staged_.load(); }

 private:
  friend class StagedBuffer;
  std::atomic<int64_t> bytes_staged_{0};
};

}  // namespace ckptd

#endif  // CKPTD_DAEMON_STAGING_STAGING_AREA_H_
