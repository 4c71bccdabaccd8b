#include "daemon/coord/drain_schedule.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/base/status.h"

namespace ckptd {

void DrainSchedule::OnStart() {
  if (options_.rank != 0) return;
  // Resumes what a stop or crash left undrained: each run's newest committed step.
  absl::StatusOr<std::vector<std::string>> runs = options_.source->ListRuns();
  if (runs.ok()) runs_.insert(runs->begin(), runs->end());
  // A crash between a drained step's rename and its state file leaves the state
  // file behind; bring it up to date (temp directories stay: they may resume).
  for (const std::string& run : options_.drain->ListRuns().value_or(std::vector<std::string>())) {
    if (absl::Status s = options_.drain->WriteStateFile(run); !s.ok()) {
      spdlog::warn("drain {}: run '{}': {}", options_.drain->root(), run, std::string(s.message()));
    }
  }
}

void DrainSchedule::AddToRound(internal::RoundState* mine) {
  *mine->mutable_drain_order() = order_;
  const Drainer::Progress p = options_.drainer->Poll();
  internal::DrainProgress* progress = mine->mutable_drain();
  progress->set_seq(p.seq);
  progress->set_done(p.done);
  if (p.done && !p.status.ok()) progress->set_failure(OnRank(p.status, options_.rank).ToString());
  progress->set_bytes(p.bytes);
  progress->set_seconds(p.seconds);
}

bool DrainSchedule::OnRound(const std::vector<internal::RoundState>& all,
                            const std::set<StepKey>& restoring) {
  Drainer& drainer = *options_.drainer;
  bool worked = false;
  const internal::DrainOrder& order = all.front().drain_order();  // rank 0's
  seen_ = order;
  const Drainer::Progress mine = drainer.Poll();
  if (order.seq() == 0 || mine.seq != order.seq()) {
    // A copy for an order rank 0 gave up stops; a new order starts once it has.
    if (mine.running) {
      drainer.Cancel();
    } else if (order.seq() != 0) {
      worked = drainer.Start({.seq = order.seq(),
                              .run = order.run(),
                              .step = order.step(),
                              .id = order.id(),
                              .rank = options_.rank,
                              .num_ranks = options_.num_ranks});
    }
  }
  if (options_.rank != 0) return worked;
  if (order_.seq() != 0) {
    int done = 0;
    std::string failure;
    for (const internal::RoundState& state : all) {
      const internal::DrainProgress& p = state.drain();
      if (p.seq() != order_.seq() || !p.done()) continue;
      ++done;
      if (!p.failure().empty() && failure.empty()) failure = p.failure();
    }
    if (!failure.empty()) {
      spdlog::warn("drain of run '{}' step {} to {} failed (a later step will be drained): {}", order_.run(),
                   order_.step(), options_.drain->root(), failure);
      order_.Clear();
      worked = true;
    } else if (done == options_.num_ranks) {
      Publish(all, restoring);
      worked = true;
    }
  }
  if (order_.seq() == 0 && !runs_.empty()) NextOrder();
  return worked;
}

void DrainSchedule::Protect(const std::string& run, std::set<int64_t>* steps) const {
  // The step being drained stays until the drain has it.
  if (seen_.seq() != 0 && seen_.run() == run) steps->insert(seen_.step());
}

void DrainSchedule::OnConcluded(const StepOutcome& outcome) {
  if (outcome.status.ok() && options_.rank == 0) runs_.insert(outcome.key.run);
}

void DrainSchedule::NextOrder() {
  while (order_.seq() == 0 && !runs_.empty()) {
    const std::string run = *runs_.begin();
    runs_.erase(runs_.begin());
    absl::StatusOr<std::optional<int64_t>> step =
        NextStepToDrain(*options_.source, *options_.drain, run, options_.every_n_steps);
    absl::StatusOr<std::string> id = step.ok() && step->has_value() ? CommitId(*options_.source, run, **step)
                                                                    : absl::StatusOr<std::string>("");
    if (!step.ok() || !id.ok()) {
      spdlog::warn("drain of run '{}': {}", run,
                   std::string((step.ok() ? id.status() : step.status()).message()));
      continue;
    }
    if (!step->has_value()) continue;
    order_.set_seq(++seq_);
    order_.set_run(run);
    order_.set_step(**step);
    order_.set_id(*id);
    spdlog::debug("drain: ordered run '{}' step {} (commit {})", run, **step, *id);
  }
}

void DrainSchedule::Publish(const std::vector<internal::RoundState>& all,
                            const std::set<StepKey>& restoring) {
  const internal::DrainOrder order = order_;
  order_.Clear();
  std::set<int64_t> protect;
  for (const StepKey& r : restoring) {
    if (r.run == order.run()) protect.insert(r.step);
  }
  const DrainJob job{.seq = order.seq(), .run = order.run(), .step = order.step(), .id = order.id()};
  absl::StatusOr<std::vector<int64_t>> removed =
      PublishDrained(*options_.drain, job, options_.keep_last, protect);
  if (!removed.ok()) {
    spdlog::error("drain of run '{}' step {} to {}: {}", order.run(), order.step(), options_.drain->root(),
                  std::string(removed.status().message()));
    return;
  }
  int64_t bytes = 0;
  double seconds = 0;
  for (const internal::RoundState& state : all) {
    bytes += state.drain().bytes();
    seconds = std::max(seconds, state.drain().seconds());
  }
  spdlog::info("run '{}' step {} drained to {}: {} bytes copied in {:.2f} s ({:.0f} MB/s){}", order.run(),
               order.step(), options_.drain->StepDir(order.run(), order.step()), bytes, seconds,
               seconds > 0 ? static_cast<double>(bytes) / seconds / 1e6 : 0.0,
               removed->empty()
                   ? ""
                   : absl::StrCat("; drain retention removed step(s) ", absl::StrJoin(*removed, ",")));
}

}  // namespace ckptd
