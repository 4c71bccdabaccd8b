// DTensor's mesh and layout model: a mesh is named dimensions over global device ids;
// a layout gives each tensor dimension a mesh dimension or "unsharded". Parses and
// prints DTensor's string forms and maps (layout, shape, device) to the device's box.
// Pure value code; thread-safe.
#ifndef CKPTD_DAEMON_LAYOUT_MESH_H_
#define CKPTD_DAEMON_LAYOUT_MESH_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/layout/box.h"

namespace ckptd {

inline constexpr char kUnsharded[] = "unsharded";

struct MeshDim {
  std::string name;
  int64_t size = 0;
  friend bool operator==(const MeshDim& a, const MeshDim& b) { return a.name == b.name && a.size == b.size; }
};

struct Mesh {
  std::string name;
  std::vector<MeshDim> dims;
  std::vector<int64_t> global_device_ids;  // row-major over dims, last dim fastest
  std::vector<int64_t> local_device_ids;
  std::vector<std::string> local_devices;
  std::vector<std::string> global_devices;
  bool use_xla_spmd = false;

  int64_t size() const;  // product of dim sizes
  // DTensor's form: name|x=2,y=4|global ids|local ids|local devices[|global devices][|use_xla_spmd]
  std::string ToString() const;
  // What every host must agree on: name, dims and global ids (local parts differ per host).
  std::string Identity() const;
  // Coordinates of a global device id along each mesh dimension.
  absl::StatusOr<std::vector<int64_t>> Coordinates(int64_t device_id) const;
  // Index of a dimension by name, or -1.
  int DimIndex(const std::string& dim_name) const;
};

// INVALID_ARGUMENT describing what is malformed: part count, a dimension that is not
// name=size, a non-numeric or repeated id, ids not matching the mesh size...
absl::StatusOr<Mesh> ParseMesh(const std::string& text);

struct Layout {
  std::vector<std::string> sharding_specs;  // per tensor dimension
  Mesh mesh;

  // DTensor's form: "sharding_specs:x,unsharded, mesh:<mesh>".
  std::string ToString() const;
  // The box `device_id` holds of a tensor of `shape`. INVALID_ARGUMENT if the rank
  // differs, or a dimension is not divisible by its mesh dimension (naming both).
  absl::StatusOr<Box> BoxFor(const Shape& shape, int64_t device_id) const;
};

absl::StatusOr<Layout> ParseLayout(const std::string& text);
// Checks specs against a mesh: each names a mesh dimension or "unsharded", and no mesh
// dimension shards two tensor dimensions.
absl::StatusOr<Layout> MakeLayout(const std::vector<std::string>& sharding_specs, const Mesh& mesh);

// A request's placement: its mesh (if any) and the trainer's devices on it.
struct Placement {
  std::optional<Mesh> mesh{};
  std::vector<int64_t> device_ids{};
};

// The box each device of `placement` holds of a tensor of `shape` laid out by
// `sharding_specs`, in device_ids order. INVALID_ARGUMENT without a mesh.
absl::StatusOr<std::vector<Box>> DeviceBoxes(const std::vector<std::string>& sharding_specs,
                                             const Shape& shape, const Placement& placement);

}  // namespace ckptd

#endif  // CKPTD_DAEMON_LAYOUT_MESH_H_
