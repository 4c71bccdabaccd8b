// The commit protocol under every injected file-system fault, at every step of the
// protocol, on either of two ranks, over the POSIX file system and over the confined
// one the daemon runs on: errors (ENOSPC, EIO) on each open (buffered, O_DIRECT, for
// reading), write, fsync, rename, mkdir, delete, list, stat and read; torn writes; and
// a crash at each operation followed by a restart. After each, the previous checkpoint
// must restore bit-exact, a failed step must be invisible, and the next save must
// succeed. An error in an operation the commit can do without (cleaning up, listing
// orphans) may leave the step committed, but then it must be complete. Prints one
// summary line.
#include <gtest/gtest.h>
#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "daemon/base/status.h"
#include "daemon/store/checkpoint_store.h"
#include "tests/common/temp_dir.h"
#include "tests/fault/fault_file_system.h"
#include "tests/fault/in_process_job.h"

namespace ckptd::testing {
namespace {

constexpr int kRanks = 2;
constexpr char kRun[] = "faults";

absl::StatusCode CodeFor(int err) {
  return err == ENOSPC ? absl::StatusCode::kResourceExhausted : absl::StatusCode::kDataLoss;
}

enum class Base { kPosix, kConfined };

const char* BaseName(Base base) { return base == Base::kPosix ? "posix" : "confined"; }

std::string Describe(Base base, int rank, const FaultSpec& spec) {
  const std::string where = absl::StrCat(BaseName(base), " rank ", rank, ": ");
  if (spec.crash) return absl::StrCat(where, "crash at operation ", spec.nth);
  return absl::StrCat(where, spec.torn ? "torn " : "", FsOpName(spec.op), " #", spec.nth, " fails with ",
                      spec.error == ENOSPC ? "ENOSPC" : "EIO");
}

// Operations whose failure must fail the step with the injected error's code.
bool MustFailTheStep(FsOp op) {
  return op == FsOp::kOpen || op == FsOp::kWrite || op == FsOp::kSync || op == FsOp::kRename ||
         op == FsOp::kMkdir;
}

// The file system a rank's daemon sees: the POSIX one, or one confined to `root`.
std::unique_ptr<FileSystem> MakeBase(Base base, const std::string& root) {
  if (base == Base::kPosix) return std::make_unique<FileSystemWrapper>(PosixFileSystem());
  auto confined = ConfinedFileSystem(root);
  return confined.ok() ? std::move(*confined) : nullptr;
}

// Runs one scenario; returns "" if everything held, else what broke. *lost is set
// when the previous checkpoint did not survive.
std::string RunScenario(Base base_kind, int faulty_rank, const FaultSpec& spec, bool* lost) {
  TempDir root;
  {
    InProcessJob job(root.path(), {PosixFileSystem(), PosixFileSystem()});
    for (const absl::Status& s : job.Save(kRun, 1)) {
      if (!s.ok()) return absl::StrCat("setup save failed: ", s.message());
    }
  }
  std::unique_ptr<FileSystem> base = MakeBase(base_kind, root.path());
  if (base == nullptr) return "cannot confine a file system to the test root";
  FaultFileSystem faulty(base.get());
  std::vector<FileSystem*> fs(kRanks, base.get());
  fs[faulty_rank] = &faulty;
  faulty.Arm(spec);
  std::vector<absl::Status> outcomes;
  {
    InProcessJob job(root.path(), fs);
    outcomes = job.Save(kRun, 2);
  }
  if (!faulty.fired()) return "the fault never fired";
  for (const absl::Status& s : outcomes) {
    if (s != outcomes[0])
      return absl::StrCat("trainers heard different outcomes: ", outcomes[0].ToString(), " vs ",
                          s.ToString());
  }
  if (!faulty.RetriedSyncs().empty())
    return absl::StrCat("fsync retried after failing on ", faulty.RetriedSyncs()[0]);
  const bool must_fail = !spec.crash && MustFailTheStep(spec.op);
  if (must_fail) {
    if (outcomes[0].ok()) return "an injected error went unnoticed";
    if (outcomes[0].code() != CodeFor(spec.error))
      return absl::StrCat("unexpected status ", outcomes[0].ToString());
  } else if (spec.crash) {
    faulty.SimulateCrash();
  }

  std::vector<int64_t> visible;
  std::string broken = CheckVisibleState(root.path(), kRun, kRanks, /*strict=*/!spec.crash, &visible);
  *lost = std::find(visible.begin(), visible.end(), 1) == visible.end();
  if (!broken.empty()) return broken;
  if (*lost) return "step 1 is gone";
  const bool step2_visible = std::find(visible.begin(), visible.end(), 2) != visible.end();
  if (!spec.crash && !outcomes[0].ok() && step2_visible) return "a failed step is visible";
  if (!spec.crash && outcomes[0].ok() && !step2_visible) return "a step reported committed is not visible";
  if (!spec.crash && !outcomes[0].ok()) {
    CheckpointStore store(PosixFileSystem(), root.path());
    if (PosixFileSystem()->Exists(store.TempDir(kRun, 2)))
      return "the failed step's temp directory was left behind";
  }

  // Restart: a fresh job cleans up what the fault left and saves the next step.
  {
    InProcessJob job(root.path(), {PosixFileSystem(), PosixFileSystem()});
    for (const absl::Status& s : job.Save(kRun, 3)) {
      if (!s.ok()) return absl::StrCat("save after restart failed: ", s.message());
    }
  }
  broken = CheckVisibleState(root.path(), kRun, kRanks, /*strict=*/true, &visible);
  if (!broken.empty()) return absl::StrCat("after restart: ", broken);
  auto names = PosixFileSystem()->ListDir(CheckpointStore(PosixFileSystem(), root.path()).RunDir(kRun));
  for (const std::string& name : names.value_or(std::vector<std::string>())) {
    if (name[0] == '.' || name == "checkpoint.tmp")
      return absl::StrCat("after restart: orphan ", name, " remains");
  }
  return "";
}

TEST(CommitFaultSuite, EveryFaultLeavesTheLastCheckpointIntact) {
  spdlog::set_level(spdlog::level::off);  // hundreds of expected failures; the summary says it all
  const std::vector<FsOp> kOps = {FsOp::kOpen,   FsOp::kWrite, FsOp::kSync, FsOp::kRename, FsOp::kMkdir,
                                  FsOp::kDelete, FsOp::kList,  FsOp::kStat, FsOp::kRead};
  int injected = 0, survived = 0, lost = 0;
  for (Base base_kind : {Base::kPosix, Base::kConfined}) {
    for (int rank = 0; rank < kRanks; ++rank) {
      // Count each kind of operation this rank performs in a clean commit of step 2.
      std::map<FsOp, int> counts;
      {
        TempDir root;
        std::unique_ptr<FileSystem> base = MakeBase(base_kind, root.path());
        ASSERT_NE(base, nullptr);
        FaultFileSystem counting(base.get());
        std::vector<FileSystem*> fs(kRanks, base.get());
        fs[rank] = &counting;
        InProcessJob job(root.path(), fs);
        ASSERT_TRUE(job.Save(kRun, 1)[0].ok());
        counting.Arm(FaultSpec{});
        ASSERT_TRUE(job.Save(kRun, 2)[0].ok());
        for (FsOp op : kOps) counts[op] = counting.count(op);
        counts[FsOp::kAny] = counting.count(FsOp::kAny);
      }
      ASSERT_GT(counts[FsOp::kAny], 0);
      // The O_DIRECT data file is written on every rank: its open, writes and sync
      // are among the counted operations.
      ASSERT_GT(counts[FsOp::kWrite], 0);
      std::vector<FaultSpec> faults;
      for (FsOp op : kOps) {
        for (int n = 1; n <= counts[op]; ++n) {
          for (int err : {ENOSPC, EIO}) faults.push_back({op, n, err, false, false});
        }
      }
      for (int n = 1; n <= counts[FsOp::kWrite]; ++n)
        faults.push_back({FsOp::kWrite, n, ENOSPC, true, false});
      for (int n = 1; n <= counts[FsOp::kAny]; ++n) faults.push_back({FsOp::kAny, n, EIO, false, true});

      for (const FaultSpec& spec : faults) {
        ++injected;
        bool checkpoint_lost = false;
        const std::string broken = RunScenario(base_kind, rank, spec, &checkpoint_lost);
        if (broken.empty()) {
          ++survived;
        } else {
          ADD_FAILURE() << Describe(base_kind, rank, spec) << ": " << broken;
        }
        if (checkpoint_lost) ++lost;
      }
    }
  }
  std::printf("fault suite: %d faults injected, %d survived, %d checkpoints lost\n", injected, survived,
              lost);
  EXPECT_EQ(survived, injected);
  EXPECT_EQ(lost, 0);
  EXPECT_GE(injected, 100);
}

}  // namespace
}  // namespace ckptd::testing

namespace ckptd::testing {
namespace {

// The writer production uses for data files is the one faults reach.
TEST(FaultFileSystemTest, DirectWriterIsFaultInjected) {
  TempDir dir;
  for (FsOp op : {FsOp::kOpen, FsOp::kWrite, FsOp::kSync}) {
    FaultFileSystem faulty(PosixFileSystem());
    faulty.Arm({op, 1, EIO, false, false});
    absl::Status s = [&]() -> absl::Status {
      ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, faulty.NewDirectWritableFile(dir.Sub("data")));
      RETURN_IF_ERROR(file->Append(std::string(8192, 'x')));
      RETURN_IF_ERROR(file->Sync());
      return file->Close();
    }();
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << FsOpName(op) << ": " << s;
    EXPECT_TRUE(faulty.fired()) << FsOpName(op);
  }
}

}  // namespace
}  // namespace ckptd::testing

namespace ckptd::testing {
namespace {

// A rank whose view of the root lacks what rank 0 publishes (another host's disk,
// a stale NFS cache): FileSize of anything in the step directory is NOT_FOUND.
class BlindToStepFileSystem : public FileSystemWrapper {
 public:
  BlindToStepFileSystem(FileSystem* base, std::string step_dir)
      : FileSystemWrapper(base), step_dir_(std::move(step_dir)) {}
  absl::StatusOr<uint64_t> FileSize(const std::string& path) override {
    if (path.rfind(step_dir_ + "/", 0) == 0) return absl::NotFoundError(absl::StrCat(path, ": not here"));
    return FileSystemWrapper::FileSize(path);
  }

 private:
  std::string step_dir_;
};

TEST(CommitVisibilityTest, StepARankCannotSeeAfterPublishFailsEverywhereAndIsWithdrawn) {
  spdlog::set_level(spdlog::level::off);
  TempDir root;
  {
    InProcessJob job(root.path(), {PosixFileSystem(), PosixFileSystem()});
    for (const absl::Status& s : job.Save(kRun, 1)) ASSERT_TRUE(s.ok()) << s;
  }
  BlindToStepFileSystem blind(PosixFileSystem(),
                              CheckpointStore(PosixFileSystem(), root.path()).StepDir(kRun, 2));
  std::vector<absl::Status> outcomes;
  {
    InProcessJob job(root.path(), {PosixFileSystem(), &blind});
    outcomes = job.Save(kRun, 2);
  }
  for (const absl::Status& s : outcomes) {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_NE(s.message().find("on rank 1"), absl::string_view::npos) << s;
    EXPECT_NE(s.message().find("is not visible here"), absl::string_view::npos) << s;
  }
  std::vector<int64_t> visible;
  EXPECT_EQ(CheckVisibleState(root.path(), kRun, kRanks, /*strict=*/true, &visible), "");
  EXPECT_EQ(visible, std::vector<int64_t>{1});
}

}  // namespace
}  // namespace ckptd::testing
