// libFuzzer harness: request validation. The bytes are a SaveHeader as it arrives on
// the wire; validation must return a Status and never accept a box outside its shape.
#include <google/protobuf/stubs/logging.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "daemon/service/validation.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);  // invalid UTF-8 is expected here, and noisy
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ckptd::v1::SaveHeader header;
  if (!header.ParseFromArray(data, static_cast<int>(size))) return 0;
  auto placement = ckptd::ValidatePlacement(header.mesh(), header.device_ids());
  if (!placement.ok()) return 0;
  std::vector<ckptd::CheckedTensor> tensors;
  if (!ckptd::ValidateSaveHeader(header, *placement, &tensors).ok()) return 0;
  for (const ckptd::CheckedTensor& t : tensors) {
    for (const ckptd::Box& box : t.boxes) {
      if (!ckptd::CheckBoxInShape(box, t.shape).ok() || t.bytes < 0) std::abort();
    }
  }
  return 0;
}
