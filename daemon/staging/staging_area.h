// Host-memory staging: where a trainer's bytes live between Save and the write of
// its step. Every staged byte counts against one budget (staging.memory_limit).
//
// Buffers come from a pool: a freed buffer keeps its pages and is handed to the next
// request of a similar size, because the first touch of fresh memory runs at a
// fraction of memcpy speed (page faults) and checkpoints repeat the same sizes.
// Pooled memory that is not staged is dropped whenever a new allocation needs its
// room under the budget. A buffer can also borrow memory it does not own (a trainer's
// shared-memory segment), kept alive by a shared_ptr.
//
// StagingArea is thread-safe; a StagedBuffer belongs to one owner at a time
// (handler, then registry, then writer). Buffers are 4 KiB-aligned so that O_DIRECT
// writes can come straight from them; those of 2 MiB or more are 2 MiB-aligned in
// transparent huge pages (where the kernel offers them on request) and registered
// with DirectIoMemory, so that O_DIRECT reads into them and writes from them go in
// place, in whole requests.
#ifndef CKPTD_DAEMON_STAGING_STAGING_AREA_H_
#define CKPTD_DAEMON_STAGING_STAGING_AREA_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/layout/box.h"

namespace ckptd {

class StagingArea;

// Aligned heap memory, freed with free().
struct FreeDeleter {
  void operator()(char* p) const;
};
using AlignedBytes = std::unique_ptr<char, FreeDeleter>;

// One buffer of staged bytes; gives its bytes back to the area when destroyed.
class StagedBuffer {
 public:
  StagedBuffer() = default;
  ~StagedBuffer() { Reset(); }
  StagedBuffer(StagedBuffer&& other) noexcept { *this = std::move(other); }
  StagedBuffer& operator=(StagedBuffer&& other) noexcept;

  bool allocated() const { return data_ != nullptr; }
  char* data() { return data_; }
  const char* data() const { return data_; }
  int64_t size() const { return size_; }
  // Bytes owned behind data() (a multiple of 4 KiB); 0 for borrowed memory.
  int64_t capacity() const { return capacity_; }
  // True when the bytes live in a trainer's shared-memory segment.
  bool borrowed() const { return borrowed_ != nullptr; }

 private:
  friend class StagingArea;
  void Reset();

  StagingArea* area_ = nullptr;
  char* data_ = nullptr;
  int64_t size_ = 0;
  AlignedBytes owned_;  // pooled memory, returned to the area's pool
  int64_t capacity_ = 0;
  std::shared_ptr<void> borrowed_;  // keeps borrowed memory mapped
};

struct StagedTensor {
  std::string name{};
  int dtype = 0;
  Shape shape{};
  Box box{};
  StagedBuffer bytes{};
  bool has_layout = false;                    // saved with a DTensor layout...
  std::vector<std::string> sharding_specs{};  // ...these specs over the trainer's mesh
};

// All tensors one trainer staged for one step, and where its devices sit.
struct TrainerPayload {
  int trainer_id = 0;
  std::string mesh;  // DTensor mesh string; empty when the trainer sent boxes only
  std::vector<int64_t> device_ids;
  std::vector<StagedTensor> tensors;
};

// How many tensors `payloads` staged, replicas included.
size_t StagedTensorCount(const std::vector<TrainerPayload>& payloads);

class StagingArea {
 public:
  explicit StagingArea(int64_t limit = INT64_MAX) : limit_(limit) {}
  ~StagingArea();

  // Waits until `size` more bytes fit under the limit (until `deadline`), then hands
  // out a buffer of that size, from the pool when one fits. RESOURCE_EXHAUSTED if
  // they never can fit, the deadline passes, or the memory cannot be had.
  absl::StatusOr<StagedBuffer> Allocate(int64_t size, absl::Time deadline = absl::InfinitePast());
  // As Allocate, but the bytes live at `data`, kept alive by `keepalive`; they still
  // count against the budget while staged.
  absl::StatusOr<StagedBuffer> Borrow(char* data, int64_t size, std::shared_ptr<void> keepalive,
                                      absl::Time deadline = absl::InfinitePast());

  int64_t bytes_staged() const;
  int64_t peak_bytes_staged() const;
  int64_t pooled_bytes() const;  // freed buffers kept for reuse
  int64_t limit() const { return limit_; }
  // Called, outside any lock, when an allocation does not fit under the limit: it
  // frees what it can (the memory tier's oldest step) and returns whether it freed
  // anything. Set once, before the area is shared between threads.
  void SetReclaimer(std::function<bool()> reclaim) { reclaim_ = std::move(reclaim); }

 private:
  friend class StagedBuffer;
  absl::Status Reserve(int64_t size, absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);
  void Release(int64_t size, AlignedBytes pooled, int64_t capacity) ABSL_LOCKS_EXCLUDED(mu_);

  const int64_t limit_;
  std::function<bool()> reclaim_;
  mutable absl::Mutex mu_;
  int64_t bytes_staged_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t peak_ ABSL_GUARDED_BY(mu_) = 0;
  std::multimap<int64_t, AlignedBytes> pool_ ABSL_GUARDED_BY(mu_);  // by capacity
  int64_t pooled_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ckptd

#endif  // CKPTD_DAEMON_STAGING_STAGING_AREA_H_
