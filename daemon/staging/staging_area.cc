#include "daemon/staging/staging_area.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "daemon/io/direct_io_memory.h"
#include "daemon/staging/device_stager.h"

namespace ckptd {
namespace {

constexpr size_t kAlignment = 4096;  // O_DIRECT writes straight from staging memory
// Most memory the pool keeps when the budget is unlimited.
constexpr int64_t kMaxPoolWithoutLimit = int64_t{8} << 30;

int64_t RoundUp(int64_t n) { return (n + kAlignment - 1) / kAlignment * kAlignment; }

// Buffers of this size or more start on a huge-page boundary and ask for transparent
// huge pages, where the kernel offers them on request: O_DIRECT reads into them (a
// restore's, on its way to the trainer) and writes from them then use them in place in
// whole requests, instead of copying through the file layer's huge-page slots (memory
// in 4 KiB pages scattered across physical memory makes small disk requests).
constexpr size_t kHugePage = size_t{2} << 20;

bool TransparentHugePagesOnRequest() {
  static const bool on = [] {
    std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
    std::string modes;
    std::getline(in, modes);
    return modes.find("[always]") != std::string::npos || modes.find("[madvise]") != std::string::npos;
  }();
  return on;
}

}  // namespace

void FreeDeleter::operator()(char* p) const {
  internal::ReleasePinnedBeforeFree(p);
  direct_io_memory::Remove(p);  // a no-op for a buffer never registered
  std::free(p);
}

StagedBuffer& StagedBuffer::operator=(StagedBuffer&& other) noexcept {
  if (this != &other) {
    Reset();
    area_ = other.area_;
    data_ = other.data_;
    size_ = other.size_;
    owned_ = std::move(other.owned_);
    capacity_ = other.capacity_;
    borrowed_ = std::move(other.borrowed_);
    other.area_ = nullptr;
    other.data_ = nullptr;
    other.size_ = 0;
    other.capacity_ = 0;
  }
  return *this;
}

void StagedBuffer::Reset() {
  borrowed_.reset();
  if (area_ != nullptr) area_->Release(size_, std::move(owned_), capacity_);
  area_ = nullptr;
  data_ = nullptr;
  size_ = 0;
  capacity_ = 0;
}

StagingArea::~StagingArea() = default;

absl::Status StagingArea::Reserve(int64_t size, absl::Time deadline) {
  if (size > limit_) {
    return absl::ResourceExhaustedError(
        absl::StrCat(size, " bytes can never fit in staging.memory_limit (", limit_, " bytes)"));
  }
  // Kept memory (the memory tier) gives way to new saves before anyone waits.
  while (reclaim_) {
    {
      absl::MutexLock lock(&mu_);
      if (bytes_staged_ + size <= limit_) break;
    }
    if (!reclaim_()) break;
  }
  absl::MutexLock lock(&mu_);
  // absl::Mutex re-checks the condition whenever the lock is released (Release frees
  // staging memory under it), so no explicit notification is needed.
  auto fits = [this, size]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return bytes_staged_ + size <= limit_; };
  if (!mu_.AwaitWithDeadline(absl::Condition(&fits), deadline)) {
    return absl::ResourceExhaustedError(absl::StrCat("staging memory is full (", bytes_staged_, " of ",
                                                     limit_, " bytes staged); ", size,
                                                     " more did not fit in time"));
  }
  bytes_staged_ += size;
  peak_ = std::max(peak_, bytes_staged_);
  return absl::OkStatus();
}

absl::StatusOr<StagedBuffer> StagingArea::Allocate(int64_t size, absl::Time deadline) {
  if (absl::Status s = Reserve(size, deadline); !s.ok()) return s;
  StagedBuffer buffer;
  buffer.area_ = this;
  buffer.size_ = size;
  const int64_t wanted = RoundUp(std::max<int64_t>(size, 1));
  {
    absl::MutexLock lock(&mu_);
    // Reuse a pooled buffer that fits without wasting more than a quarter of it.
    auto it = pool_.lower_bound(wanted);
    if (it != pool_.end() && it->first - wanted <= it->first / 4) {
      buffer.capacity_ = it->first;
      buffer.owned_ = std::move(it->second);
      pooled_bytes_ -= it->first;
      pool_.erase(it);
    } else {
      // Staged plus pooled memory stays under the budget: drop pooled buffers, the
      // largest first, until the new one fits beside them.
      const int64_t cap = limit_ == INT64_MAX ? kMaxPoolWithoutLimit : limit_;
      while (!pool_.empty() && bytes_staged_ + pooled_bytes_ + wanted > cap) {
        auto largest = std::prev(pool_.end());
        pooled_bytes_ -= largest->first;
        pool_.erase(largest);
      }
    }
  }
  if (buffer.owned_ == nullptr) {
    void* p = nullptr;
    const bool huge = static_cast<size_t>(wanted) >= kHugePage && TransparentHugePagesOnRequest();
    if (posix_memalign(&p, huge ? kHugePage : kAlignment, static_cast<size_t>(wanted)) != 0) {
      buffer.size_ = 0;
      buffer.area_ = nullptr;
      Release(size, nullptr, 0);
      return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", size, " bytes of staging memory"));
    }
    if (huge && ::madvise(p, static_cast<size_t>(wanted), MADV_HUGEPAGE) == 0) {
      direct_io_memory::Add(p, static_cast<size_t>(wanted));
    }
    buffer.owned_.reset(static_cast<char*>(p));
    buffer.capacity_ = wanted;
  }
  buffer.data_ = buffer.owned_.get();
  return buffer;
}

absl::StatusOr<StagedBuffer> StagingArea::Borrow(char* data, int64_t size, std::shared_ptr<void> keepalive,
                                                 absl::Time deadline) {
  if (absl::Status s = Reserve(size, deadline); !s.ok()) return s;
  StagedBuffer buffer;
  buffer.area_ = this;
  buffer.size_ = size;
  buffer.data_ = data;
  buffer.borrowed_ = std::move(keepalive);
  return buffer;
}

int64_t StagingArea::bytes_staged() const {
  absl::MutexLock lock(&mu_);
  return bytes_staged_;
}

int64_t StagingArea::peak_bytes_staged() const {
  absl::MutexLock lock(&mu_);
  return peak_;
}

int64_t StagingArea::pooled_bytes() const {
  absl::MutexLock lock(&mu_);
  return pooled_bytes_;
}

void StagingArea::Release(int64_t size, AlignedBytes pooled, int64_t capacity) {
  {
    absl::MutexLock lock(&mu_);
    bytes_staged_ -= size;
    const int64_t cap = limit_ == INT64_MAX ? kMaxPoolWithoutLimit : limit_;
    if (pooled != nullptr && bytes_staged_ + pooled_bytes_ + capacity <= cap) {
      pooled_bytes_ += capacity;
      pool_.emplace(capacity, std::move(pooled));
    }
  }
}

size_t StagedTensorCount(const std::vector<TrainerPayload>& payloads) {
  size_t count = 0;
  for (const TrainerPayload& p : payloads) count += p.tensors.size();
  return count;
}

}  // namespace ckptd
