#include "daemon/staging/staging_area.h"

namespace ckptd {

StagedBuffer::StagedBuffer(StagingArea* area, int64_t size)
    : area_(area), bytes_(new char[size > 0 ? size : 1]), size_(size) {
  area_->bytes_staged_ += size_;
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
