#include "daemon/plan/save_plan.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/base/dtype.h"
#include "daemon/base/status.h"
#include "daemon/layout/mesh.h"

namespace ckptd {
namespace {

std::string ShapeString(const Shape& shape) { return absl::StrCat("[", absl::StrJoin(shape, ","), "]"); }

}  // namespace

absl::StatusOr<std::string> CheckMeshCoverage(const std::vector<TrainerDevices>& trainers) {
  const TrainerDevices* first = nullptr;
  for (const TrainerDevices& t : trainers) {
    if (!t.mesh.empty()) first = &t;
  }
  if (first == nullptr) return std::string();
  ASSIGN_OR_RETURN(Mesh mesh, ParseMesh(first->mesh));
  std::map<int64_t, int> holder;  // device -> trainer
  for (const TrainerDevices& t : trainers) {
    if (t.mesh.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("trainer ", t.trainer, " (host ", t.host,
                                                     ") declared no mesh but trainer ", first->trainer,
                                                     " declared ", mesh.Identity()));
    }
    ASSIGN_OR_RETURN(Mesh other, ParseMesh(t.mesh));
    if (other.Identity() != mesh.Identity()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "hosts disagree on the mesh: trainer ", first->trainer, " (host ", first->host, ") declared ",
          mesh.Identity(), " but trainer ", t.trainer, " (host ", t.host, ") declared ", other.Identity()));
    }
    for (int64_t d : t.device_ids) {
      auto [it, inserted] = holder.emplace(d, t.trainer);
      if (!inserted) {
        return absl::InvalidArgumentError(
            absl::StrCat("device ", d, " is claimed by trainers ", it->second, " and ", t.trainer));
      }
    }
  }
  std::vector<int64_t> missing;
  for (int64_t d : mesh.global_device_ids) {
    if (holder.count(d) == 0) missing.push_back(d);
  }
  if (!missing.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("devices ", absl::StrJoin(missing, ","), " of mesh ",
                                                   mesh.Identity(), " belong to no trainer"));
  }
  // Recorded without the per-host local parts.
  mesh.local_device_ids.clear();
  mesh.local_devices.clear();
  return mesh.ToString();
}

absl::StatusOr<SavePlan> MakeSavePlan(const std::vector<ShardRef>& shards, int num_hosts) {
  std::map<int, int> host_of_trainer;
  for (const ShardRef& s : shards) {
    auto [it, inserted] = host_of_trainer.emplace(s.trainer, s.host);
    if (!inserted && it->second != s.host) {
      return absl::InvalidArgumentError(
          absl::StrCat("trainer id ", s.trainer, " is used on hosts ", it->second, " and ", s.host));
    }
  }

  // name -> (box -> holder hosts); first shard seen fixes dtype and shape.
  struct Pending {
    const ShardRef* first = nullptr;
    const ShardRef* layout = nullptr;  // first shard saved with a layout
    std::map<Box, std::set<int>> holders;
    std::map<Box, int64_t> staged_bytes;
  };
  std::map<std::string, Pending> by_name;
  for (const ShardRef& s : shards) {
    Pending& p = by_name[s.name];
    if (p.first == nullptr) {
      p.first = &s;
    } else if (p.first->dtype != s.dtype) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", s.name, "': dtype ", DataTypeName(p.first->dtype), " on trainer ",
                       p.first->trainer, " but ", DataTypeName(s.dtype), " on trainer ", s.trainer));
    } else if (p.first->shape != s.shape) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", s.name, "': shape ", ShapeString(p.first->shape), " on trainer ",
                       p.first->trainer, " but ", ShapeString(s.shape), " on trainer ", s.trainer));
    }
    if (absl::Status st = CheckBoxInShape(s.box, s.shape); !st.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", s.name, "': ", st.message()));
    }
    if (s.has_layout && p.layout == nullptr) p.layout = &s;
    p.holders[s.box].insert(s.host);
    p.staged_bytes[s.box] = s.bytes;
  }

  SavePlan plan;
  plan.bytes_per_host.assign(num_hosts, 0);
  struct Assignment {
    int64_t bytes;
    size_t tensor;
    size_t box;
  };
  std::vector<Assignment> order;
  for (auto& [name, pending] : by_name) {
    PlannedTensor t;
    t.name = name;
    t.dtype = pending.first->dtype;
    t.shape = pending.first->shape;
    t.has_layout = pending.layout != nullptr;
    if (t.has_layout) t.sharding_specs = pending.layout->sharding_specs;
    std::vector<Box> distinct;
    for (const auto& [box, hosts] : pending.holders) distinct.push_back(box);
    RETURN_IF_ERROR(CheckTiling(distinct, t.shape, absl::StrCat("tensor '", name, "'")));
    const int64_t element_size = static_cast<int64_t>(DataTypeSize(t.dtype));
    for (const Box& box : distinct) {
      PlannedBox pb;
      pb.box = box;
      pb.bytes = element_size > 0 ? box.NumElements() * element_size : pending.staged_bytes[box];
      order.push_back({pb.bytes, plan.tensors.size(), t.boxes.size()});
      t.boxes.push_back(std::move(pb));
    }
    plan.tensors.push_back(std::move(t));
  }

  // Largest boxes first, each to the least-loaded host that holds a copy: the classic
  // greedy bound keeps the busiest host within one box of the mean when replicas allow.
  std::stable_sort(order.begin(), order.end(),
                   [](const Assignment& a, const Assignment& b) { return a.bytes > b.bytes; });
  for (const Assignment& a : order) {
    PlannedTensor& t = plan.tensors[a.tensor];
    PlannedBox& pb = t.boxes[a.box];
    const std::set<int>& hosts = by_name[t.name].holders[pb.box];
    int best = *hosts.begin();
    for (int h : hosts) {
      if (plan.bytes_per_host[h] < plan.bytes_per_host[best]) best = h;
    }
    pb.writer = best;
    plan.bytes_per_host[best] += pb.bytes;
  }
  return plan;
}

}  // namespace ckptd
