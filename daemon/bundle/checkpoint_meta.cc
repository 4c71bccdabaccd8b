#include "daemon/bundle/checkpoint_meta.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "daemon/base/status.h"

namespace ckptd {

std::string CheckpointMeta::ToJson() const {
  nlohmann::json host_list = nlohmann::json::array();
  for (const Host& h : hosts) {
    host_list.push_back({{"rank", h.rank},
                         {"host", h.host},
                         {"file", h.file},
                         {"bytes", h.bytes},
                         {"write_seconds", h.write_seconds},
                         {"copies", h.copies}});
  }
  nlohmann::json tensor_list = nlohmann::json::array();
  for (const Tensor& t : tensors) {
    nlohmann::json boxes = nlohmann::json::array();
    for (const PlacedBox& b : t.boxes) {
      boxes.push_back({{"start", b.box.start}, {"length", b.box.length}, {"writer", b.writer}});
    }
    nlohmann::json tensor = {{"name", t.name}, {"dtype", t.dtype}, {"shape", t.shape}, {"boxes", boxes}};
    if (!t.layout.empty()) tensor["layout"] = t.layout;
    tensor_list.push_back(std::move(tensor));
  }
  nlohmann::json doc = {
      {"format", format},
      {"version", version},
      {"run", run},
      {"step", step},
      {"num_hosts", num_hosts},
      {"storage", storage},
      {"trainer_count", trainer_count},
      {"mesh", mesh},
      {"created_unix", created_unix},
      {"bytes_per_host", bytes_per_host},
      {"hosts", host_list},
      {"tensors", tensor_list},
      {"timings", {{"max_write_seconds", max_write_seconds}, {"commit_seconds", commit_seconds}}},
  };
  if (!imported_from.empty()) doc["imported_from"] = imported_from;
  return doc.dump(1);
}

absl::StatusOr<CheckpointMeta> CheckpointMeta::FromJson(const std::string& text) {
  const nlohmann::json doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_object()) return absl::DataLossError(absl::StrCat(kCheckpointMetaFile, ": not a JSON object"));
  CheckpointMeta meta;
  try {
    meta.format = doc.value("format", "");
    meta.version = doc.value("version", "");
    meta.run = doc.value("run", "");
    meta.step = doc.value("step", int64_t{0});
    meta.num_hosts = doc.value("num_hosts", 0);
    meta.storage = doc.value("storage", "shared");
    meta.trainer_count = doc.value("trainer_count", 0);
    meta.mesh = doc.value("mesh", "");
    meta.created_unix = doc.value("created_unix", int64_t{0});
    meta.bytes_per_host = doc.value("bytes_per_host", std::vector<int64_t>());
    meta.imported_from = doc.value("imported_from", "");
    for (const auto& h : doc.value("hosts", nlohmann::json::array())) {
      meta.hosts.push_back({.rank = h.value("rank", 0),
                            .host = h.value("host", ""),
                            .file = h.value("file", ""),
                            .bytes = h.value("bytes", int64_t{0}),
                            .write_seconds = h.value("write_seconds", 0.0),
                            .copies = h.value("copies", std::vector<int>())});
    }
    for (const auto& t : doc.value("tensors", nlohmann::json::array())) {
      Tensor tensor{.name = t.value("name", ""),
                    .dtype = t.value("dtype", ""),
                    .shape = t.value("shape", Shape()),
                    .layout = t.value("layout", "")};
      for (const auto& b : t.value("boxes", nlohmann::json::array())) {
        tensor.boxes.push_back({.box = Box{b.value("start", Shape()), b.value("length", Shape())},
                                .writer = b.value("writer", 0)});
      }
      meta.tensors.push_back(std::move(tensor));
    }
    if (doc.contains("timings")) {
      meta.max_write_seconds = doc["timings"].value("max_write_seconds", 0.0);
      meta.commit_seconds = doc["timings"].value("commit_seconds", 0.0);
    }
  } catch (const nlohmann::json::exception& e) {
    // nlohmann reports a field of the wrong type by exception; it stops here.
    return absl::DataLossError(absl::StrCat(kCheckpointMetaFile, ": ", e.what()));
  }
  if (meta.format != kCheckpointMetaFormat) {
    return absl::DataLossError(absl::StrCat(kCheckpointMetaFile, ": format '", meta.format, "', expected '",
                                            kCheckpointMetaFormat, "'"));
  }
  return meta;
}

const CheckpointMeta::Host* CheckpointMeta::FindHost(int rank) const {
  for (const Host& h : hosts) {
    if (h.rank == rank) return &h;
  }
  return nullptr;
}

std::string CheckpointMeta::HostOf(int rank) const {
  const Host* h = FindHost(rank);
  return h == nullptr ? std::string() : h->host;
}

absl::StatusOr<CheckpointMeta> ReadCheckpointMeta(FileSystem* fs, const std::string& step_dir) {
  ASSIGN_OR_RETURN(std::string text,
                   fs->ReadFileToString(JoinPath(step_dir, kCheckpointMetaFile), int64_t{1} << 30));
  return CheckpointMeta::FromJson(text);
}

}  // namespace ckptd
