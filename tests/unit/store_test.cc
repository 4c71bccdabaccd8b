#include <gtest/gtest.h>
#include <unistd.h>

#include "daemon/bundle/bundle.h"
#include "daemon/store/checkpoint_store.h"
#include "tests/common/temp_dir.h"

namespace ckptd {
namespace {

// Makes <root>/run/step-N look committed (an index file is what counts).
void FakeStep(const CheckpointStore& store, int64_t step) {
  const std::string dir = store.StepDir("run", step);
  ASSERT_TRUE(store.fs()->CreateDirs(dir, 0755).ok());
  ASSERT_TRUE(store.fs()->WriteFileAtomically(IndexPath(CheckpointStore::Prefix(dir)), "x").ok());
}

TEST(CheckpointStoreTest, RetentionKeepsNewestLastEveryKthAndProtected) {
  testing::TempDir root;
  CheckpointStore store(PosixFileSystem(), root.path());
  for (int64_t step : {1, 2, 3, 4, 5, 6, 7, 8}) FakeStep(store, step);
  auto dry = store.ApplyRetention("run", 2, 3, {1}, /*dry_run=*/true);
  ASSERT_TRUE(dry.ok());
  EXPECT_EQ(*dry, (std::vector<int64_t>{2, 4, 5}));  // keeps 1 (restoring), 3, 6 (every 3rd), 7, 8 (last 2)
  EXPECT_EQ(store.ListSteps("run")->size(), 8u);
  auto removed = store.ApplyRetention("run", 2, 3, {1}, false);
  ASSERT_TRUE(removed.ok());
  EXPECT_EQ(*store.ListSteps("run"), (std::vector<int64_t>{1, 3, 6, 7, 8}));
  auto state =
      ParseCheckpointState(*store.fs()->ReadFileToString(JoinPath(store.RunDir("run"), "checkpoint"), 4096));
  ASSERT_TRUE(state.ok());
  EXPECT_EQ(state->model_checkpoint_path, "step-00000008/ckpt");
  EXPECT_EQ(state->all_model_checkpoint_paths.size(), 5u);
  // keep_last 1 still keeps the newest; nothing is left half-deleted.
  ASSERT_TRUE(store.ApplyRetention("run", 1, 0, {}, false).ok());
  EXPECT_EQ(*store.ListSteps("run"), (std::vector<int64_t>{8}));
  const auto names = store.fs()->ListDir(store.RunDir("run"));
  ASSERT_TRUE(names.ok());
  for (const std::string& name : *names) {
    EXPECT_NE(name.rfind(".deleted-", 0), 0u) << name;
  }
}

TEST(CheckpointStoreTest, RemoveOrphansTakesTempDirsAndHalfWrittenStateOnly) {
  testing::TempDir root;
  CheckpointStore store(PosixFileSystem(), root.path());
  FakeStep(store, 1);
  ASSERT_TRUE(store.fs()->CreateDirs(store.TempDir("run", 2), 0755).ok());
  ASSERT_TRUE(store.fs()->WriteFileAtomically(JoinPath(store.RunDir("run"), "checkpoint.tmp"), "half").ok());
  auto removed = store.RemoveOrphans("run");
  ASSERT_TRUE(removed.ok());
  EXPECT_EQ(removed->size(), 2u);
  EXPECT_EQ(*store.ListSteps("run"), (std::vector<int64_t>{1}));
  EXPECT_FALSE(store.fs()->Exists(store.TempDir("run", 2)));
}

TEST(CheckpointStoreTest, ALostStepIsRememberedWithWhyUntilItIsCommittedAgain) {
  testing::TempDir root;
  CheckpointStore store(PosixFileSystem(), root.path());
  FakeStep(store, 1);
  ASSERT_TRUE(store.MarkLost("run", 3, "no host holds rank 1's data file").ok());
  ASSERT_TRUE(store.MarkLost("run", 2, "gone").ok());
  EXPECT_EQ(*store.LostSteps("run"), (std::vector<std::pair<int64_t, std::string>>{
                                         {2, "gone"}, {3, "no host holds rank 1's data file"}}));
  // Neither a step, nor a run, nor an orphan.
  EXPECT_EQ(*store.ListSteps("run"), (std::vector<int64_t>{1}));
  EXPECT_EQ(*store.ListRuns(), (std::vector<std::string>{"run"}));
  EXPECT_TRUE(store.RemoveOrphans("run")->empty());
  ASSERT_TRUE(store.ClearLost("run", 3).ok());
  ASSERT_TRUE(store.ClearLost("run", 3).ok());  // clearing what is not there is fine
  EXPECT_EQ(store.LostSteps("run")->size(), 1u);
  EXPECT_TRUE(store.LostSteps("other")->empty());
}

}  // namespace
}  // namespace ckptd

namespace ckptd {
namespace {

TEST(ConfinedFileSystemTest, NeverLeavesTheRoot) {
  testing::TempDir root, outside;
  auto fs = ConfinedFileSystem(root.path());
  ASSERT_TRUE(fs.ok()) << fs.status();
  const std::string link = JoinPath(root.path(), "link");
  ASSERT_EQ(::symlink(outside.path().c_str(), link.c_str()), 0);
  ASSERT_TRUE(PosixFileSystem()->WriteFileAtomically(JoinPath(outside.path(), "secret"), "s").ok());

  EXPECT_FALSE((*fs)->NewWritableFile(JoinPath(link, "x")).ok());
  EXPECT_FALSE((*fs)->NewRandomAccessFile(JoinPath(link, "secret")).ok());
  EXPECT_FALSE((*fs)->CreateDir(JoinPath(link, "d"), 0755).ok());
  EXPECT_FALSE((*fs)->ListDir(link).ok());
  EXPECT_FALSE((*fs)->IsDirectory(link));
  EXPECT_EQ((*fs)->NewRandomAccessFile("/etc/passwd").status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ((*fs)->NewWritableFile(JoinPath(root.path(), "../escape")).status().code(),
            absl::StatusCode::kPermissionDenied);
  // Removing the link removes the link, not what it points to.
  EXPECT_TRUE((*fs)->DeleteRecursively(link).ok());
  EXPECT_TRUE(PosixFileSystem()->Exists(JoinPath(outside.path(), "secret")));
  // A symlink planted where a file will be created is replaced, not written through.
  const std::string target = JoinPath(root.path(), "f");
  ASSERT_EQ(::symlink(JoinPath(outside.path(), "secret").c_str(), target.c_str()), 0);
  auto file = (*fs)->NewWritableFile(target);
  ASSERT_TRUE(file.ok());
  ASSERT_TRUE((*file)->Append("mine").ok());
  ASSERT_TRUE((*file)->Close().ok());
  EXPECT_EQ(*PosixFileSystem()->ReadFileToString(JoinPath(outside.path(), "secret"), 16), "s");
  // Ordinary work beneath the root.
  ASSERT_TRUE((*fs)->CreateDirs(JoinPath(root.path(), "a/b"), 0755).ok());
  ASSERT_TRUE((*fs)->WriteFileAtomically(JoinPath(root.path(), "a/b/c"), "data").ok());
  EXPECT_EQ(*(*fs)->ReadFileToString(JoinPath(root.path(), "a/b/c"), 16), "data");
  EXPECT_TRUE((*fs)->DeleteRecursively(JoinPath(root.path(), "a")).ok());
  EXPECT_FALSE((*fs)->Exists(JoinPath(root.path(), "a")));
}

}  // namespace
}  // namespace ckptd
