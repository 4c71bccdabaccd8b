#include "daemon/coord/replicas.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ckptd {

absl::StatusOr<std::vector<std::vector<int>>> PlaceReplicas(const std::vector<std::string>& domains,
                                                            int replicas) {
  const int ranks = static_cast<int>(domains.size());
  std::vector<std::vector<int>> copies(ranks);
  if (replicas <= 0) return copies;
  const std::set<std::string> distinct(domains.begin(), domains.end());
  if (static_cast<int>(distinct.size()) < replicas + 1) {
    return absl::FailedPreconditionError(
        absl::StrCat("replicas: ", replicas, " copies of each data file need ", replicas + 1,
                     " hosts in different failure domains; this job has ", distinct.size(), " (",
                     absl::StrJoin(distinct, ", "), ")"));
  }
  for (int r = 0; r < ranks; ++r) {
    std::set<std::string> used = {domains[r]};
    for (int step = 1; step < ranks && static_cast<int>(copies[r].size()) < replicas; ++step) {
      const int candidate = (r + step) % ranks;
      if (used.insert(domains[candidate]).second) copies[r].push_back(candidate);
    }
  }
  return copies;
}

}  // namespace ckptd
