#include "daemon/coord/commit_metrics.h"

namespace ckptd {

void CommitMetrics::OnPhase(const char* phase, absl::Duration took) {
  metrics_->Observe("ckptd_commit_phase_seconds", {{"phase", phase}}, absl::ToDoubleSeconds(took));
}

void CommitMetrics::OnConcluded(const StepOutcome& outcome) {
  const StepKey& key = outcome.key;
  if (!outcome.status.ok()) {
    metrics_->Count("ckptd_step_failures_total",
                    {{"run", key.run}, {"code", absl::StatusCodeToString(outcome.status.code())}});
    return;
  }
  const Metrics::Labels run = {{"run", key.run}};
  metrics_->Count("ckptd_commits_total", run);
  metrics_->Count("ckptd_bytes_written_total", run, static_cast<double>(outcome.bytes_written));
  metrics_->Observe("ckptd_commit_seconds", run, absl::ToDoubleSeconds(outcome.took));
}

}  // namespace ckptd
