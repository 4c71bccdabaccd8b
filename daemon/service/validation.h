// Request validation for the gRPC service: turns wire messages into checked internal
// values, or INVALID_ARGUMENT naming the field. Pure; thread-safe.
#ifndef CKPTD_DAEMON_SERVICE_VALIDATION_H_
#define CKPTD_DAEMON_SERVICE_VALIDATION_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ckptd/v1/ckptd.pb.h"
#include "daemon/bundle/bundle.h"
#include "daemon/layout/box.h"
#include "daemon/layout/mesh.h"
#include "daemon/restore/restore_plan.h"
#include "daemon/staging/device_stager.h"

namespace ckptd {

inline constexpr size_t kMaxRunNameLength = 128;
inline constexpr size_t kMaxTensorNameLength = 4096;
inline constexpr int kMaxRank = 32;

// A run name becomes a directory: 1-128 characters of [A-Za-z0-9._-], not "." or "..".
absl::Status ValidateRunName(const std::string& run);

inline constexpr size_t kMaxStateKeyLength = 256;
// An empty mesh string with no device ids is "no mesh". Otherwise the mesh must parse,
// and device ids must be non-empty, distinct and in the mesh.
absl::StatusOr<Placement> ValidatePlacement(const std::string& mesh,
                                            const google::protobuf::RepeatedField<int64_t>& device_ids);

struct CheckedTensor {
  std::string name;
  int dtype = 0;
  Shape shape;
  // One box without a layout; with one, the box of each device, in device_ids order.
  std::vector<Box> boxes;
  bool has_layout = false;
  std::vector<std::string> sharding_specs;
  int64_t bytes = 0;  // all boxes together
  // Set when the bytes lie in the trainer's device memory (never with a layout).
  std::optional<DeviceMemoryRef> device_memory;
};

// Checks a DeviceMemory message's shape (handle and UUID sizes, offset >= 0).
absl::StatusOr<DeviceMemoryRef> CheckDeviceMemory(const v1::DeviceMemory& memory, const std::string& field);

// The boxes of a tensor with a layout, one per device of `placement`.

// Bytes [address, address + size) of a trainer's address space.
struct AddressRange {
  uint64_t address = 0;
  int64_t size = 0;
};

// A Restore request's tensors as the restore planner takes them, with the device
// memory each is delivered to, if any.
struct RestoreWants {
  std::vector<TensorWant> tensors{};
  std::vector<std::optional<DeviceMemoryRef>> devices{};  // one per tensor
  bool any_on_device = false;
  // Per tensor: the range of one of the trainer's segments its bytes go straight into
  // (TensorRequest.host_memory), checked for sign only.
  std::vector<std::optional<v1::SharedMemory>> host_memory{};
  // Per tensor: ranges of the trainer's own address space its bytes may be written
  // into, in order (TensorRequest.process_memory; empty when none), each checked for
  // sign only; the restorer checks that they add up to the tensor's bytes.
  std::vector<std::vector<AddressRange>> process_memory{};
};
absl::StatusOr<RestoreWants> RestoreWantsFromProto(const v1::RestoreRequest& request);

// Checks every descriptor of a Save header (name, dtype, shape, box, duplicates).
absl::Status ValidateSaveHeader(const v1::SaveHeader& header, const Placement& placement,
                                std::vector<CheckedTensor>* out);

// Box from the wire; an unset box means the whole tensor.
Box BoxFromProto(const v1::Box& proto, const Shape& shape, bool has_box);

}  // namespace ckptd

#endif  // CKPTD_DAEMON_SERVICE_VALIDATION_H_
