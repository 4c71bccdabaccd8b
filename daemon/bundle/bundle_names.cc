// The names and small codecs of the TF bundle format: file and piece names, the
// TensorSliceProto and TensorShapeProto conversions, and TF's `checkpoint` state
// file. Pure functions; see bundle.h.
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "daemon/base/status.h"
#include "daemon/bundle/bundle.h"

namespace ckptd {

std::string IndexPath(const std::string& prefix) { return prefix + ".index"; }

std::string TrainerStateName(int trainer_id, const std::string& key) {
  return absl::StrCat(kTrainerStatePrefix, trainer_id, "/", key);
}

std::string PieceLabel(const std::string& name, const Box& box, const Shape& shape, bool sliced) {
  if (!sliced) return absl::StrCat("'", name, "'");
  return absl::StrCat("'", name, "' slice ", box.ToSliceString(shape));
}

namespace {

// "<prefix>.<kind>-NNNNN-of-MMMMM", the names of a step's per-rank files.
std::string NumberedPath(const std::string& prefix, const char* kind, int number, int count) {
  char suffix[64];
  std::snprintf(suffix, sizeof(suffix), ".%s-%05d-of-%05d", kind, number, count);
  return prefix + suffix;
}

// The inverse, for a file of the step's own prefix "ckpt", by exact name.
bool ParseNumberedName(const std::string& path, const char* kind, int* number, int* count) {
  const std::string base = path.substr(path.rfind('/') + 1);
  const std::string format = absl::StrCat("ckpt.", kind, "-%5d-of-%5d%c");
  char tail = 0;
  return std::sscanf(base.c_str(), format.c_str(), number, count, &tail) == 2 &&
         base == NumberedPath("ckpt", kind, *number, *count);
}

}  // namespace

std::string DataPath(const std::string& prefix, int shard, int num_shards) {
  return NumberedPath(prefix, "data", shard, num_shards);
}

bool ParseDataFileName(const std::string& path, int* shard, int* num_shards) {
  return ParseNumberedName(path, "data", shard, num_shards);
}

std::string ParityPath(const std::string& prefix, int rank, int num_ranks) {
  return NumberedPath(prefix, "parity", rank, num_ranks);
}

bool ParseParityFileName(const std::string& path, int* rank, int* num_ranks) {
  return ParseNumberedName(path, "parity", rank, num_ranks);
}

tf::TensorSliceProto BoxToSliceProto(const Box& box, const Shape& shape) {
  tf::TensorSliceProto proto;
  for (size_t d = 0; d < box.rank(); ++d) {
    tf::TensorSliceProto::Extent* e = proto.add_extent();
    if (!(box.start[d] == 0 && d < shape.size() && box.length[d] == shape[d])) {
      e->set_start(box.start[d]);
      e->set_length(box.length[d]);
    }
  }
  return proto;
}

Box SliceProtoToBox(const tf::TensorSliceProto& slice, const Shape& shape) {
  Box box;
  for (int d = 0; d < slice.extent_size(); ++d) {
    const auto& e = slice.extent(d);
    const int64_t dim = d < static_cast<int>(shape.size()) ? shape[d] : 0;
    if (e.has_length_case() == tf::TensorSliceProto::Extent::kLength) {
      box.start.push_back(e.start());
      box.length.push_back(e.length());
    } else {
      box.start.push_back(0);
      box.length.push_back(dim);
    }
  }
  return box;
}

Shape ShapeFromProto(const tf::TensorShapeProto& proto) {
  Shape shape;
  for (const auto& dim : proto.dim()) shape.push_back(dim.size());
  return shape;
}

tf::TensorShapeProto ShapeToProto(const Shape& shape) {
  tf::TensorShapeProto proto;
  for (int64_t d : shape) proto.add_dim()->set_size(d);
  return proto;
}

absl::StatusOr<CheckpointState> ParseCheckpointState(const std::string& text) {
  CheckpointState state;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipWhitespace())) {
    line = absl::StripAsciiWhitespace(line);
    size_t colon = line.find(':');
    if (colon == absl::string_view::npos) {
      return absl::DataLossError(absl::StrCat("checkpoint state: bad line '", line, "'"));
    }
    absl::string_view field = absl::StripAsciiWhitespace(line.substr(0, colon));
    absl::string_view value = absl::StripAsciiWhitespace(line.substr(colon + 1));
    if (value.size() < 2 || value.front() != '"' || value.back() != '"') {
      if (field == "last_preserved_timestamp" || field == "all_model_checkpoint_timestamps") continue;
      return absl::DataLossError(absl::StrCat("checkpoint state: value of ", field, " is not a string"));
    }
    std::string unquoted(value.substr(1, value.size() - 2));
    if (field == "model_checkpoint_path") {
      state.model_checkpoint_path = unquoted;
    } else if (field == "all_model_checkpoint_paths") {
      state.all_model_checkpoint_paths.push_back(unquoted);
    }
  }
  if (state.model_checkpoint_path.empty()) {
    return absl::DataLossError("checkpoint state: no model_checkpoint_path");
  }
  return state;
}

std::string FormatCheckpointState(const CheckpointState& state) {
  std::string out = absl::StrCat("model_checkpoint_path: \"", state.model_checkpoint_path, "\"\n");
  for (const std::string& path : state.all_model_checkpoint_paths) {
    absl::StrAppend(&out, "all_model_checkpoint_paths: \"", path, "\"\n");
  }
  return out;
}

}  // namespace ckptd
