#include "daemon/service/save_payload.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "ckptd/v1/wire.h"
#include "daemon/base/dtype.h"
#include "daemon/base/status.h"
#include "daemon/bundle/bundle.h"
#include "daemon/layout/cast.h"

namespace ckptd {

SavePayloadBuilder::SavePayloadBuilder(StagingArea* staging, DeviceStager* device,
                                       const std::vector<CheckedTensor>& tensors, absl::Time deadline)
    : staging_(staging), device_(device), tensors_(tensors), deadline_(deadline) {
  segments_.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const CheckedTensor& t = tensors[i];
    if (t.device_memory.has_value()) {
      device_segments_.push_back({.tensor = i, .box = t.boxes[0], .bytes = t.bytes});
      continue;
    }
    // The handler has bounded the declared total (limits.max_request_bytes); saturate
    // all the same rather than overflow.
    host_bytes_ = t.bytes > INT64_MAX - host_bytes_ ? INT64_MAX : host_bytes_ + t.bytes;
    const int64_t element_size = static_cast<int64_t>(DataTypeSize(t.dtype));
    for (const Box& box : t.boxes) {
      segments_.push_back({.tensor = i, .box = box, .bytes = box.NumElements() * element_size});
    }
  }
}

absl::Status SavePayloadBuilder::BorrowFrom(const std::shared_ptr<SharedSegment>& mapped) {
  int64_t position = 0;
  for (Segment& seg : segments_) {
    ASSIGN_OR_RETURN(seg.buffer, staging_->Borrow(mapped->data() + position, seg.bytes, mapped, deadline_));
    position += seg.bytes;
  }
  return absl::OkStatus();
}

absl::Status SavePayloadBuilder::AddChunk(const std::string& data) {
  if (data.size() > wire::kSaveChunkBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("data: chunk of ", data.size(), " bytes exceeds ", wire::kSaveChunkBytes));
  }
  if (static_cast<int64_t>(data.size()) > host_bytes_ - received_) {
    return absl::InvalidArgumentError(absl::StrCat("data: more bytes than the descriptors need (",
                                                   host_bytes_, " = box elements x dtype size, summed)"));
  }
  received_ += static_cast<int64_t>(data.size());
  size_t used = 0;
  while (used < data.size()) {
    while (filled_ == segments_[current_].bytes) {
      ++current_;
      filled_ = 0;
    }
    Segment& seg = segments_[current_];
    if (!seg.buffer.allocated()) {
      ASSIGN_OR_RETURN(seg.buffer, staging_->Allocate(seg.bytes, deadline_));
    }
    const size_t n = std::min<size_t>(data.size() - used, static_cast<size_t>(seg.bytes - filled_));
    std::memcpy(seg.buffer.data() + filled_, data.data() + used, n);
    filled_ += static_cast<int64_t>(n);
    used += n;
  }
  return absl::OkStatus();
}

absl::Status SavePayloadBuilder::EndOfStream() const {
  if (received_ == host_bytes_) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("data: received ", received_,
                                                 " bytes but the descriptors need ", host_bytes_,
                                                 " (box elements x dtype size, summed)"));
}

absl::Status SavePayloadBuilder::CopyFromDevice() {
  for (Segment& seg : device_segments_) {
    ASSIGN_OR_RETURN(seg.buffer, staging_->Allocate(seg.bytes, deadline_));
    const CheckedTensor& t = tensors_[seg.tensor];
    if (absl::Status s = device_->CopyToHost(*t.device_memory, seg.buffer); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("tensor '", t.name, "': ", s.message()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<TrainerPayload> SavePayloadBuilder::Build(const v1::SaveHeader& header,
                                                         const Placement& placement) {
  for (Segment& seg : device_segments_) segments_.push_back(std::move(seg));
  device_segments_.clear();
  TrainerPayload payload;
  payload.trainer_id = header.trainer_id();
  payload.mesh = header.mesh();
  payload.device_ids = placement.device_ids;
  payload.tensors.reserve(segments_.size() + static_cast<size_t>(header.trainer_state_size()));
  // Devices of one trainer holding the same box of a tensor with a layout: staged
  // once. A tensor without a layout has one box, so only those with several are
  // looked up (no set node per tensor of a 100,000-tensor save).
  std::set<std::pair<size_t, Box>> seen;
  for (Segment& seg : segments_) {
    if (tensors_[seg.tensor].boxes.size() > 1 && !seen.insert({seg.tensor, seg.box}).second) continue;
    if (!seg.buffer.allocated()) {  // an empty box received no chunk
      ASSIGN_OR_RETURN(seg.buffer, staging_->Allocate(0));
    }
    const CheckedTensor& t = tensors_[seg.tensor];
    StagedTensor staged{.name = t.name,
                        .dtype = t.dtype,
                        .shape = t.shape,
                        .box = seg.box,
                        .bytes = std::move(seg.buffer),
                        .has_layout = t.has_layout,
                        .sharding_specs = t.sharding_specs};
    if (header.store_float32_as_bfloat16() && staged.dtype == kFloat) {
      const size_t count = static_cast<size_t>(staged.box.NumElements());
      ASSIGN_OR_RETURN(StagedBuffer narrow, staging_->Allocate(static_cast<int64_t>(count * 2), deadline_));
      RETURN_IF_ERROR(ConvertElements(kFloat, staged.bytes.data(), kBfloat16, narrow.data(), count));
      staged.bytes = std::move(narrow);
      staged.dtype = kBfloat16;
    }
    payload.tensors.push_back(std::move(staged));
  }
  for (const auto& [key, value] : header.trainer_state()) {
    const std::string encoded = EncodeStringScalar(value);
    ASSIGN_OR_RETURN(StagedBuffer buffer,
                     staging_->Allocate(static_cast<int64_t>(encoded.size()), deadline_));
    std::memcpy(buffer.data(), encoded.data(), encoded.size());
    payload.tensors.push_back(
        {.name = TrainerStateName(header.trainer_id(), key), .dtype = kString, .bytes = std::move(buffer)});
  }
  return payload;
}

absl::StatusOr<int64_t> CheckSaveSize(const std::vector<CheckedTensor>& tensors, int64_t max_request_bytes,
                                      int64_t staging_limit) {
  int64_t declared = 0;
  for (const CheckedTensor& t : tensors) {
    declared = t.bytes > INT64_MAX - declared ? INT64_MAX : declared + t.bytes;
  }
  if (declared > max_request_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "tensors: ", declared, " declared bytes exceed limits.max_request_bytes (", max_request_bytes, ")"));
  }
  if (declared > staging_limit) {
    return absl::ResourceExhaustedError(
        absl::StrCat("tensors: ", declared, " declared bytes can never fit in staging.memory_limit (",
                     staging_limit, ")"));
  }
  return declared;
}

}  // namespace ckptd
