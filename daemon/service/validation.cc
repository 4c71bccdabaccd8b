#include "daemon/service/validation.h"

#include <set>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "daemon/base/dtype.h"
#include "daemon/base/status.h"
#include "daemon/bundle/bundle.h"

namespace ckptd {

absl::Status ValidateRunName(const std::string& run) {
  // [A-Za-z0-9][A-Za-z0-9._-]{0,127}: a run name becomes one directory name, so no
  // '/', no leading '.' or '-', nothing that could be "." or "..".
  auto alnum = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
  };
  if (run.empty()) return absl::InvalidArgumentError("run: must not be empty");
  if (run.size() > kMaxRunNameLength) {
    return absl::InvalidArgumentError(absl::StrCat("run: longer than ", kMaxRunNameLength, " characters"));
  }
  if (!alnum(run[0])) {
    return absl::InvalidArgumentError(
        "run: must start with a letter or digit ([A-Za-z0-9][A-Za-z0-9._-]{0,127})");
  }
  for (char c : run) {
    if (!alnum(c) && c != '.' && c != '_' && c != '-') {
      return absl::InvalidArgumentError(
          absl::StrCat("run: character 0x", absl::Hex(static_cast<unsigned char>(c)),
                       " is not allowed ([A-Za-z0-9][A-Za-z0-9._-]{0,127}; no '/' or NUL)"));
    }
  }
  return absl::OkStatus();
}

Box BoxFromProto(const v1::Box& proto, const Shape& shape, bool has_box) {
  // Unset, or set with no dimensions: the whole tensor (as the proto says).
  if (!has_box || (proto.start().empty() && proto.length().empty())) return Box::Full(shape);
  return Box{{proto.start().begin(), proto.start().end()}, {proto.length().begin(), proto.length().end()}};
}

absl::StatusOr<Placement> ValidatePlacement(const std::string& mesh,
                                            const google::protobuf::RepeatedField<int64_t>& device_ids) {
  Placement placement;
  if (mesh.empty()) {
    if (!device_ids.empty()) return absl::InvalidArgumentError("device_ids: given without a mesh");
    return placement;
  }
  auto parsed = ParseMesh(mesh);
  if (!parsed.ok()) return absl::InvalidArgumentError(absl::StrCat("mesh: ", parsed.status().message()));
  if (device_ids.empty())
    return absl::InvalidArgumentError("device_ids: a mesh needs this trainer's device ids");
  std::set<int64_t> seen;
  for (int64_t id : device_ids) {
    if (!seen.insert(id).second)
      return absl::InvalidArgumentError(absl::StrCat("device_ids: ", id, " appears twice"));
    if (!parsed->Coordinates(id).ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("device_ids: ", id, " is not a device of mesh ", parsed->Identity()));
    }
  }
  placement.mesh = std::move(*parsed);
  placement.device_ids.assign(device_ids.begin(), device_ids.end());
  return placement;
}

namespace {

// One descriptor of a Save header, checked (its name against the `names` seen so
// far) and turned into its boxes and byte count; `i` is its index, for messages.
absl::StatusOr<CheckedTensor> CheckTensor(const v1::TensorDescriptor& t, int i, const Placement& placement,
                                          absl::flat_hash_set<absl::string_view>* names) {
  const std::string field = absl::StrCat("tensors[", i, "]");
  if (t.name().empty() || t.name().size() > kMaxTensorNameLength) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".name: must be 1-", kMaxTensorNameLength, " bytes"));
  }
  for (char c : t.name()) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".name: control characters (NUL, newline...) are not allowed"));
    }
  }
  if (absl::StartsWith(t.name(), kReservedNamePrefix)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".name: the prefix '", kReservedNamePrefix, "' is reserved"));
  }
  if (!names->insert(t.name()).second) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".name: '", t.name(), "' appears twice in one request"));
  }
  if (!IsSupportedSaveType(t.dtype())) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".dtype: ", DataTypeName(t.dtype()), " (",
                                                   t.dtype(), ") is not a supported type"));
  }
  if (t.shape_size() > kMaxRank) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".shape: rank ", t.shape_size(), " exceeds ", kMaxRank));
  }
  CheckedTensor c;
  c.name = t.name();
  c.dtype = t.dtype();
  c.shape.assign(t.shape().begin(), t.shape().end());
  int64_t elements = 0;
  if (absl::Status s = CheckShape(c.shape, &elements); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".shape ('", t.name(), "'): ", s.message()));
  }
  if (t.has_layout()) {
    if (t.has_box())
      return absl::InvalidArgumentError(absl::StrCat(field, ": give a box or a layout, not both"));
    c.has_layout = true;
    c.sharding_specs.assign(t.layout().sharding_specs().begin(), t.layout().sharding_specs().end());
    auto boxes = DeviceBoxes(c.sharding_specs, c.shape, placement);
    if (!boxes.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".layout ('", t.name(), "'): ", boxes.status().message()));
    }
    c.boxes = std::move(*boxes);
  } else {
    Box box = BoxFromProto(t.box(), c.shape, t.has_box());
    if (absl::Status s = CheckBoxInShape(box, c.shape); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".box ('", t.name(), "'): ", s.message()));
    }
    c.boxes.push_back(std::move(box));
  }
  if (t.has_device_memory()) {
    if (c.has_layout) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": device_memory with a layout is not supported; ", "send one tensor per device box"));
    }
    ASSIGN_OR_RETURN(c.device_memory, CheckDeviceMemory(t.device_memory(), field + ".device_memory"));
  }
  const int64_t element_size = static_cast<int64_t>(DataTypeSize(c.dtype));
  for (const Box& box : c.boxes) {
    if (box.NumElements() > (INT64_MAX - c.bytes) / element_size) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".box ('", t.name(), "'): too many bytes"));
    }
    c.bytes += box.NumElements() * element_size;
  }
  return c;
}

}  // namespace

absl::Status ValidateSaveHeader(const v1::SaveHeader& header, const Placement& placement,
                                std::vector<CheckedTensor>* out) {
  if (absl::Status s = ValidateRunName(header.run()); !s.ok()) return s;
  if (header.step() < 0)
    return absl::InvalidArgumentError(absl::StrCat("step: ", header.step(), " is negative"));
  if (header.trainer_count() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("trainer_count: ", header.trainer_count(), " must be at least 1"));
  }
  if (header.trainer_id() < 0 || header.trainer_id() >= header.trainer_count()) {
    return absl::InvalidArgumentError(
        absl::StrCat("trainer_id: ", header.trainer_id(), " is outside [0, ", header.trainer_count(), ")"));
  }
  for (const auto& [key, value] : header.trainer_state()) {
    if (key.empty() || key.size() > kMaxStateKeyLength || key.find('\0') != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("trainer_state: key must be 1-", kMaxStateKeyLength, " bytes without NUL"));
    }
  }
  absl::flat_hash_set<absl::string_view> names;  // into the header, which outlives the loop
  names.reserve(static_cast<size_t>(header.tensors_size()));
  out->reserve(out->size() + static_cast<size_t>(header.tensors_size()));
  for (int i = 0; i < header.tensors_size(); ++i) {
    ASSIGN_OR_RETURN(CheckedTensor c, CheckTensor(header.tensors(i), i, placement, &names));
    out->push_back(std::move(c));
  }
  return absl::OkStatus();
}

absl::StatusOr<DeviceMemoryRef> CheckDeviceMemory(const v1::DeviceMemory& memory, const std::string& field) {
  if (memory.ipc_handle().size() != DeviceMemoryRef::kHandleBytes) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".ipc_handle: ", memory.ipc_handle().size(),
                                                   " bytes; a CUDA IPC handle has ",
                                                   DeviceMemoryRef::kHandleBytes));
  }
  if (memory.device_uuid().size() != DeviceMemoryRef::kUuidBytes) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".device_uuid: ", memory.device_uuid().size(),
                                                   " bytes; a CUDA device UUID has ",
                                                   DeviceMemoryRef::kUuidBytes));
  }
  if (memory.offset() < 0) return absl::InvalidArgumentError(absl::StrCat(field, ".offset: negative"));
  return DeviceMemoryRef{memory.ipc_handle(), memory.offset(), memory.device_uuid()};
}

absl::StatusOr<RestoreWants> RestoreWantsFromProto(const v1::RestoreRequest& request) {
  RestoreWants wants;
  const size_t count = static_cast<size_t>(request.tensors_size());
  wants.tensors.reserve(count);
  wants.devices.reserve(count);
  wants.host_memory.reserve(count);
  wants.process_memory.reserve(count);
  for (int i = 0; i < request.tensors_size(); ++i) {
    const v1::TensorRequest& t = request.tensors(i);
    const std::string field = absl::StrCat("tensors[", i, "]");
    TensorWant want{.name = t.name(), .dtype = t.dtype(), .shape = Shape(t.shape().begin(), t.shape().end())};
    if (t.has_layout()) {
      want.layout =
          std::vector<std::string>(t.layout().sharding_specs().begin(), t.layout().sharding_specs().end());
    } else if (t.has_box()) {
      want.box = BoxFromProto(t.box(), {}, true);
      if (want.box->rank() == 0) want.box.reset();  // set but empty: the whole tensor
    }
    std::optional<DeviceMemoryRef> device;
    if (t.has_device_memory()) {
      if (t.has_layout()) {
        return absl::InvalidArgumentError(absl::StrCat(
            field, ": device_memory with a layout is not supported; ", "ask for one tensor per device box"));
      }
      ASSIGN_OR_RETURN(device, CheckDeviceMemory(t.device_memory(), field + ".device_memory"));
      want.outside_reply = true;
      wants.any_on_device = true;
    }
    std::optional<v1::SharedMemory> host;
    if (t.has_host_memory()) {
      const v1::SharedMemory& h = t.host_memory();
      if (t.has_device_memory()) {
        return absl::InvalidArgumentError(absl::StrCat(field, ": host_memory and device_memory both set"));
      }
      if (h.fd() < 0 || h.offset() < 0 || h.size() < 0) {
        return absl::InvalidArgumentError(absl::StrCat(field, ".host_memory: negative fd, offset or size"));
      }
      want.outside_reply = true;
      host = h;
    }
    std::vector<AddressRange> process;
    if (t.process_memory_size() > 0 && (t.has_device_memory() || t.has_host_memory())) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": process_memory with device_memory or host_memory (the bytes go to one place)"));
    }
    for (const v1::MemoryRange& range : t.process_memory()) {
      if (range.size() < 0 || range.address() > UINT64_MAX - static_cast<uint64_t>(range.size())) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ".process_memory: a range with a negative size or past the end of memory"));
      }
      process.push_back({range.address(), range.size()});
    }
    wants.tensors.push_back(std::move(want));
    wants.devices.push_back(std::move(device));
    wants.host_memory.push_back(std::move(host));
    wants.process_memory.push_back(std::move(process));
  }
  return wants;
}

}  // namespace ckptd
