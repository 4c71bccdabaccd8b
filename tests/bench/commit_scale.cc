// ckptd-commit-scale: a scale model of one commit's coordination. N coordinators
// ("daemons") run as threads of this process, joined by the in-process collective the
// fault tests use (tests/fault/thread_collective.h), over one shared root on tmpfs;
// each rank's trainer stages T tensors of 4 bytes (so the data bytes cost nothing),
// and the model times what is left: the plan (descriptors gathered, the plan made on
// rank 0, each rank's share scattered), the writes of tiny data files, the merge of
// every index entry on rank 0 and the votes.
//
//   ckptd-commit-scale --root DIR --case RANKSxTENSORS [--case ...] [--steps N]
//
// For each case it commits N steps (the first warms the process up and is not
// counted) and prints one JSON object: per case the median over the counted steps of
// the commit's wall time (from staging to every rank's outcome), rank 0's wall time
// and thread CPU time in each phase, and the most CPU any other rank spent in each
// phase. On a machine with fewer cores than ranks the other ranks' own work runs one
// after another, where on a real job it runs in parallel: rank 0's CPU and the other
// ranks' largest are what the model predicts a real commit from.
#include <time.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cstring>
#include <future>
#include <iostream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "daemon/base/dtype.h"
#include "daemon/base/logging.h"
#include "daemon/coord/coordinator.h"
#include "daemon/io/file_system.h"
#include "daemon/store/checkpoint_store.h"
#include "tests/fault/thread_collective.h"

namespace ckptd {
namespace {

using json = nlohmann::json;

double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// Each phase's wall time and this coordinator thread's CPU time in it. The plan's CPU
// counts from the previous step's conclusion, so it also holds the idle rounds
// between steps (small: one round per few milliseconds).
class PhaseClock : public CommitObserver {
 public:
  void OnPhase(const char* phase, absl::Duration took) override {
    const double now = ThreadCpuSeconds();
    std::lock_guard<std::mutex> lock(mu_);
    wall_[phase] = absl::ToDoubleSeconds(took);
    cpu_[phase] = now - last_;
    last_ = now;
  }
  void OnConcluded(const StepOutcome&) override {
    const double now = ThreadCpuSeconds();
    std::lock_guard<std::mutex> lock(mu_);
    last_ = now;
  }
  std::map<std::string, double> wall() const {
    std::lock_guard<std::mutex> lock(mu_);
    return wall_;
  }
  std::map<std::string, double> cpu() const {
    std::lock_guard<std::mutex> lock(mu_);
    return cpu_;
  }

 private:
  mutable std::mutex mu_;
  double last_ = 0;
  std::map<std::string, double> wall_, cpu_;
};

struct Rank {
  StagingArea staging;
  StepRegistry registry;
  std::unique_ptr<CheckpointStore> store;
  std::unique_ptr<Coordinator> coordinator;
  PhaseClock clock;
  std::thread thread;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

json RunCase(const std::string& root, int ranks, int tensors, int steps) {
  testing::ThreadGroup group(ranks);
  std::vector<std::unique_ptr<Collective>> members = group.Members();
  std::vector<std::unique_ptr<Rank>> job;
  std::atomic<bool> stop{false};
  for (int r = 0; r < ranks; ++r) {
    auto rank = std::make_unique<Rank>();
    rank->store = std::make_unique<CheckpointStore>(PosixFileSystem(), root);
    // Nothing is kept: each step's directory goes once the next commits.
    rank->coordinator = std::make_unique<Coordinator>(
        members[r].get(), &rank->registry, rank->store.get(),
        CoordinatorOptions{.commit_timeout = absl::Minutes(30), .version = "scale", .keep_last = 1});
    rank->coordinator->AddObserver(&rank->clock);
    job.push_back(std::move(rank));
  }
  for (auto& rank : job) {
    Rank* raw = rank.get();
    raw->thread = std::thread([raw, &stop] { raw->coordinator->Run(stop).IgnoreError(); });
  }
  const std::string run = absl::StrCat("scale-", ranks, "x", tensors);
  std::vector<double> walls;
  std::map<std::string, std::vector<double>> rank0_wall, rank0_cpu, others_cpu;
  const float value = 1.0f;
  for (int step = 1; step <= steps; ++step) {
    std::vector<std::promise<absl::Status>> done(static_cast<size_t>(ranks));
    const absl::Time start = absl::Now();
    for (int r = 0; r < ranks; ++r) {
      Rank& rank = *job[r];
      TrainerPayload payload;
      payload.trainer_id = r;
      payload.tensors.reserve(static_cast<size_t>(tensors));
      for (int t = 0; t < tensors; ++t) {
        StagedBuffer bytes = *rank.staging.Allocate(sizeof(value));
        std::memcpy(bytes.data(), &value, sizeof(value));
        payload.tensors.push_back(
            {absl::StrCat("rank", r, "/t", t), kFloat, {1}, Box{{0}, {1}}, std::move(bytes), false, {}});
      }
      const StepKey key{run, step};
      absl::Status staged = rank.registry.Stage(key, ranks, std::move(payload));
      if (!staged.ok()) {
        std::cerr << "rank " << r << ": " << staged << std::endl;
        std::abort();
      }
      rank.registry.AddStepWaiter(key, Waiter{nullptr, [&done, r](const absl::Status& s) {
                                                done[static_cast<size_t>(r)].set_value(s);
                                              }});
    }
    for (int r = 0; r < ranks; ++r) {
      absl::Status s = done[static_cast<size_t>(r)].get_future().get();
      if (!s.ok()) {
        std::cerr << "step " << step << " on rank " << r << ": " << s << std::endl;
        std::abort();
      }
    }
    if (step == 1) continue;  // the first warms up (allocations, directories)
    walls.push_back(absl::ToDoubleSeconds(absl::Now() - start));
    for (const auto& [phase, seconds] : job[0]->clock.wall()) rank0_wall[phase].push_back(seconds);
    for (const auto& [phase, seconds] : job[0]->clock.cpu()) rank0_cpu[phase].push_back(seconds);
    std::map<std::string, double> most;
    for (int r = 1; r < ranks; ++r) {
      for (const auto& [phase, seconds] : job[r]->clock.cpu()) most[phase] = std::max(most[phase], seconds);
    }
    for (const auto& [phase, seconds] : most) others_cpu[phase].push_back(seconds);
  }
  stop = true;
  for (auto& rank : job) rank->thread.join();
  json out = {{"ranks", ranks},
              {"tensors_per_rank", tensors},
              {"index_entries", static_cast<int64_t>(ranks) * tensors},
              {"steps_counted", walls.size()},
              {"commit_wall_s", Median(walls)}};
  for (const auto& [phase, v] : rank0_wall) out["rank0_wall_s"][phase] = Median(v);
  for (const auto& [phase, v] : rank0_cpu) out["rank0_cpu_s"][phase] = Median(v);
  for (const auto& [phase, v] : others_cpu) out["others_max_cpu_s"][phase] = Median(v);
  double predicted = 0;  // the critical path without the network: per phase, the slower side
  for (const auto& [phase, v] : rank0_cpu) {
    const double others = others_cpu.count(phase) ? Median(others_cpu[phase]) : 0.0;
    predicted += std::max(Median(v), others);
  }
  out["cpu_critical_path_s"] = predicted;
  return out;
}

}  // namespace
}  // namespace ckptd

int main(int argc, char** argv) {
  CLI::App app{"ckptd-commit-scale: a commit's coordination at many simulated ranks, in one process"};
  std::string root;
  std::vector<std::string> cases;
  int steps = 3;
  app.add_option("--root", root, "a directory on tmpfs (e.g. /dev/shm/...): the shared root")->required();
  app.add_option("--case", cases, "RANKSxTENSORS, e.g. 1024x1000 (tensors per rank)")->required();
  app.add_option("--steps", steps, "steps per case; the first is not counted")->check(CLI::Range(2, 100));
  CLI11_PARSE(app, argc, argv);
  ckptd::SetUpLogging({.level = "warn"}).IgnoreError();
  nlohmann::json out = nlohmann::json::array();
  for (const std::string& c : cases) {
    std::vector<std::string> parts = absl::StrSplit(c, 'x');
    int ranks = 0, tensors = 0;
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &ranks) || !absl::SimpleAtoi(parts[1], &tensors) ||
        ranks < 1 || tensors < 1) {
      std::cerr << "ckptd-commit-scale: --case takes RANKSxTENSORS, e.g. 64x1000; got " << c << std::endl;
      return 2;
    }
    std::cerr << "== " << ranks << " ranks x " << tensors << " tensors" << std::endl;
    out.push_back(ckptd::RunCase(root, ranks, tensors, steps));
  }
  std::cout << out.dump() << std::endl;
  return 0;
}
