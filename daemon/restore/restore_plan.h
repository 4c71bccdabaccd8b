// Restore, without gRPC or MPI: PlanRestore decides, from a checkpoint's index and
// what a trainer asks for, which boxes of which tensors it gets, in which dtype, how
// many bytes each takes and where each lands in a shared-memory reply; ReadPlan reads
// them (only the byte ranges that intersect, every checksum checked) and converts
// dtypes. The service turns protos into TensorWants and streams what ReadPlan filled.
// Pure functions over a BundleReader, which the caller owns; ReadPlan runs `threads`
// threads of its own and returns when they are done.
#ifndef CKPTD_DAEMON_RESTORE_RESTORE_PLAN_H_
#define CKPTD_DAEMON_RESTORE_RESTORE_PLAN_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/bundle/bundle.h"
#include "daemon/io/read_cache.h"
#include "daemon/layout/box.h"
#include "daemon/layout/mesh.h"

namespace ckptd {

// One tensor a trainer asks for.
struct TensorWant {
  std::string name{};
  int dtype = 0;                                     // 0: as stored
  Shape shape{};                                     // empty: not checked
  std::optional<Box> box{};                          // nullopt: the whole tensor (ignored with a layout)
  std::optional<std::vector<std::string>> layout{};  // sharding specs: one box per device
  // Delivered into memory of its own (device memory, a trainer's host buffer): no
  // room in a shared-memory reply.
  bool outside_reply = false;
};

// One tensor as it will be delivered.
struct RestoreItem {
  TensorInfo info{};                  // as stored
  int dtype = 0;                      // as delivered
  std::vector<Box> boxes{};           // one, or one per device; their bytes are concatenated
  int64_t bytes = 0;                  // of every box, in `dtype`
  int64_t shared_memory_offset = -1;  // in a shared-memory reply; -1 with outside_reply
};

struct RestorePlan {
  std::vector<RestoreItem> items{};  // in request order
  int64_t shared_memory_bytes = 0;   // a shared-memory reply needs this much
};

// Checks every want against the index before anything is allocated (names, dtype
// conversions, shapes, boxes inside the tensor, saved slices covering each box and
// lying inside their data files) and lays the reply out as
// RestoreHeader.shared_memory_offsets documents. INVALID_ARGUMENT naming the field
// (`tensors[i]`), NOT_FOUND for an unknown tensor, DATA_LOSS for an index that lies.
absl::StatusOr<RestorePlan> PlanRestore(BundleReader& reader, const std::vector<TensorWant>& wants,
                                        const Placement& placement);

// The stored bytes ReadPlan will read for `plan`: every saved piece that overlaps a
// requested box, whole (pieces are read whole and checksummed).
std::vector<ReadCache::Range> StoredRanges(const BundleReader& reader, const RestorePlan& plan);

// Reads item i into outputs[i] (items[i].bytes bytes), verifying every checksum read
// and converting dtypes. Boxes are spread over `threads` threads. The first error, if
// any (DATA_LOSS naming tensor, slice and file for a bad checksum).
absl::Status ReadPlan(BundleReader& reader, const RestorePlan& plan, const std::vector<char*>& outputs,
                      int threads);
// The same for items [begin, end) only (outputs still has one entry per item), so a
// caller can send some items while it reads the next ones; an item whose output is
// null is not read (the caller sends its bytes from where they are kept, see
// BundleReader::KeptEntry). One call at a time per reader. If `on_item_read` is set,
// it is called once for each item whose reads all succeeded (checksums verified,
// dtype converted), as soon as the last of them did: from the reading threads, maybe
// several at once, before ReadPlanItems returns; never for an item that failed or was
// not read.
absl::Status ReadPlanItems(BundleReader& reader, const RestorePlan& plan, const std::vector<char*>& outputs,
                           int threads, size_t begin, size_t end,
                           const std::function<void(size_t item)>& on_item_read = nullptr);

// The opaque state trainer `trainer_id` saved (see TrainerStateName), by key.
absl::StatusOr<std::map<std::string, std::string>> ReadTrainerState(BundleReader& reader, int trainer_id);

}  // namespace ckptd

#endif  // CKPTD_DAEMON_RESTORE_RESTORE_PLAN_H_
