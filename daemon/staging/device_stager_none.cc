// The DeviceStager of a build without CUDA: refuses every copy.
#include "daemon/staging/device_stager.h"

namespace ckptd {
namespace {

class NoDeviceStager : public DeviceStager {
 public:
  absl::Status Available() const override {
    return absl::UnimplementedError(
        "device_memory: this ckptd was built without CUDA (CKPTD_WITH_CUDA); send host memory instead");
  }
  std::string Describe() const override { return "built without CUDA"; }
  Totals CopyTotals() const override { return {}; }
  absl::Status CopyToHost(const DeviceMemoryRef&, StagedBuffer&) override { return Available(); }
  absl::Status CopyToDevice(StagedBuffer&, const DeviceMemoryRef&) override { return Available(); }
};

}  // namespace

std::unique_ptr<DeviceStager> DeviceStager::Create() { return std::make_unique<NoDeviceStager>(); }

namespace internal {
void ReleasePinnedBeforeFree(char*) {}
}  // namespace internal

}  // namespace ckptd
