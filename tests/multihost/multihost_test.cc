// Many hosts: daemons on simulated hosts (tests/multihost/hosts.sh: network, UTS and
// mount namespaces, Open MPI over TCP between them), with one shared root or each
// host's own disk. Needs root; skipped with the reason otherwise.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "daemon/base/status.h"
#include "daemon/io/file_system.h"
#include "tests/integration/cluster.h"

namespace ckptd::testing {
namespace {

struct Mode {
  int hosts;
  bool local;
};

std::string ModeName(const ::testing::TestParamInfo<Mode>& info) {
  return absl::StrCat(info.param.hosts, "Hosts", info.param.local ? "Local" : "Shared");
}

// Rows [8t, 8t+8) of an {8n, 16} float tensor: trainer t's shard; values name their
// (row, column) so any misplaced byte shows.
std::vector<float> Rows(int trainer, int64_t step) {
  std::vector<float> rows(8 * 16);
  for (int r = 0; r < 8; ++r) {
    for (int c = 0; c < 16; ++c)
      rows[r * 16 + c] = static_cast<float>(step * 100000 + (8 * trainer + r) * 16 + c);
  }
  return rows;
}

absl::Status SaveStep(const Cluster& cluster, int trainers, int64_t step, const std::string& run = "mh") {
  auto results = RunTrainers(trainers, [&](int t) -> absl::Status {
    auto client = cluster.Connect(t);
    if (client == nullptr) return absl::UnavailableError(absl::StrCat("no daemon for trainer ", t));
    const std::vector<float> rows = Rows(t, step);
    const int64_t count = step;
    RETURN_IF_ERROR(client
                        ->Save(run, step, t, trainers,
                               {{.name = "w",
                                 .dtype = kDtFloat,
                                 .shape = {8 * trainers, 16},
                                 .box_start = {8 * t, 0},
                                 .box_length = {8, 16},
                                 .data = rows.data(),
                                 .size = rows.size() * 4},
                                {.name = "count", .dtype = kDtInt64, .data = &count, .size = 8}})
                        .status());
    return client->Wait(run, step);
  });
  for (const absl::Status& s : results) {
    RETURN_IF_ERROR(s);
  }
  return absl::OkStatus();
}

class MultiHostTest : public ::testing::TestWithParam<Mode> {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "simulated hosts need root (network and mount namespaces)";
  }
};

TEST_P(MultiHostTest, StepCommitsOnEveryHostWithEachHostsShardWhereItBelongs) {
  const Mode mode = GetParam();
  Cluster cluster(mode.hosts, SimulatedHosts{.hosts = mode.hosts, .local_storage = mode.local});
  ASSERT_TRUE(cluster.Start().ok()) << cluster.log();
  ASSERT_TRUE(SaveStep(cluster, mode.hosts, 1).ok());
  FileSystem* fs = PosixFileSystem();
  for (int host = 0; host < mode.hosts; ++host) {
    const std::string step_dir = JoinPath(cluster.HostRoot(host), "mh/step-00000001");
    EXPECT_TRUE(fs->Exists(JoinPath(step_dir, "ckpt.index"))) << step_dir;
    EXPECT_TRUE(fs->Exists(JoinPath(step_dir, "ckptd.json"))) << step_dir;
    EXPECT_TRUE(fs->Exists(JoinPath(cluster.HostRoot(host), "mh/checkpoint"))) << host;
    for (int rank = 0; rank < mode.hosts; ++rank) {
      const std::string data =
          JoinPath(step_dir, absl::StrFormat("ckpt.data-%05d-of-%05d", rank, mode.hosts));
      // A host's disk holds its own shard only; a shared root holds every shard.
      EXPECT_EQ(fs->Exists(data), !mode.local || rank == host) << data;
    }
    // Every daemon lists the step as committed.
    auto listed = cluster.Connect(host)->ListCheckpoints("mh");
    ASSERT_TRUE(listed.ok()) << listed.status();
    ASSERT_EQ(listed->checkpoints_size(), 1);
    EXPECT_EQ(listed->checkpoints(0).step(), 1);
  }
  // The merged index on every host is the same file.
  const std::string index0 =
      fs->ReadFileToString(JoinPath(cluster.HostRoot(0), "mh/step-00000001/ckpt.index"), 1 << 20)
          .value_or("");
  for (int host = 1; host < mode.hosts; ++host) {
    EXPECT_EQ(fs->ReadFileToString(JoinPath(cluster.HostRoot(host), "mh/step-00000001/ckpt.index"), 1 << 20)
                  .value_or("?"),
              index0);
  }
  // ckptctl on one host's directory: checks what is there and says who holds the rest.
  const std::string host1_step = JoinPath(cluster.HostRoot(1), "mh/step-00000001");
  std::string out;
  ASSERT_EQ(RunCommand(absl::StrCat(CKPTCTL_BINARY, " verify --json ", host1_step), &out), 0) << out;
  const nlohmann::json verified = nlohmann::json::parse(out.substr(out.find('{')));
  EXPECT_EQ(verified["ok"], true);
  EXPECT_EQ(verified["complete"], !mode.local);
  EXPECT_GT(verified["entries"].get<int>(), 0);
  if (mode.local) {
    std::vector<std::string> elsewhere = {"rank 0 (host0)"};
    if (mode.hosts == 3) elsewhere.push_back("rank 2 (host2)");
    EXPECT_EQ(verified["shards_elsewhere"], elsewhere);
    TempDir exported;
    EXPECT_EQ(
        RunCommand(absl::StrCat(CKPTCTL_BINARY, " export ", host1_step, " --out ", exported.Sub("x")), &out),
        2);
    EXPECT_NE(out.find("holds the shard of rank 1 of this checkpoint only (saved with storage: local)"),
              std::string::npos)
        << out;
  }
  if (mode.local) {
    // This host's own rows restore from its disk; the whole tensor needs the other
    // hosts' shards, which is refused by name rather than passed off as data loss.
    std::vector<float> mine(8 * 16);
    auto restored = cluster.Connect(0)->Restore("mh", 1,
                                                {{.name = "w",
                                                  .dtype = kDtFloat,
                                                  .box_start = {0, 0},
                                                  .box_length = {8, 16},
                                                  .data = mine.data(),
                                                  .size = mine.size() * 4}});
    ASSERT_TRUE(restored.ok()) << restored.status();
    EXPECT_EQ(mine, Rows(0, 1));
    std::vector<float> all(static_cast<size_t>(8 * mode.hosts * 16));
    restored = cluster.Connect(0)->Restore(
        "mh", std::nullopt, {{.name = "w", .dtype = kDtFloat, .data = all.data(), .size = all.size() * 4}});
    EXPECT_EQ(restored.status().code(), absl::StatusCode::kFailedPrecondition) << restored.status();
    EXPECT_NE(restored.status().message().find("rank(s) 1 (host1)"), absl::string_view::npos)
        << restored.status();
  } else {
    // Every daemon restores the whole tensor, reading every host's shard.
    for (int rank = 0; rank < mode.hosts; ++rank) {
      std::vector<float> back(static_cast<size_t>(8 * mode.hosts * 16));
      auto restored = cluster.Connect(rank)->Restore(
          "mh", 1, {{.name = "w", .dtype = kDtFloat, .data = back.data(), .size = back.size() * 4}});
      ASSERT_TRUE(restored.ok()) << restored.status();
      for (int t = 0; t < mode.hosts; ++t) {
        const std::vector<float> want = Rows(t, 1);
        EXPECT_EQ(std::memcmp(back.data() + t * 128, want.data(), 512), 0) << "rows of trainer " << t;
      }
    }
  }
  EXPECT_EQ(cluster.Stop(), 0) << cluster.log();
}

TEST_P(MultiHostTest, KilledRankFailsThePendingStepAndTheCommittedOneSurvivesARestart) {
  const Mode mode = GetParam();
  Cluster cluster(mode.hosts, SimulatedHosts{.hosts = mode.hosts, .local_storage = mode.local});
  ASSERT_TRUE(cluster.Start().ok()) << cluster.log();
  ASSERT_TRUE(SaveStep(cluster, mode.hosts, 1).ok());
  // Trainer 0 stages step 2; the daemon on the last host dies before its trainer saves.
  auto client = cluster.Connect(0);
  const std::vector<float> rows = Rows(0, 2);
  ASSERT_TRUE(client
                  ->Save("mh", 2, 0, mode.hosts,
                         {{.name = "w",
                           .dtype = kDtFloat,
                           .shape = {8 * mode.hosts, 16},
                           .box_start = {0, 0},
                           .box_length = {8, 16},
                           .data = rows.data(),
                           .size = rows.size() * 4}})
                  .ok());
  const pid_t victim = cluster.Pid(mode.hosts - 1);
  ASSERT_GT(victim, 0);
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  EXPECT_NE(cluster.WaitForExit(), 0);
  client.reset();

  ASSERT_TRUE(cluster.Start().ok()) << cluster.log();
  FileSystem* fs = PosixFileSystem();
  for (int host = 0; host < mode.hosts; ++host) {
    EXPECT_TRUE(fs->Exists(JoinPath(cluster.HostRoot(host), "mh/step-00000001/ckpt.index"))) << host;
    EXPECT_FALSE(fs->Exists(JoinPath(cluster.HostRoot(host), "mh/step-00000002"))) << host;
    auto listed = cluster.Connect(host)->ListCheckpoints("mh");
    ASSERT_TRUE(listed.ok()) << listed.status();
    ASSERT_EQ(listed->checkpoints_size(), 1);
  }
  // The restarted job commits again.
  ASSERT_TRUE(SaveStep(cluster, mode.hosts, 3).ok());
  EXPECT_EQ(cluster.Stop(), 0) << cluster.log();
}

INSTANTIATE_TEST_SUITE_P(Hosts, MultiHostTest,
                         ::testing::Values(Mode{2, false}, Mode{2, true}, Mode{3, false}, Mode{3, true}),
                         ModeName);

class StorageModeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "simulated hosts need root (network and mount namespaces)";
  }
};

TEST_F(StorageModeTest, WipedDiskFailsTheStepNamingTheHostAndPublishesItNowhere) {
  Cluster cluster(2, SimulatedHosts{.hosts = 2, .local_storage = true});
  ASSERT_TRUE(cluster.Start().ok()) << cluster.log();
  ASSERT_TRUE(SaveStep(cluster, 2, 1).ok());
  ASSERT_TRUE(PosixFileSystem()->DeleteRecursively(cluster.HostRoot(1)).ok());
  const absl::Status s = SaveStep(cluster, 2, 2);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("host1"), absl::string_view::npos) << s;
  EXPECT_FALSE(PosixFileSystem()->Exists(JoinPath(cluster.HostRoot(0), "mh/step-00000002")));
  EXPECT_FALSE(PosixFileSystem()->Exists(JoinPath(cluster.HostRoot(1), "mh/step-00000002")));
  EXPECT_EQ(cluster.Stop(), 0) << cluster.log();
}

TEST_F(StorageModeTest, AStepPublishedOnSomeHostsOnlyIsTakenBackAtStart) {
  Cluster cluster(2, SimulatedHosts{.hosts = 2, .local_storage = true});
  FileSystem* fs = PosixFileSystem();
  ASSERT_TRUE(cluster.Start().ok()) << cluster.log();
  ASSERT_TRUE(SaveStep(cluster, 2, 1).ok());
  const std::string host1_state = JoinPath(cluster.HostRoot(1), "mh/checkpoint");
  const std::string state_at_step1 = fs->ReadFileToString(host1_state, 1 << 16).value_or("");
  ASSERT_TRUE(SaveStep(cluster, 2, 2).ok());
  ASSERT_EQ(cluster.Stop(), 0) << cluster.log();
  // As if host1 crashed before renaming its step 2 into place: the temp directory is
  // still there and its state file names step 1.
  ASSERT_TRUE(fs->Rename(JoinPath(cluster.HostRoot(1), "mh/step-00000002"),
                         JoinPath(cluster.HostRoot(1), "mh/.tmp-step-00000002"))
                  .ok());
  ASSERT_TRUE(fs->WriteFileAtomically(host1_state, state_at_step1).ok());

  ASSERT_TRUE(cluster.Start().ok()) << cluster.log();
  for (int host = 0; host < 2; ++host) {
    auto listed = cluster.Connect(host)->ListCheckpoints("mh");
    ASSERT_TRUE(listed.ok()) << listed.status();
    ASSERT_EQ(listed->checkpoints_size(), 1) << host;
    EXPECT_EQ(listed->checkpoints(0).step(), 1);
  }
  EXPECT_FALSE(fs->Exists(JoinPath(cluster.HostRoot(0), "mh/step-00000002")));
  EXPECT_EQ(fs->ReadFileToString(JoinPath(cluster.HostRoot(0), "mh/checkpoint"), 1 << 16).value_or("?"),
            state_at_step1);
  const std::string log = fs->ReadFileToString(cluster.log(), 1 << 22).value_or("");
  EXPECT_NE(log.find("run 'mh' step 2 is committed on 1 of 2 hosts"), std::string::npos) << log;
  // Step 2 can be saved again.
  ASSERT_TRUE(SaveStep(cluster, 2, 2).ok());
  EXPECT_EQ(cluster.Stop(), 0) << cluster.log();
}

TEST_F(StorageModeTest, SharedStorageOnNodeLocalDisksIsRefusedAtStartNamingTheHost) {
  Cluster cluster(2, SimulatedHosts{.hosts = 2, .local_storage = false, .root_on_host_disks = true});
  EXPECT_FALSE(cluster.Start().ok());
  EXPECT_EQ(cluster.exit_code(), 2);
  const std::string log = PosixFileSystem()->ReadFileToString(cluster.log(), 1 << 20).value_or("");
  EXPECT_NE(log.find("rank 0 on host host0 does not see the checkpoint root"), std::string::npos) << log;
  EXPECT_NE(log.find("that rank(s) 1 (on host1) wrote to"), std::string::npos) << log;
  EXPECT_NE(log.find("storage: local"), std::string::npos) << log;
}

TEST_F(StorageModeTest, LocalStorageNeedsARootPerDaemon) {
  Cluster shared_root(2, "", {"--storage", "local"});
  EXPECT_FALSE(shared_root.Start().ok());
  EXPECT_EQ(shared_root.exit_code(), 2);
  std::string log = PosixFileSystem()->ReadFileToString(shared_root.log(), 1 << 20).value_or("");
  EXPECT_NE(log.find("shares its checkpoint root"), std::string::npos) << log;

  TempDir roots;
  Cluster per_rank(2, roots.Sub("root-{rank}"), {"--storage", "local"});
  ASSERT_TRUE(per_rank.Start().ok()) << per_rank.log();
  ASSERT_TRUE(SaveStep(per_rank, 2, 1).ok());
  EXPECT_TRUE(PosixFileSystem()->Exists(roots.Sub("root-0/mh/step-00000001/ckpt.data-00000-of-00002")));
  EXPECT_TRUE(PosixFileSystem()->Exists(roots.Sub("root-1/mh/step-00000001/ckpt.data-00001-of-00002")));
  EXPECT_FALSE(PosixFileSystem()->Exists(roots.Sub("root-0/mh/step-00000001/ckpt.data-00001-of-00002")));
  EXPECT_EQ(per_rank.Stop(), 0) << per_rank.log();
}

}  // namespace
}  // namespace ckptd::testing
