// CommitMetrics: counts commits and failures and times commits and their phases for
// /metrics (ckptd_commits_total, ckptd_bytes_written_total, ckptd_commit_seconds,
// ckptd_commit_phase_seconds, ckptd_step_failures_total). A CommitObserver,
// registered when metrics are kept; coordinator thread only (Metrics is thread-safe).
#ifndef CKPTD_DAEMON_COORD_COMMIT_METRICS_H_
#define CKPTD_DAEMON_COORD_COMMIT_METRICS_H_

#include "daemon/base/metrics.h"
#include "daemon/coord/commit_observer.h"

namespace ckptd {

class CommitMetrics final : public CommitObserver {
 public:
  explicit CommitMetrics(Metrics* metrics) : metrics_(metrics) {}
  void OnPhase(const char* phase, absl::Duration took) override;
  void OnConcluded(const StepOutcome& outcome) override;

 private:
  Metrics* metrics_;
};

}  // namespace ckptd

#endif  // CKPTD_DAEMON_COORD_COMMIT_METRICS_H_
