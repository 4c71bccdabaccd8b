// CommitObserver: commit-time work that depends on how the daemon stores steps
// (keeping them in memory, counting them for /metrics, ...) hangs off the commit as
// observers registered once at start-up (Coordinator::AddObserver), instead of
// branches inside the commit's phases. The commit itself writes, votes and publishes
// the same way whoever watches.
//
// Every method is called on the coordinator thread, in registration order; an
// observer must not block on I/O of its own for long (the other ranks wait in the
// next collective) and must outlive the coordinator's Run.
#ifndef CKPTD_DAEMON_COORD_COMMIT_OBSERVER_H_
#define CKPTD_DAEMON_COORD_COMMIT_OBSERVER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "daemon/coord/step_registry.h"
#include "daemon/staging/staging_area.h"

namespace ckptd {

// One box this rank wrote into its data file: where, with what checksum, and the
// staged buffer it was written from (the observer may take the buffer).
struct WrittenBox {
  std::string_view tensor{};
  int dtype = 0;
  int64_t elements = 0;
  uint64_t offset = 0;    // in the data file
  uint32_t crc32c = 0;    // masked, as the index stores it
  StagedBuffer* bytes{};  // the staged buffer: still holding the bytes, see TakesWrittenBuffers
};

// How a step ended on this rank.
struct StepOutcome {
  StepKey key{};
  // OK: committed on every rank. Otherwise why it failed, the same on every rank.
  absl::Status status{};
  int64_t bytes_written = 0;  // this rank's data file (0 when it wrote none)
  absl::Duration took{};      // since the commit began (0 when it never began)
  std::string data_file{};    // this rank's data file of the published step ("" when failed)
};

class CommitObserver {
 public:
  virtual ~CommitObserver() = default;
  // Whether this observer takes the staged buffers the data file is written from:
  // then the write keeps every box's buffer until OnWritten, instead of freeing each
  // as soon as it is on disk.
  virtual bool TakesWrittenBuffers() const { return false; }
  // This rank's data file of `key` is written and synced (the step is not committed
  // yet): its boxes, in file order.
  virtual void OnWritten(const StepKey& key, absl::Span<const WrittenBox> boxes) {}
  // A phase of a commit ended: plan (the descriptors gathered and the plan made), then
  // prepare, write, replicate, merge, publish and confirm, each with its vote.
  virtual void OnPhase(const char* phase, absl::Duration took) {}
  // Every rank agreed on how `outcome.key` ended, or it failed before its commit
  // began; its trainers are told next.
  virtual void OnConcluded(const StepOutcome& outcome) {}
  // Retention removed these steps of `run` from this rank's root.
  virtual void OnRemoved(const std::string& run, const std::vector<int64_t>& steps) {}
};

}  // namespace ckptd

#endif  // CKPTD_DAEMON_COORD_COMMIT_OBSERVER_H_
