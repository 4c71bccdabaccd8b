#include "daemon/bundle/checkpoint_meta.h"

#include <nlohmann/json.hpp>
#include <string_view>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "daemon/base/status.h"

namespace ckptd {

namespace {

// `object[key]` as dims; empty when absent. A value that is not an array of integers
// throws nlohmann's type_error, as json::value() does for a field of the wrong type.
Shape DimsField(const nlohmann::json& object, const char* key) {
  Shape dims;
  const auto it = object.find(key);
  if (it == object.end()) return dims;
  for (const nlohmann::json& v : it->get_ref<const nlohmann::json::array_t&>())
    dims.push_back(v.get<int64_t>());
  return dims;
}

// Writes JSON exactly as nlohmann::json::dump(1) writes the same document (keys in
// sorted order, one space per level), straight into one string: building the
// document first costs several allocations per tensor, which at 100,000 tensors
// was the largest part of a commit. The caller emits keys in sorted order.
class JsonWriter {
 public:
  std::string Take() { return std::move(out_); }
  void BeginObject() { Open('{'); }
  void EndObject() { Close('}'); }
  void BeginArray() { Open('['); }
  void EndArray() { Close(']'); }
  void Key(std::string_view key) {
    Element();
    String(key);
    out_ += ": ";
    after_key_ = true;
  }
  void Value(std::string_view s) {
    Element();
    String(s);
  }
  void Value(int64_t v) {
    Element();
    absl::StrAppend(&out_, v);
  }
  void Value(double v) {
    Element();
    out_ += nlohmann::json(v).dump();  // its shortest round-trip form, as before
  }
  // Any container of integers: a std::vector or a Shape.
  template <typename Ints>
  void Array(const Ints& values) {
    BeginArray();
    for (const auto& v : values) Value(static_cast<int64_t>(v));
    EndArray();
  }
  // A key and its value: a string, a number, or a vector of integers.
  void Field(std::string_view key, std::string_view v) {
    Key(key);
    Value(v);
  }
  void Field(std::string_view key, int64_t v) {
    Key(key);
    Value(v);
  }
  void Field(std::string_view key, double v) {
    Key(key);
    Value(v);
  }
  template <typename T>
  void Field(std::string_view key, const std::vector<T>& values) {
    Key(key);
    Array(values);
  }
  void Field(std::string_view key, const Shape& values) {
    Key(key);
    Array(values);
  }

 private:
  // Before any value or key: a separator and the indent, unless it follows a key.
  void Element() {
    if (after_key_) {
      after_key_ = false;
      return;
    }
    if (depth_.empty()) return;
    out_ += depth_.back() ? ",\n" : "\n";
    depth_.back() = true;
    out_.append(depth_.size(), ' ');
  }
  void Open(char c) {
    Element();
    out_ += c;
    depth_.push_back(false);
  }
  void Close(char c) {
    const bool any = depth_.back();
    depth_.pop_back();
    if (any) {
      out_ += '\n';
      out_.append(depth_.size(), ' ');
    }
    out_ += c;
  }
  void String(std::string_view s) {
    const bool plain =
        absl::c_all_of(s, [](char c) { return c >= 0x20 && c < 0x7f && c != '"' && c != '\\'; });
    if (!plain) {
      out_ += nlohmann::json(std::string(s)).dump();  // escapes and UTF-8 checks as before
      return;
    }
    out_ += '"';
    out_ += s;
    out_ += '"';
  }

  std::string out_;
  std::vector<bool> depth_;  // per open container: whether it has an element yet
  bool after_key_ = false;
};

}  // namespace

std::string CheckpointMeta::ToJson() const {
  JsonWriter w;
  w.BeginObject();
  w.Field("bytes_per_host", bytes_per_host);
  w.Field("created_unix", created_unix);
  w.Field("format", format);
  w.Key("hosts");
  w.BeginArray();
  for (const Host& h : hosts) {
    w.BeginObject();
    w.Field("bytes", h.bytes);
    w.Field("copies", h.copies);
    w.Field("file", h.file);
    w.Field("host", h.host);
    if (!h.parity_file.empty()) {
      w.Field("parity_bytes", h.parity_bytes);
      w.Field("parity_crc32c", int64_t{h.parity_crc32c});
      w.Field("parity_file", h.parity_file);
    }
    w.Field("rank", int64_t{h.rank});
    w.Field("write_seconds", h.write_seconds);
    w.EndObject();
  }
  w.EndArray();
  if (!imported_from.empty()) w.Field("imported_from", imported_from);
  w.Field("mesh", mesh);
  w.Field("num_hosts", int64_t{num_hosts});
  if (parity.parity > 0) {
    w.Key("parity");
    w.BeginObject();
    w.Key("groups");
    w.BeginArray();
    for (const ParityGroup& group : parity.groups) {
      w.BeginObject();
      w.Field("members", group.members);
      w.Field("segment_bytes", group.segment_bytes);
      w.EndObject();
    }
    w.EndArray();
    w.Field("parity", int64_t{parity.parity});
    w.EndObject();
  }
  w.Field("run", run);
  w.Field("step", step);
  w.Field("storage", storage);
  w.Key("tensors");
  w.BeginArray();
  for (const Tensor& t : tensors) {
    w.BeginObject();
    w.Key("boxes");
    w.BeginArray();
    for (const PlacedBox& b : t.boxes) {
      w.BeginObject();
      w.Field("length", b.box.length);
      w.Field("start", b.box.start);
      w.Field("writer", int64_t{b.writer});
      w.EndObject();
    }
    w.EndArray();
    w.Field("dtype", t.dtype);
    if (!t.layout.empty()) w.Field("layout", t.layout);
    w.Field("name", t.name);
    w.Field("shape", t.shape);
    w.EndObject();
  }
  w.EndArray();
  w.Key("timings");
  w.BeginObject();
  w.Field("commit_seconds", commit_seconds);
  w.Field("max_write_seconds", max_write_seconds);
  w.EndObject();
  w.Field("trainer_count", int64_t{trainer_count});
  w.Field("version", version);
  w.EndObject();
  return w.Take();
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
                            .copies = h.value("copies", std::vector<int>()),
                            .parity_file = h.value("parity_file", ""),
                            .parity_bytes = h.value("parity_bytes", int64_t{0}),
                            .parity_crc32c = h.value("parity_crc32c", uint32_t{0})});
    }
    if (doc.contains("parity")) {
      const nlohmann::json& parity = doc["parity"];
      meta.parity.parity = parity.value("parity", 0);
      for (const auto& g : parity.value("groups", nlohmann::json::array())) {
        meta.parity.groups.push_back({.members = g.value("members", std::vector<int>()),
                                      .segment_bytes = g.value("segment_bytes", int64_t{0})});
      }
    }
    for (const auto& t : doc.value("tensors", nlohmann::json::array())) {
      Tensor tensor{.name = t.value("name", ""),
                    .dtype = t.value("dtype", ""),
                    .shape = DimsField(t, "shape"),
                    .layout = t.value("layout", "")};
      for (const auto& b : t.value("boxes", nlohmann::json::array())) {
        tensor.boxes.push_back(
            {.box = Box{DimsField(b, "start"), DimsField(b, "length")}, .writer = b.value("writer", 0)});
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

const CheckpointMeta::ParityGroup* CheckpointMeta::ParityGroupOf(int rank) const {
  for (const ParityGroup& group : parity.groups) {
    if (absl::c_linear_search(group.members, rank)) return &group;
  }
  return nullptr;
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
