// Which committed steps a restore may read, and from where: the checkpoint root
// first, then the drain. Pure over the two stores; thread-safe as they are.
#ifndef CKPTD_DAEMON_RESTORE_RESTORE_SOURCES_H_
#define CKPTD_DAEMON_RESTORE_RESTORE_SOURCES_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/store/checkpoint_store.h"

namespace ckptd {

// A step a restore may read, and where: the checkpoint root or the drain.
struct RestoreSource {
  int64_t step = 0;
  const CheckpointStore* store = nullptr;
  bool drained = false;
};

// What a restore tries, in order: `step` (or the newest, and with `fallback` every
// older one), each from `root` first and then from each of `copies` (the drain:
// StorageTiers::CopiesBeyondRoot). NOT_FOUND
// when neither holds a committed step; DATA_LOSS naming what is missing when the step
// asked for, or without `fallback` the newest step, was lost (CheckpointStore::
// MarkLost); with `fallback`, *note says which lost steps it passed.
absl::StatusOr<std::vector<RestoreSource>> RestoreSources(const CheckpointStore& root,
                                                          const std::vector<const CheckpointStore*>& copies,
                                                          const std::string& run, std::optional<int64_t> step,
                                                          bool fallback, std::string* note);

}  // namespace ckptd

#endif  // CKPTD_DAEMON_RESTORE_RESTORE_SOURCES_H_
