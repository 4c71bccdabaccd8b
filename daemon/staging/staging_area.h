// Host-memory staging: where a trainer's bytes live between Save and the write of
// its step. Buffers are allocated without zero-filling (the stream overwrites them)
// and counted against a budget (staging.memory_limit). StagingArea is thread-safe;
// a StagedTensor belongs to one owner at a time (handler, then registry, then writer).
#ifndef CKPTD_DAEMON_STAGING_STAGING_AREA_H_
#define CKPTD_DAEMON_STAGING_STAGING_AREA_H_

#include <condition_variable>
#include <mutex>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
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
  explicit StagingArea(int64_t limit = INT64_MAX) : limit_(limit) {}

  // Waits until `size` more bytes fit under the limit (until `deadline`), then
  // allocates them. RESOURCE_EXHAUSTED if they never can fit, the deadline passes,
  // or the memory cannot be had (instead of throwing).
  absl::StatusOr<StagedBuffer> Allocate(int64_t size, absl::Time deadline = absl::InfinitePast());
  int64_t bytes_staged() const;
  int64_t peak_bytes_staged() const;
  int64_t limit() const { return limit_; }

 private:
  friend class StagedBuffer;
  void Release(int64_t size);

  const int64_t limit_;
  mutable std::mutex mu_;
  std::condition_variable freed_;
  int64_t bytes_staged_ = 0;
  int64_t peak_ = 0;
};

}  // namespace ckptd

#endif  // CKPTD_DAEMON_STAGING_STAGING_AREA_H_
