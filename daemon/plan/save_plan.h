// The save plan: from every shard that every trainer of the job staged for one step
// (gathered from all hosts), check that each tensor is consistent and tiled exactly,
// drop replicas, and pick one writer host per distinct box, balancing bytes.
// Pure and deterministic. Rank 0 makes it and hands each rank the boxes it writes.
#ifndef CKPTD_DAEMON_PLAN_SAVE_PLAN_H_
#define CKPTD_DAEMON_PLAN_SAVE_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/layout/box.h"

namespace ckptd {

struct ShardRef {
  std::string name;
  int dtype = 0;
  Shape shape;
  Box box;
  int host = 0;       // MPI rank of the daemon holding it
  int trainer = 0;    // trainer id within the job
  int64_t bytes = 0;  // staged bytes (what balancing counts for variable-size types)
  bool has_layout = false;
  std::vector<std::string> sharding_specs;
};

// The devices one trainer declared, for the mesh coverage check.
struct TrainerDevices {
  int trainer = 0;
  int host = 0;
  std::string mesh;  // DTensor mesh string; empty when the trainer used boxes only
  std::vector<int64_t> device_ids;
};

struct PlannedBox {
  Box box;
  int writer = 0;  // host that writes it
  int64_t bytes = 0;
};

struct PlannedTensor {
  std::string name;
  int dtype = 0;
  Shape shape;
  std::vector<PlannedBox> boxes;  // sorted by box
  bool has_layout = false;
  std::vector<std::string> sharding_specs;
};

struct SavePlan {
  std::string mesh;                    // recorded mesh, empty when none was used
  std::vector<PlannedTensor> tensors;  // sorted by name
  std::vector<int64_t> bytes_per_host;
};

// When any trainer declared a mesh: every trainer declared the same mesh (name, dims
// and global ids) and together they hold every device of it exactly once. Returns
// the mesh string to record (empty when no trainer used a mesh).
absl::StatusOr<std::string> CheckMeshCoverage(const std::vector<TrainerDevices>& trainers);

// INVALID_ARGUMENT naming the tensor when dtypes or shapes disagree, boxes overlap or
// leave a gap, or one trainer id appears on two hosts.
absl::StatusOr<SavePlan> MakeSavePlan(const std::vector<ShardRef>& shards, int num_hosts);

}  // namespace ckptd

#endif  // CKPTD_DAEMON_PLAN_SAVE_PLAN_H_
