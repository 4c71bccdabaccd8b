// InProcessJob: N coordinators ("daemons") in one process, joined by a ThreadGroup,
// each with its own registry and FileSystem over one shared root. Trainers are
// simulated by staging payloads straight into the registries, so the whole commit
// protocol runs without MPI or gRPC. Owned by one test thread.
#ifndef CKPTD_TESTS_FAULT_IN_PROCESS_JOB_H_
#define CKPTD_TESTS_FAULT_IN_PROCESS_JOB_H_

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "daemon/coord/coordinator.h"
#include "daemon/coord/step_registry.h"
#include "daemon/staging/staging_area.h"
#include "daemon/store/checkpoint_store.h"
#include "tests/fault/thread_collective.h"

namespace ckptd::testing {

// A drain root for InProcessJob: each rank reaches it through its own FileSystem.
struct InProcessDrain {
  std::string root;
  std::vector<FileSystem*> fs_per_rank;
  int64_t bytes_per_second = 0;
};

class InProcessJob {
 public:
  InProcessJob(const std::string& root, const std::vector<FileSystem*>& fs_per_rank,
               CoordinatorOptions options = {.commit_timeout = absl::Seconds(20), .version = "test"},
               const InProcessDrain* drain = nullptr);
  ~InProcessJob();

  // One trainer per rank saves the test model for `step` ("w": float rows sharded
  // over ranks, "r": int64 replicated on all) and waits; returns each one's outcome.
  std::vector<absl::Status> Save(const std::string& run, int64_t step);
  // Rank r's drainer (null without a drain).
  const Drainer* drainer(int r) const { return ranks_[r]->drainer.get(); }

 private:
  struct Rank {
    StagingArea staging;
    StepRegistry registry;
    std::unique_ptr<CheckpointStore> store;
    std::unique_ptr<CheckpointStore> drain_store;
    std::unique_ptr<Drainer> drainer;
    std::unique_ptr<Coordinator> coordinator;
    std::thread thread;
  };
  ThreadGroup group_;
  std::vector<std::unique_ptr<Collective>> members_;
  std::vector<std::unique_ptr<Rank>> ranks_;
  std::atomic<bool> stop_{false};
};

// The test model's expected values, as InProcessJob::Save writes them.
std::vector<float> ExpectedW(int ranks, int64_t step);
std::vector<int64_t> ExpectedR(int64_t step);

// Checks what a reader can see of `run` under `root`; returns "" when every visible
// step verifies and holds its exact values, and TF's state file names only visible
// steps (`strict`: exactly the visible steps, newest first-class). Else a description.
std::string CheckVisibleState(const std::string& root, const std::string& run, int ranks, bool strict,
                              std::vector<int64_t>* visible);

}  // namespace ckptd::testing

#endif  // CKPTD_TESTS_FAULT_IN_PROCESS_JOB_H_
