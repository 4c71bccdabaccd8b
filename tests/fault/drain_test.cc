// The drain (config drain_to), in process over the real commit protocol: committed
// steps reach the drain root whole and verify there, its retention and every-N rule
// apply, a fault in the drain's file system leaves nothing partial visible there and
// the next step still drains, and a drain cut short by a crash resumes at restart into
// the same temp directory, keeping the files it finished.
#include "daemon/store/drain.h"

#include <gtest/gtest.h>
#include <spdlog/spdlog.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "daemon/bundle/bundle.h"
#include "daemon/store/checkpoint_store.h"
#include "tests/common/temp_dir.h"
#include "tests/fault/fault_file_system.h"
#include "tests/fault/in_process_job.h"

namespace ckptd::testing {
namespace {

constexpr int kDrainRanks = 2;
constexpr char kDrainRun[] = "drain";

CoordinatorOptions Options(int every_n_steps = 0, int keep_last = 0) {
  return {.commit_timeout = absl::Seconds(20),
          .version = "test",
          .drain_every_n_steps = every_n_steps,
          .drain_keep_last = keep_last};
}

// The drain runs in the background, so a test polls for its result (up to a minute).
bool Eventually(const std::function<bool()>& done) {
  for (const absl::Time end = absl::Now() + absl::Minutes(1); absl::Now() < end;) {
    if (done()) return true;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return done();
}

bool Drained(const std::string& drain_root, int64_t step) {
  const CheckpointStore drain(PosixFileSystem(), drain_root);
  return Eventually([&] { return drain.IsCommitted(kDrainRun, step); });
}

bool SaveOk(InProcessJob& job, int64_t step) {
  for (const absl::Status& s : job.Save(kDrainRun, step)) {
    if (!s.ok()) return false;
  }
  return true;
}

// Names in the drain's run directory that are not a step or the state file.
std::vector<std::string> Leftovers(const std::string& drain_root) {
  std::vector<std::string> odd;
  const CheckpointStore drain(PosixFileSystem(), drain_root);
  for (const std::string& name :
       PosixFileSystem()->ListDir(drain.RunDir(kDrainRun)).value_or(std::vector<std::string>())) {
    if (name != "checkpoint" && name.rfind("step-", 0) != 0) odd.push_back(name);
  }
  return odd;
}

TEST(DrainTest, CommittedStepsReachTheDrainWholeWithItsOwnRetentionAndEveryN) {
  TempDir root, drain_root;
  const InProcessDrain drain{.root = drain_root.path(),
                             .fs_per_rank = {PosixFileSystem(), PosixFileSystem()}};
  {
    InProcessJob job(root.path(), {PosixFileSystem(), PosixFileSystem()}, Options(2, 2), &drain);
    for (int64_t step = 1; step <= 6; ++step) {
      ASSERT_TRUE(SaveOk(job, step)) << step;
      if (step % 2 == 0) {
        ASSERT_TRUE(Drained(drain_root.path(), step)) << step;
      }
    }
  }
  std::vector<int64_t> visible;
  // Every drained step verifies and holds its exact values; TF's state file names them.
  EXPECT_EQ(CheckVisibleState(drain_root.path(), kDrainRun, kDrainRanks, /*strict=*/true, &visible), "");
  EXPECT_EQ(visible, (std::vector<int64_t>{4, 6}));  // even steps only, the newest 2 kept
  EXPECT_EQ(Leftovers(drain_root.path()), std::vector<std::string>());
  // The checkpoint root is untouched by the drain's retention.
  EXPECT_EQ(*CheckpointStore(PosixFileSystem(), root.path()).ListSteps(kDrainRun),
            (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
}

TEST(DrainTest, AnInterruptedDrainResumesIntoItsTempDirectoryKeepingFinishedFiles) {
  TempDir root, drain_root;
  const InProcessDrain drain{.root = drain_root.path(),
                             .fs_per_rank = {PosixFileSystem(), PosixFileSystem()}};
  const CheckpointStore drained(PosixFileSystem(), drain_root.path());
  {
    InProcessJob job(root.path(), {PosixFileSystem(), PosixFileSystem()}, Options(), &drain);
    ASSERT_TRUE(SaveOk(job, 1));
    ASSERT_TRUE(Drained(drain_root.path(), 1));
  }
  // Turn the drained step back into what a crash mid-drain leaves: its temp directory
  // without rank 1's data file (a half-copied one in its place) and without the index.
  const CheckpointStore source(PosixFileSystem(), root.path());
  const absl::StatusOr<std::string> id = CommitId(source, kDrainRun, 1);
  ASSERT_TRUE(id.ok()) << id.status();
  const std::string temp = DrainTempDir(drained, kDrainRun, 1, *id);
  FileSystem* fs = PosixFileSystem();
  ASSERT_TRUE(fs->Rename(drained.StepDir(kDrainRun, 1), temp).ok());
  const std::string prefix = CheckpointStore::Prefix(temp);
  ASSERT_TRUE(fs->DeleteFile(IndexPath(prefix)).ok());
  ASSERT_TRUE(
      fs->Rename(DataPath(prefix, 1, kDrainRanks), DataPath(prefix, 1, kDrainRanks) + ".partial").ok());
  const uint64_t index_bytes =
      *fs->FileSize(IndexPath(CheckpointStore::Prefix(source.StepDir(kDrainRun, 1))));
  const uint64_t data1_bytes =
      *fs->FileSize(DataPath(CheckpointStore::Prefix(source.StepDir(kDrainRun, 1)), 1, kDrainRanks));
  {
    // A restarted job drains the newest committed step the drain lacks.
    InProcessJob job(root.path(), {PosixFileSystem(), PosixFileSystem()}, Options(), &drain);
    ASSERT_TRUE(Drained(drain_root.path(), 1));
    // Rank 0 copied only the index again (its data file and ckptd.json were whole),
    // rank 1 only its data file.
    EXPECT_EQ(job.drainer(0)->Poll().bytes, static_cast<int64_t>(index_bytes));
    EXPECT_EQ(job.drainer(1)->Poll().bytes, static_cast<int64_t>(data1_bytes));
  }
  std::vector<int64_t> visible;
  EXPECT_EQ(CheckVisibleState(drain_root.path(), kDrainRun, kDrainRanks, /*strict=*/true, &visible), "");
  EXPECT_EQ(visible, (std::vector<int64_t>{1}));
  EXPECT_EQ(Leftovers(drain_root.path()), std::vector<std::string>());
}

// Every kind of drain write fails once, and a crash at each of the drain's first
// operations (followed by a restart), on either rank.
TEST(DrainFaultSuite, NothingPartialIsEverVisibleInTheDrainAndDrainingCarriesOn) {
  spdlog::set_level(spdlog::level::off);  // the failures are expected; the summary says it all
  std::vector<FaultSpec> specs;
  for (FsOp op : {FsOp::kOpen, FsOp::kWrite, FsOp::kSync, FsOp::kRename, FsOp::kMkdir}) {
    specs.push_back({.op = op, .nth = 1, .error = EIO});
    specs.push_back({.op = op, .nth = 1, .error = ENOSPC});
  }
  specs.push_back({.op = FsOp::kWrite, .nth = 1, .error = ENOSPC, .torn = true});
  // Crashes at every operation of the first drain, until one past its last.
  for (int nth = 1; nth <= 40; ++nth) specs.push_back({.op = FsOp::kAny, .nth = nth, .crash = true});
  int injected = 0;
  for (int rank = 0; rank < kDrainRanks; ++rank) {
    for (const FaultSpec& spec : specs) {
      const std::string what =
          absl::StrCat("rank ", rank, ": ", spec.crash ? "crash at operation " : FsOpName(spec.op),
                       spec.crash ? absl::StrCat(spec.nth) : " fails once");
      TempDir root, drain_root;
      FaultFileSystem faulty(PosixFileSystem());
      InProcessDrain drain{.root = drain_root.path(), .fs_per_rank = {PosixFileSystem(), PosixFileSystem()}};
      drain.fs_per_rank[rank] = &faulty;
      faulty.Arm(spec);
      {
        InProcessJob job(root.path(), {PosixFileSystem(), PosixFileSystem()}, Options(), &drain);
        ASSERT_TRUE(SaveOk(job, 1)) << what;  // the commit does not depend on the drain
        const CheckpointStore drained(PosixFileSystem(), drain_root.path());
        ASSERT_TRUE(Eventually([&] { return faulty.fired() || drained.IsCommitted(kDrainRun, 1); })) << what;
        if (!faulty.fired()) {
          ASSERT_TRUE(spec.crash) << what << ": the fault never fired";
          break;  // past the drain's last operation: every crash point is covered
        }
        ++injected;
        if (!spec.crash) {
          // The failed drain is given up; the next committed step drains whole.
          ASSERT_TRUE(SaveOk(job, 2)) << what;
          ASSERT_TRUE(Drained(drain_root.path(), 2)) << what;
        }
      }
      std::vector<int64_t> visible;
      if (spec.crash) {
        faulty.SimulateCrash();
        // Visible is nothing, or (a crash after the publish's rename was durable) the
        // whole step, its state file maybe not yet rewritten.
        ASSERT_EQ(CheckVisibleState(drain_root.path(), kDrainRun, kDrainRanks, /*strict=*/false, &visible),
                  "")
            << what;
        // Restarted daemons resume the drain of step 1.
        const InProcessDrain clean{.root = drain_root.path(),
                                   .fs_per_rank = {PosixFileSystem(), PosixFileSystem()}};
        InProcessJob job(root.path(), {PosixFileSystem(), PosixFileSystem()}, Options(), &clean);
        ASSERT_TRUE(Drained(drain_root.path(), 1)) << what;
      }
      ASSERT_EQ(CheckVisibleState(drain_root.path(), kDrainRun, kDrainRanks, /*strict=*/true, &visible), "")
          << what;
      EXPECT_EQ(visible, std::vector<int64_t>{spec.crash ? 1 : 2}) << what;
      EXPECT_EQ(Leftovers(drain_root.path()), std::vector<std::string>()) << what;
    }
  }
  std::printf("drain fault suite: %d faults injected, every drain root left whole\n", injected);
}

}  // namespace
}  // namespace ckptd::testing
