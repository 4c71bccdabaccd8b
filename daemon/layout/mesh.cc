#include "daemon/layout/mesh.h"

#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "daemon/base/status.h"

namespace ckptd {
namespace {

constexpr char kXlaSpmd[] = "use_xla_spmd";

absl::Status Malformed(const std::string& text, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("mesh '", text, "': ", why));
}

absl::StatusOr<std::vector<int64_t>> ParseIds(const std::string& text, absl::string_view part,
                                              absl::string_view what) {
  std::vector<int64_t> ids;
  if (part.empty()) return ids;
  std::set<int64_t> seen;
  for (absl::string_view item : absl::StrSplit(part, ',')) {
    int64_t id = 0;
    if (!absl::SimpleAtoi(item, &id) || id < 0) {
      return Malformed(text, absl::StrCat(what, ": '", item, "' is not a non-negative integer"));
    }
    if (!seen.insert(id).second)
      return Malformed(text, absl::StrCat(what, ": device ", id, " appears twice"));
    ids.push_back(id);
  }
  return ids;
}

}  // namespace

int64_t Mesh::size() const {
  int64_t n = 1;
  for (const MeshDim& d : dims) n *= d.size;
  return n;
}

int Mesh::DimIndex(const std::string& dim_name) const {
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i].name == dim_name) return static_cast<int>(i);
  }
  return -1;
}

std::string Mesh::ToString() const {
  std::vector<std::string> dim_strs;
  for (const MeshDim& d : dims) dim_strs.push_back(absl::StrCat(d.name, "=", d.size));
  std::string out =
      absl::StrCat(name, "|", absl::StrJoin(dim_strs, ","), "|", absl::StrJoin(global_device_ids, ","), "|",
                   absl::StrJoin(local_device_ids, ","), "|", absl::StrJoin(local_devices, ","));
  if (!global_devices.empty()) absl::StrAppend(&out, "|", absl::StrJoin(global_devices, ","));
  if (use_xla_spmd) absl::StrAppend(&out, "|", kXlaSpmd);
  return out;
}

std::string Mesh::Identity() const {
  std::vector<std::string> dim_strs;
  for (const MeshDim& d : dims) dim_strs.push_back(absl::StrCat(d.name, "=", d.size));
  return absl::StrCat(name, "|", absl::StrJoin(dim_strs, ","), "|", absl::StrJoin(global_device_ids, ","));
}

absl::StatusOr<std::vector<int64_t>> Mesh::Coordinates(int64_t device_id) const {
  int64_t offset = -1;
  for (size_t i = 0; i < global_device_ids.size(); ++i) {
    if (global_device_ids[i] == device_id) offset = static_cast<int64_t>(i);
  }
  if (offset < 0) {
    return absl::InvalidArgumentError(absl::StrCat("device ", device_id, " is not in mesh ", Identity()));
  }
  std::vector<int64_t> coords(dims.size());
  for (size_t i = dims.size(); i > 0; --i) {
    coords[i - 1] = offset % dims[i - 1].size;
    offset /= dims[i - 1].size;
  }
  return coords;
}

absl::StatusOr<Mesh> ParseMesh(const std::string& text) {
  std::vector<std::string> parts = absl::StrSplit(text, '|');
  if (parts.size() < 5 || parts.size() > 7) {
    return Malformed(text, absl::StrCat("expected 5 to 7 '|'-separated parts (name|dims|global ids|local ids|"
                                        "local devices[|global devices][|use_xla_spmd]), found ",
                                        parts.size()));
  }
  Mesh mesh;
  mesh.name = parts[0];
  std::set<std::string> dim_names;
  if (!parts[1].empty()) {
    for (absl::string_view dim : absl::StrSplit(parts[1], ',')) {
      std::vector<absl::string_view> kv = absl::StrSplit(dim, '=');
      MeshDim d;
      if (kv.size() != 2 || kv[0].empty() || !absl::SimpleAtoi(kv[1], &d.size) || d.size < 1) {
        return Malformed(text, absl::StrCat("dimension '", dim, "' is not name=size with size >= 1"));
      }
      d.name = std::string(kv[0]);
      if (d.name == kUnsharded || d.name == "scalar" || d.name == "any" || d.name == "match") {
        return Malformed(text, absl::StrCat("'", d.name, "' is reserved and cannot name a mesh dimension"));
      }
      if (!dim_names.insert(d.name).second)
        return Malformed(text, absl::StrCat("dimension '", d.name, "' appears twice"));
      mesh.dims.push_back(std::move(d));
    }
  }
  if (mesh.dims.empty()) return Malformed(text, "no dimensions");
  // Checked one dimension at a time: the product of the sizes as given can overflow.
  constexpr int64_t kMaxDevices = int64_t{1} << 24;
  int64_t devices = 1;
  for (const MeshDim& d : mesh.dims) {
    if (d.size > kMaxDevices || devices * d.size > kMaxDevices)
      return Malformed(text, "more than 2^24 devices");
    devices *= d.size;
  }
  auto global = ParseIds(text, parts[2], "global device ids");
  if (!global.ok()) return global.status();
  mesh.global_device_ids = *global;
  if (static_cast<int64_t>(mesh.global_device_ids.size()) != mesh.size()) {
    return Malformed(text, absl::StrCat(mesh.global_device_ids.size(), " global device ids for a mesh of ",
                                        mesh.size(), " devices"));
  }
  auto local = ParseIds(text, parts[3], "local device ids");
  if (!local.ok()) return local.status();
  mesh.local_device_ids = *local;
  std::set<int64_t> all(mesh.global_device_ids.begin(), mesh.global_device_ids.end());
  for (int64_t id : mesh.local_device_ids) {
    if (all.count(id) == 0)
      return Malformed(text, absl::StrCat("local device id ", id, " is not a global id"));
  }
  if (!parts[4].empty()) mesh.local_devices = absl::StrSplit(parts[4], ',');
  if (mesh.local_devices.size() != mesh.local_device_ids.size()) {
    return Malformed(text, absl::StrCat(mesh.local_device_ids.size(), " local device ids but ",
                                        mesh.local_devices.size(), " local devices"));
  }
  for (size_t i = 5; i < parts.size(); ++i) {
    if (parts[i] == kXlaSpmd) {
      mesh.use_xla_spmd = true;
    } else if (i == 5 && !parts[i].empty()) {
      mesh.global_devices = absl::StrSplit(parts[i], ',');
      if (static_cast<int64_t>(mesh.global_devices.size()) != mesh.size()) {
        return Malformed(
            text, absl::StrCat(mesh.global_devices.size(), " global devices for a mesh of ", mesh.size()));
      }
    } else if (!parts[i].empty()) {
      return Malformed(text, absl::StrCat("unexpected part '", parts[i], "'"));
    }
  }
  return mesh;
}

absl::StatusOr<Layout> MakeLayout(const std::vector<std::string>& sharding_specs, const Mesh& mesh) {
  std::set<std::string> used;
  for (size_t i = 0; i < sharding_specs.size(); ++i) {
    const std::string& spec = sharding_specs[i];
    if (spec == kUnsharded) continue;
    if (mesh.DimIndex(spec) < 0) {
      return absl::InvalidArgumentError(absl::StrCat("sharding spec ", i, " ('", spec,
                                                     "') is neither 'unsharded' nor a dimension of mesh ",
                                                     mesh.Identity()));
    }
    if (!used.insert(spec).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("mesh dimension '", spec, "' shards two tensor dimensions"));
    }
  }
  return Layout{sharding_specs, mesh};
}

std::string Layout::ToString() const {
  std::string specs;
  for (const std::string& s : sharding_specs) absl::StrAppend(&specs, s, ",");
  return absl::StrCat("sharding_specs:", specs, " mesh:", mesh.ToString());
}

absl::StatusOr<Layout> ParseLayout(const std::string& text) {
  absl::string_view rest = text;
  if (!absl::ConsumePrefix(&rest, "sharding_specs:")) {
    return absl::InvalidArgumentError(absl::StrCat("layout '", text, "': must start with 'sharding_specs:'"));
  }
  const size_t space = rest.find(' ');
  if (space == absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat("layout '", text, "': expected ' mesh:' after the specs"));
  }
  absl::string_view specs_part = rest.substr(0, space);
  absl::string_view mesh_part = rest.substr(space + 1);
  if (!absl::ConsumePrefix(&mesh_part, "mesh:")) {
    return absl::InvalidArgumentError(absl::StrCat("layout '", text, "': expected 'mesh:' after the specs"));
  }
  std::vector<std::string> specs;
  if (!specs_part.empty()) {
    if (!absl::ConsumeSuffix(&specs_part, ",")) {
      return absl::InvalidArgumentError(
          absl::StrCat("layout '", text, "': each sharding spec ends with ','"));
    }
    specs = absl::StrSplit(specs_part, ',');
    for (const std::string& s : specs) {
      if (s.empty())
        return absl::InvalidArgumentError(absl::StrCat("layout '", text, "': empty sharding spec"));
    }
  }
  auto mesh = ParseMesh(std::string(mesh_part));
  if (!mesh.ok()) return mesh.status();
  return MakeLayout(specs, *mesh);
}

absl::StatusOr<Box> Layout::BoxFor(const Shape& shape, int64_t device_id) const {
  if (shape.size() != sharding_specs.size()) {
    return absl::InvalidArgumentError(absl::StrCat("layout has ", sharding_specs.size(),
                                                   " sharding specs for a tensor of rank ", shape.size()));
  }
  auto coords = mesh.Coordinates(device_id);
  if (!coords.ok()) return coords.status();
  Box box = Box::Full(shape);
  for (size_t d = 0; d < shape.size(); ++d) {
    if (sharding_specs[d] == kUnsharded) continue;
    const int dim = mesh.DimIndex(sharding_specs[d]);
    if (dim < 0)
      return absl::InvalidArgumentError(absl::StrCat("unknown mesh dimension '", sharding_specs[d], "'"));
    const int64_t parts = mesh.dims[dim].size;
    if (shape[d] % parts != 0) {
      return absl::InvalidArgumentError(absl::StrCat("tensor dimension ", d, " (size ", shape[d],
                                                     ") does not divide evenly over mesh dimension '",
                                                     sharding_specs[d], "' (size ", parts, ")"));
    }
    box.length[d] = shape[d] / parts;
    box.start[d] = (*coords)[dim] * box.length[d];
  }
  return box;
}

absl::StatusOr<std::vector<Box>> DeviceBoxes(const std::vector<std::string>& sharding_specs,
                                             const Shape& shape, const Placement& placement) {
  if (!placement.mesh.has_value()) return absl::InvalidArgumentError("layout: the request declares no mesh");
  ASSIGN_OR_RETURN(Layout layout, MakeLayout(sharding_specs, *placement.mesh));
  std::vector<Box> boxes;
  for (int64_t device : placement.device_ids) {
    ASSIGN_OR_RETURN(Box box, layout.BoxFor(shape, device));
    boxes.push_back(std::move(box));
  }
  return boxes;
}

}  // namespace ckptd
