#include "daemon/staging/staging_area.h"

#include <new>

#include "absl/strings/str_cat.h"

namespace ckptd {

StagedBuffer::StagedBuffer(StagingArea* area, std::unique_ptr<char[]> bytes, int64_t size)
    : area_(area), bytes_(std::move(bytes)), size_(size) {
  area_->bytes_staged_ += size_;
}

absl::StatusOr<StagedBuffer> StagingArea::Allocate(int64_t size) {
  // Not zero-filled: the stream overwrites every byte.
  std::unique_ptr<char[]> bytes(new (std::nothrow) char[size > 0 ? size : 1]);
  if (bytes == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", size, " bytes of staging memory"));
  }
  return StagedBuffer(this, std::move(bytes), size);
}

StagedBuffer::~StagedBuffer() {
  if (area_ != nullptr) area_->bytes_staged_ -= size_;
}

StagedBuffer& StagedBuffer::operator=(StagedBuffer&& other) noexcept {
  if (this != &other) {
    if (area_ != nullptr) area_->bytes_staged_ -= size_;
    area_ = other.area_;
    bytes_ = std::move(other.bytes_);
    size_ = other.size_;
    other.area_ = nullptr;
    other.size_ = 0;
  }
  return *this;
}

}  // namespace ckptd
