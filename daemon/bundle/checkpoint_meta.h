// CheckpointMeta: ckptd.json, what ckptd records beside a TensorFlow checkpoint (the
// mesh, each tensor's layout and boxes with their writers, the hosts and their files,
// timings). Written by the coordinator at merge, read by ckptctl; the schema is in
// docs/format.md. A plain value type; ToJson/FromJson are pure.
#ifndef CKPTD_DAEMON_BUNDLE_CHECKPOINT_META_H_
#define CKPTD_DAEMON_BUNDLE_CHECKPOINT_META_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/io/file_system.h"
#include "daemon/layout/box.h"

namespace ckptd {

inline constexpr char kCheckpointMetaFile[] = "ckptd.json";
inline constexpr char kCheckpointMetaFormat[] = "ckptd/1";

struct CheckpointMeta {
  struct Host {
    int rank = 0;
    std::string host{};  // the machine's host name ("" in files written before it was recorded)
    std::string file{};  // its data file, relative to the step directory
    int64_t bytes = 0;
    double write_seconds = 0;
    std::vector<int> copies{};  // ranks that also hold this data file (config replicas)
    // With parity: this rank's parity file (its group's parity chunks it holds, one
    // per stripe, in StripeLayout::HeldParity order), its size and crc32c (unmasked).
    std::string parity_file{};
    int64_t parity_bytes = 0;
    uint32_t parity_crc32c = 0;
  };
  // Erasure-coded parity across hosts (config redundancy: parity); parity == 0: none.
  // A group's members are saving ranks, ascending; its stripes follow
  // StripeLayout(members, parity) over segments of segment_bytes, and data files shorter
  // than K segments count as padded with zeros.
  struct ParityGroup {
    std::vector<int> members{};
    int64_t segment_bytes = 0;
  };
  struct Parity {
    int parity = 0;
    std::vector<ParityGroup> groups{};
  };
  struct PlacedBox {
    Box box{};
    int writer = 0;  // the rank whose data file holds it
  };
  struct Tensor {
    std::string name{};
    std::string dtype{};  // TF's lower-case name
    Shape shape{};
    std::vector<PlacedBox> boxes{};
    std::string layout{};  // DTensor layout string; empty when saved with boxes
  };

  std::string format = kCheckpointMetaFormat;
  std::string version{};
  std::string run{};
  int64_t step = 0;
  int num_hosts = 0;
  // "shared": every data file lies in the one step directory. "local": each host's
  // step directory holds its own data file only (and copies of the index and this).
  std::string storage = "shared";
  int trainer_count = 0;
  std::string mesh{};
  int64_t created_unix = 0;
  std::vector<int64_t> bytes_per_host{};
  std::vector<Host> hosts{};
  Parity parity{};
  std::vector<Tensor> tensors{};
  double max_write_seconds = 0;
  double commit_seconds = 0;
  // Set by `ckptctl import` (what the step was made from); empty for a saved step.
  std::string imported_from{};

  // The host name of saving rank `rank`; "" when unrecorded (older files) or unknown.
  std::string HostOf(int rank) const;
  // The entry of saving rank `rank`, or null.
  const Host* FindHost(int rank) const;
  // With parity: the group that saving rank `rank` is in, or null.
  const ParityGroup* ParityGroupOf(int rank) const;

  // Indented JSON text.
  std::string ToJson() const;
  // DATA_LOSS naming what is wrong for text that is not such a document; fields it
  // does not know are ignored (a newer writer may add some).
  static absl::StatusOr<CheckpointMeta> FromJson(const std::string& text);
};

// Reads and parses the ckptd.json in `step_dir` (NOT_FOUND when there is none,
// DATA_LOSS when it is not one).
absl::StatusOr<CheckpointMeta> ReadCheckpointMeta(FileSystem* fs, const std::string& step_dir);

}  // namespace ckptd

#endif  // CKPTD_DAEMON_BUNDLE_CHECKPOINT_META_H_
