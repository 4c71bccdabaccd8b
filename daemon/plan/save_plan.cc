#include "daemon/plan/save_plan.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/types/span.h"
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

namespace {

// A box to give a writer: its bytes, where it is in the plan, and the shards of that
// box in the sorted shards (who holds a copy).
struct Assignment {
  int64_t bytes;
  size_t tensor;
  size_t box;
  size_t holders_begin, holders_end;
};

// The shards of one tensor agree with `first` (the first received, lowest address) on
// dtype and shape, and each box lies in the shape; *layout: the first saved with a
// layout, which gives the sharding specs (null if none).
absl::Status CheckShardsAgree(absl::Span<const ShardRef* const> shards, const ShardRef& first,
                              const ShardRef** layout) {
  for (const ShardRef* shard : shards) {
    const ShardRef& s = *shard;
    if (first.dtype != s.dtype) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", s.name, "': dtype ", DataTypeName(first.dtype), " on trainer ",
                       first.trainer, " but ", DataTypeName(s.dtype), " on trainer ", s.trainer));
    }
    if (first.shape != s.shape) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", s.name, "': shape ", ShapeString(first.shape), " on trainer ",
                       first.trainer, " but ", ShapeString(s.shape), " on trainer ", s.trainer));
    }
    if (absl::Status st = CheckBoxInShape(s.box, s.shape); !st.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", s.name, "': ", st.message()));
    }
    if (s.has_layout && (*layout == nullptr || &s < *layout)) *layout = &s;
  }
  return absl::OkStatus();
}

// Largest boxes first, each to the least-loaded host that holds a copy (the lowest
// rank among equals): the classic greedy bound keeps the busiest host within one box
// of the mean when replicas allow.
void AssignWriters(const std::vector<const ShardRef*>& sorted, std::vector<Assignment>& order,
                   SavePlan* plan) {
  std::stable_sort(order.begin(), order.end(),
                   [](const Assignment& a, const Assignment& b) { return a.bytes > b.bytes; });
  for (const Assignment& a : order) {
    PlannedBox& pb = plan->tensors[a.tensor].boxes[a.box];
    int best = sorted[a.holders_begin]->host;
    for (size_t k = a.holders_begin; k < a.holders_end; ++k) {
      const int h = sorted[k]->host;
      if (std::make_pair(plan->bytes_per_host[h], h) < std::make_pair(plan->bytes_per_host[best], best))
        best = h;
    }
    pb.writer = best;
    plan->bytes_per_host[best] += pb.bytes;
  }
}

}  // namespace

absl::StatusOr<SavePlan> MakeSavePlan(const std::vector<ShardRef>& shards, int num_hosts) {
  std::map<int, int> host_of_trainer;
  for (const ShardRef& s : shards) {
    auto [it, inserted] = host_of_trainer.emplace(s.trainer, s.host);
    if (!inserted && it->second != s.host) {
      return absl::InvalidArgumentError(
          absl::StrCat("trainer id ", s.trainer, " is used on hosts ", it->second, " and ", s.host));
    }
  }

  // Shards grouped by name, then box, as pointers: no name is copied and no map node
  // made per tensor (at 100,000 tensors, map nodes and their frees were most of this
  // function's cost). The stable sort keeps trainers' order within one box.
  std::vector<const ShardRef*> sorted;
  sorted.reserve(shards.size());
  for (const ShardRef& s : shards) sorted.push_back(&s);
  std::stable_sort(sorted.begin(), sorted.end(), [](const ShardRef* a, const ShardRef* b) {
    const int c = a->name.compare(b->name);
    return c != 0 ? c < 0 : a->box < b->box;
  });

  SavePlan plan;
  plan.bytes_per_host.assign(num_hosts, 0);
  std::vector<Assignment> order;
  // Sized up front: growing them by doubling moved every tensor already planned (into
  // newly faulted memory) about twice over.
  size_t names = 0;
  for (size_t k = 0; k < sorted.size(); ++k) names += k == 0 || sorted[k]->name != sorted[k - 1]->name;
  plan.tensors.reserve(names);
  order.reserve(sorted.size());  // at most one box per shard
  for (size_t begin = 0, end = 0; begin < sorted.size(); begin = end) {
    while (end < sorted.size() && sorted[end]->name == sorted[begin]->name) ++end;
    const ShardRef* first = *std::min_element(sorted.begin() + begin, sorted.begin() + end);
    const ShardRef* layout = nullptr;
    RETURN_IF_ERROR(
        CheckShardsAgree(absl::MakeConstSpan(sorted).subspan(begin, end - begin), *first, &layout));
    PlannedTensor t;
    t.name = first->name;
    t.dtype = first->dtype;
    t.shape = first->shape;
    t.has_layout = layout != nullptr;
    if (t.has_layout) t.sharding_specs = layout->sharding_specs;
    std::vector<Box> distinct;
    std::vector<std::pair<size_t, size_t>> holders;  // per distinct box, its range in `sorted`
    for (size_t k = begin; k < end; ++k) {
      if (distinct.empty() || !(distinct.back() == sorted[k]->box)) {
        distinct.push_back(sorted[k]->box);
        holders.emplace_back(k, k);
      }
      holders.back().second = k + 1;
    }
    RETURN_IF_ERROR(CheckTiling(distinct, t.shape, absl::StrCat("tensor '", t.name, "'")));
    const int64_t element_size = static_cast<int64_t>(DataTypeSize(t.dtype));
    for (size_t b = 0; b < distinct.size(); ++b) {
      PlannedBox pb;
      pb.box = distinct[b];
      // Variable-size types: the bytes the last trainer to send this box staged.
      pb.bytes =
          element_size > 0 ? pb.box.NumElements() * element_size : sorted[holders[b].second - 1]->bytes;
      order.push_back({pb.bytes, plan.tensors.size(), t.boxes.size(), holders[b].first, holders[b].second});
      t.boxes.push_back(std::move(pb));
    }
    plan.tensors.push_back(std::move(t));
  }

  AssignWriters(sorted, order, &plan);
  return plan;
}

}  // namespace ckptd
