#include "daemon/restore/restore_sources.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ckptd {

absl::StatusOr<std::vector<RestoreSource>> RestoreSources(const CheckpointStore& root,
                                                          const std::vector<const CheckpointStore*>& copies,
                                                          const std::string& run, std::optional<int64_t> step,
                                                          bool fallback, std::string* note) {
  absl::StatusOr<std::vector<int64_t>> local = root.RestoreCandidates(run, step, fallback);
  // NOT_FOUND here may still be a drained step, or a lost one (below).
  if (!local.ok() && !absl::IsNotFound(local.status())) return local.status();
  std::vector<RestoreSource> sources;
  for (int64_t s : local.value_or(std::vector<int64_t>())) sources.push_back({.step = s, .store = &root});
  // A copy that cannot answer is passed over: the root decides the call's errors.
  for (const CheckpointStore* copy : copies) {
    absl::StatusOr<std::vector<int64_t>> held = copy->RestoreCandidates(run, step, fallback);
    if (!held.ok() && !absl::IsNotFound(held.status())) {
      spdlog::warn("drain {}: {}", copy->root(), std::string(held.status().message()));
    }
    for (int64_t s : held.value_or(std::vector<int64_t>())) {
      sources.push_back({.step = s, .store = copy, .drained = true});
    }
  }
  // Newest first; a step's local copy before its drained one.
  std::stable_sort(sources.begin(), sources.end(),
                   [](const RestoreSource& a, const RestoreSource& b) { return a.step > b.step; });
  // A lost step is DATA_LOSS, never NOT_FOUND, and never quietly an older step.
  const auto lost = root.LostSteps(run).value_or(std::vector<std::pair<int64_t, std::string>>());
  for (auto it = lost.rbegin(); it != lost.rend(); ++it) {
    const auto& [lost_step, why] = *it;
    const bool asked = step.has_value() && *step == lost_step;
    const bool newest = !step.has_value() && (sources.empty() || lost_step > sources.front().step);
    if (!(asked && sources.empty()) && !newest) continue;
    const std::string what = absl::StrCat("run '", run, "' step ", lost_step, " was lost: ", why);
    if (newest && fallback && !sources.empty()) {
      absl::StrAppend(note, note->empty() ? "" : "; ", "skipped step ", lost_step, ": lost (", why, ")");
      continue;
    }
    return absl::DataLossError(
        sources.empty()
            ? what
            : absl::StrCat(what, "; step ", sources.front().step,
                           " is the newest that survives: restore it by number or with fallback"));
  }
  if (sources.empty()) {
    return absl::NotFoundError(step.has_value()
                                   ? absl::StrCat("run '", run, "' has no committed step ", *step)
                                   : absl::StrCat("run '", run, "' has no committed checkpoint"));
  }
  if (!fallback) {
    // The newest step only, from wherever holds it.
    const int64_t newest = sources.front().step;
    std::erase_if(sources, [newest](const RestoreSource& s) { return s.step != newest; });
  }
  return sources;
}

}  // namespace ckptd
