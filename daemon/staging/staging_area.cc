#include "daemon/staging/staging_area.h"

#include <algorithm>
#include <new>

#include "absl/strings/str_cat.h"

namespace ckptd {

// The constructor adopts bytes StagingArea::Allocate already counted.
StagedBuffer::StagedBuffer(StagingArea* area, std::unique_ptr<char[]> bytes, int64_t size)
    : area_(area), bytes_(std::move(bytes)), size_(size) {}

absl::StatusOr<StagedBuffer> StagingArea::Allocate(int64_t size, absl::Time deadline) {
  if (size > limit_) {
    return absl::ResourceExhaustedError(absl::StrCat(size, " bytes can never fit in staging.memory_limit (", limit_,
                                                     " bytes)"));
  }
  {
    std::unique_lock<std::mutex> lock(mu_);
    while (bytes_staged_ + size > limit_) {
      if (absl::Now() >= deadline ||
          freed_.wait_until(lock, absl::ToChronoTime(deadline)) == std::cv_status::timeout) {
        if (bytes_staged_ + size <= limit_) break;
        return absl::ResourceExhaustedError(absl::StrCat("staging memory is full (", bytes_staged_, " of ", limit_,
                                                         " bytes staged); ", size, " more did not fit in time"));
      }
    }
    bytes_staged_ += size;
    peak_ = std::max(peak_, bytes_staged_);
  }
  // Not zero-filled: the stream overwrites every byte.
  std::unique_ptr<char[]> bytes(new (std::nothrow) char[size > 0 ? size : 1]);
  if (bytes == nullptr) {
    Release(size);
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", size, " bytes of staging memory"));
  }
  return StagedBuffer(this, std::move(bytes), size);
}

int64_t StagingArea::bytes_staged() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_staged_;
}

int64_t StagingArea::peak_bytes_staged() const {
  std::lock_guard<std::mutex> lock(mu_);
  return peak_;
}

void StagingArea::Release(int64_t size) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    bytes_staged_ -= size;
  }
  freed_.notify_all();
}

StagedBuffer::~StagedBuffer() {
  if (area_ != nullptr) area_->Release(size_);
}

StagedBuffer& StagedBuffer::operator=(StagedBuffer&& other) noexcept {
  if (this != &other) {
    if (area_ != nullptr) area_->Release(size_);
    area_ = other.area_;
    bytes_ = std::move(other.bytes_);
    size_ = other.size_;
    other.area_ = nullptr;
    other.size_ = 0;
  }
  return *this;
}

}  // namespace ckptd
