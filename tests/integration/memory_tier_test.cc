// memory_steps: daemons keep their data files of the last committed steps in memory,
// and a restore after the trainers restart (the daemons still running) reads them
// from there. Real daemons under mpirun, trainers over shared memory that they reuse
// step after step.
#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "daemon/base/status.h"
#include "daemon/bundle/bundle.h"
#include "daemon/store/checkpoint_store.h"
#include "tests/integration/cluster.h"

namespace ckptd::testing {
namespace {

constexpr char kRun[] = "mem";
constexpr int kTrainers = 2;  // one per daemon

// Trainer t's rows of an {rows * trainers, 256} float tensor at `step`.
std::vector<float> Rows(int trainer, int64_t step, int64_t rows) {
  std::vector<float> v(static_cast<size_t>(rows * 256));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(step * 1000003 + trainer * 7919 + i);
  return v;
}

// Every trainer saves `step` through its own client (over shared memory, so a later
// step reuses the segment the kept step was staged from) and waits for the commit.
absl::Status SaveStep(const std::vector<std::unique_ptr<Client>>& clients, int64_t step, int64_t rows) {
  auto results = RunTrainers(kTrainers, [&](int t) -> absl::Status {
    const std::vector<float> rows_of_t = Rows(t, step, rows);
    SaveOptions options;
    options.transport = Transport::kSharedMemory;
    RETURN_IF_ERROR(clients[t]
                        ->Save(kRun, step, t, kTrainers,
                               {{.name = "w",
                                 .dtype = kDtFloat,
                                 .shape = {rows * kTrainers, 256},
                                 .box_start = {rows * t, 0},
                                 .box_length = {rows, 256},
                                 .data = rows_of_t.data(),
                                 .size = rows_of_t.size() * 4}},
                               options)
                        .status());
    return clients[t]->Wait(kRun, step);
  });
  for (const absl::Status& s : results) RETURN_IF_ERROR(s);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> RestoreAll(const Cluster& cluster, int rank, int64_t step, int64_t rows) {
  std::vector<float> all(static_cast<size_t>(rows * kTrainers * 256));
  auto restored = cluster.Connect(rank)->Restore(
      kRun, step, {{.name = "w", .dtype = kDtFloat, .data = all.data(), .size = all.size() * 4}});
  if (!restored.ok()) return restored.status();
  return all;
}

// Trainer t's own rows, restored from daemon t: the data file that daemon wrote.
absl::StatusOr<std::vector<float>> RestoreOwnRows(const Cluster& cluster, int t, int64_t step, int64_t rows) {
  std::vector<float> mine(static_cast<size_t>(rows * 256));
  auto restored = cluster.Connect(t)->Restore(kRun, step,
                                              {{.name = "w",
                                                .dtype = kDtFloat,
                                                .box_start = {rows * t, 0},
                                                .box_length = {rows, 256},
                                                .data = mine.data(),
                                                .size = mine.size() * 4}});
  if (!restored.ok()) return restored.status();
  return mine;
}

std::vector<float> Expected(int64_t step, int64_t rows) {
  std::vector<float> all;
  for (int t = 0; t < kTrainers; ++t) {
    const std::vector<float> r = Rows(t, step, rows);
    all.insert(all.end(), r.begin(), r.end());
  }
  return all;
}

TEST(MemoryTierTest, RestoresAfterATrainerRestartReadTheKeptStepsFromMemory) {
  Cluster cluster(2, "", {"--memory-steps", "2"});
  ASSERT_TRUE(cluster.Start().ok()) << cluster.log();
  constexpr int64_t kRows = 16;
  {
    std::vector<std::unique_ptr<Client>> trainers;
    for (int t = 0; t < kTrainers; ++t) trainers.push_back(cluster.Connect(t));
    for (int64_t step = 1; step <= 3; ++step) ASSERT_TRUE(SaveStep(trainers, step, kRows).ok()) << step;
  }  // the trainers exit

  // Every data file on disk is overwritten with zeros: only bytes kept in memory can
  // restore right; a disk read fails its checksum.
  const CheckpointStore store(PosixFileSystem(), cluster.root());
  FileSystem* fs = PosixFileSystem();
  for (int64_t step = 1; step <= 3; ++step) {
    for (int shard = 0; shard < 2; ++shard) {
      const std::string path = DataPath(CheckpointStore::Prefix(store.StepDir(kRun, step)), shard, 2);
      const uint64_t size = *fs->FileSize(path);
      ASSERT_TRUE(fs->WriteFileAtomically(path, std::string(size, '\0')).ok()) << path;
    }
  }
  // Restarted trainers restore their shards from their daemons, which wrote them.
  for (int t = 0; t < kTrainers; ++t) {
    for (int64_t step : {2, 3}) {
      auto restored = RestoreOwnRows(cluster, t, step, kRows);
      ASSERT_TRUE(restored.ok()) << "trainer " << t << ", step " << step << ": " << restored.status();
      EXPECT_EQ(*restored, Rows(t, step, kRows)) << "trainer " << t << ", step " << step;
    }
    // The same into a HostBuffer: the daemon copies from the tier straight into it.
    auto buffer = HostBuffer::Allocate(kRows * 256 * 4);
    ASSERT_TRUE(buffer.ok()) << buffer.status();
    auto restored = cluster.Connect(t)->Restore(kRun, 3,
                                                {{.name = "w",
                                                  .dtype = kDtFloat,
                                                  .box_start = {kRows * t, 0},
                                                  .box_length = {kRows, 256},
                                                  .data = (*buffer)->data(),
                                                  .size = (*buffer)->size(),
                                                  .host_buffer = buffer->get()}});
    ASSERT_TRUE(restored.ok()) << restored.status();
    EXPECT_EQ(std::memcmp((*buffer)->data(), Rows(t, 3, kRows).data(), (*buffer)->size()), 0) << t;
    // The same over the gRPC stream: chunks are sent from the tier's copy itself.
    std::vector<float> streamed(static_cast<size_t>(kRows * 256));
    restored = cluster.Connect(t)->Restore(kRun, 3,
                                           {{.name = "w",
                                             .dtype = kDtFloat,
                                             .box_start = {kRows * t, 0},
                                             .box_length = {kRows, 256},
                                             .data = streamed.data(),
                                             .size = streamed.size() * 4}},
                                           RestoreOptions{.transport = Transport::kStream});
    ASSERT_TRUE(restored.ok()) << restored.status();
    EXPECT_EQ(streamed, Rows(t, 3, kRows)) << t;
    // Step 1 fell out of the tier (memory_steps 2): read from disk, it fails verification.
    EXPECT_EQ(RestoreOwnRows(cluster, t, 1, kRows).status().code(), absl::StatusCode::kDataLoss);
  }
  // Each daemon's own entry in its status is live (the others' are as of the last
  // coordination round).
  std::string out;
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(RunCommand(absl::StrCat(CKPTCTL_BINARY, " status --json --address ", cluster.Address(r)), &out),
              0)
        << out;
    const nlohmann::json rank = nlohmann::json::parse(out)["ranks"][r];
    EXPECT_EQ(rank["memory_steps_limit"], 2) << out;
    ASSERT_EQ(rank["memory_steps"].size(), 2u) << out;
    EXPECT_EQ(rank["memory_steps"][0]["step"], 2) << out;
    EXPECT_EQ(rank["memory_steps"][1]["step"], 3) << out;
    EXPECT_GE(rank["memory_steps"][1]["bytes"].get<int64_t>(), kRows * 256 * 4) << out;
  }
  ASSERT_EQ(RunCommand(absl::StrCat(CKPTCTL_BINARY, " status --address ", cluster.Address(0)), &out), 0)
      << out;
  EXPECT_NE(out.find("rank 0 keeps in memory (memory_steps 2): mem:2 ("), std::string::npos) << out;
  EXPECT_EQ(cluster.Stop(), 0) << cluster.log();
}

TEST(MemoryTierTest, KeptStepsGiveWayToNewSavesWithinTheStagingBudget) {
  TempDir config;
  // 3 MiB of staging per daemon; each step stages 1 MiB per daemon.
  ASSERT_TRUE(PosixFileSystem()
                  ->WriteFileAtomically(config.Sub("ckptd.yaml"), "staging:\n  memory_limit: 3145728\n")
                  .ok());
  Cluster cluster(2, "", {"--memory-steps", "4", "--config", config.Sub("ckptd.yaml")});
  ASSERT_TRUE(cluster.Start().ok()) << cluster.log();
  constexpr int64_t kRows = 1024;  // 1 MiB per trainer
  std::vector<std::unique_ptr<Client>> trainers;
  for (int t = 0; t < kTrainers; ++t) trainers.push_back(cluster.Connect(t));
  for (int64_t step = 1; step <= 6; ++step) {
    // Never refused or stalled for room that kept steps hold.
    ASSERT_TRUE(SaveStep(trainers, step, kRows).ok()) << step << "\n" << cluster.log();
  }
  for (int rank = 0; rank < 2; ++rank) {
    auto status = cluster.Connect(rank)->Status();
    ASSERT_TRUE(status.ok()) << status.status();
    EXPECT_LE(status->peak_bytes_staged(), 3145728);
    // What fits beside a new save is kept: the newest step at least, never all four.
    ASSERT_GE(status->memory_steps_size(), 1);
    EXPECT_LT(status->memory_steps_size(), 4);
    EXPECT_EQ(status->memory_steps(status->memory_steps_size() - 1).step(), 6);
    auto restored = RestoreAll(cluster, rank, 6, kRows);
    ASSERT_TRUE(restored.ok()) << restored.status();
    EXPECT_EQ(*restored, Expected(6, kRows));
  }
  trainers.clear();
  EXPECT_EQ(cluster.Stop(), 0) << cluster.log();
}

}  // namespace
}  // namespace ckptd::testing
