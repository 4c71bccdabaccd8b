// End-to-end: real daemons under mpirun, trainers as threads with their own clients
// over the daemons' unix sockets, checkpoints in a temp directory.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstring>
#include <fstream>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "daemon/base/status.h"
#include "daemon/bundle/bundle.h"
#include "daemon/store/checkpoint_store.h"
#include "tests/integration/cluster.h"
#include "tests/integration/cluster_fixture.h"

namespace ckptd::testing {
namespace {

// Tensor contents are a function of (tensor, step, global element index).
template <typename T>
T Element(const std::string& name, int64_t step, int64_t index) {
  int64_t h = static_cast<int64_t>(std::hash<std::string>()(name) % 1000);
  return static_cast<T>(h * 100000 + step * 1000 + index);
}

// Row-major values of box (start, length) of a tensor with `shape` (rank <= 2).
template <typename T>
std::vector<T> BoxValues(const std::string& name, int64_t step, const Shape& shape, const Box& box) {
  std::vector<T> out;
  const int64_t cols = shape.size() == 2 ? shape[1] : 1;
  const int64_t rows = box.rank() == 0 ? 1 : box.length[0];
  const int64_t width = box.rank() == 2 ? box.length[1] : 1;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < width; ++c) {
      const int64_t row = box.rank() == 0 ? 0 : box.start[0] + r;
      const int64_t col = box.rank() == 2 ? box.start[1] + c : 0;
      out.push_back(Element<T>(name, step, row * cols + col));
    }
  }
  return out;
}

// A shard plus the storage its data pointer refers to.
struct OwnedShard {
  TensorShard shard;
  std::shared_ptr<std::string> bytes;
};

template <typename T>
OwnedShard MakeShard(const std::string& name, int dtype, int64_t step, const Shape& shape, const Box& box) {
  std::vector<T> values = BoxValues<T>(name, step, shape, box);
  auto bytes =
      std::make_shared<std::string>(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
  return {
      {name, dtype, AsVector(shape), AsVector(box.start), AsVector(box.length), bytes->data(), bytes->size()},
      bytes};
}

absl::Status SaveShards(Client& client, const std::string& run, int64_t step, int trainer, int trainers,
                        const std::vector<OwnedShard>& owned, Transport transport = Transport::kAuto) {
  std::vector<TensorShard> shards;
  for (const OwnedShard& o : owned) shards.push_back(o.shard);
  SaveOptions options;
  options.transport = transport;
  return client.Save(run, step, trainer, trainers, shards, options).status();
}

template <typename T>
absl::StatusOr<std::vector<T>> RestoreBox(Client& client, const std::string& run, std::optional<int64_t> step,
                                          const std::string& name, int dtype, const Box& box) {
  std::vector<T> out(static_cast<size_t>(box.NumElements()));
  RestoreTarget target{.name = name,
                       .dtype = dtype,
                       .box_start = AsVector(box.start),
                       .box_length = AsVector(box.length),
                       .data = out.data(),
                       .size = out.size() * sizeof(T)};
  auto restored = client.Restore(run, step, {target});
  if (!restored.ok()) return restored.status();
  return out;
}

// Flips one bit of byte `at` of `tensor`'s stored bytes in step directory `step_dir`
// (`ranks` data files); returns the data file changed, or "" when that failed.
std::string FlipBitInTensor(const std::string& step_dir, int ranks, const std::string& tensor, int64_t at) {
  const std::string prefix = CheckpointStore::Prefix(step_dir);
  auto reader = BundleReader::Open(PosixFileSystem(), prefix);
  const tf::BundleEntryProto* entry = reader.ok() ? (*reader)->Find(tensor) : nullptr;
  if (entry == nullptr) return "";
  const std::string data_file = DataPath(prefix, entry->shard_id(), ranks);
  auto bytes = PosixFileSystem()->ReadFileToString(data_file, int64_t{1} << 30);
  if (!bytes.ok()) return "";
  (*bytes)[entry->offset() + at] ^= 0x10;
  return PosixFileSystem()->WriteFileAtomically(data_file, *bytes).ok() ? data_file : "";
}

class ClusterTest : public ClusterFixture {
 protected:
  std::string StepDir(const std::string& run, int64_t step) const {
    return CheckpointStore(PosixFileSystem(), cluster_->root()).StepDir(run, step);
  }
};

// 4 trainers on 2 daemons (trainer t on daemon t/2): "w" row-sharded over all four,
// "b" replicated on all four, "m" halves each held by one trainer per daemon, "s" a
// replicated scalar.
std::vector<OwnedShard> MixedModel(int trainer, int64_t step) {
  return {
      MakeShard<float>("w", 1, step, {8, 6}, Box{{2 * trainer, 0}, {2, 6}}),
      MakeShard<float>("b", 1, step, {6}, Box{{0}, {6}}),
      MakeShard<int64_t>("m", 9, step, {4, 4}, Box{{(trainer % 2) * 2, 0}, {2, 4}}),
      MakeShard<int32_t>("s", 3, step, {}, Box{}),
  };
}

TEST_F(ClusterTest, MixedShardedAndReplicatedSaveRestoresBitExact) {
  StartCluster(2);
  auto results = RunTrainers(4, [&](int t) -> absl::Status {
    auto client = cluster_->Connect(t / 2);
    RETURN_IF_ERROR(SaveShards(*client, "mixed", 10, t, 4, MixedModel(t, 10)));
    return client->Wait("mixed", 10);
  });
  for (int t = 0; t < 4; ++t) ASSERT_TRUE(results[t].ok()) << "trainer " << t << ": " << results[t];

  // Each distinct box is in the index exactly once, and the data files hold exactly
  // the distinct bytes: nothing replicated was written twice.
  const std::string prefix = CheckpointStore::Prefix(StepDir("mixed", 10));
  auto reader = BundleReader::Open(PosixFileSystem(), prefix);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->header().num_shards(), 2);
  EXPECT_EQ((*reader)->TensorNames(), (std::vector<std::string>{"b", "m", "s", "w"}));
  EXPECT_EQ((*reader)->Lookup("w")->pieces.size(), 4u);
  EXPECT_EQ((*reader)->Lookup("m")->pieces.size(), 2u);
  EXPECT_EQ((*reader)->Find("b")->slices_size(), 0);
  EXPECT_EQ((*reader)->Find("s")->slices_size(), 0);
  EXPECT_EQ((*reader)->entries().size(), 10u);  // w + 4 slices, m + 2 slices, b, s
  uint64_t data_bytes = 0;
  for (int shard = 0; shard < 2; ++shard)
    data_bytes += *PosixFileSystem()->FileSize(DataPath(prefix, shard, 2));
  EXPECT_EQ(data_bytes, 8u * 6 * 4 + 6 * 4 + 4 * 4 * 8 + 4);

  auto client = cluster_->Connect(1);
  auto w = RestoreBox<float>(*client, "mixed", 10, "w", 1, Box::Full({8, 6}));
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(*w, BoxValues<float>("w", 10, {8, 6}, Box::Full({8, 6})));
  // A box spanning three saved slabs.
  const Box span{{1, 2}, {5, 3}};
  auto part = RestoreBox<float>(*client, "mixed", std::nullopt, "w", 1, span);
  ASSERT_TRUE(part.ok()) << part.status();
  EXPECT_EQ(*part, BoxValues<float>("w", 10, {8, 6}, span));
  auto m = RestoreBox<int64_t>(*client, "mixed", 10, "m", 9, Box{{1, 1}, {2, 3}});
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(*m, BoxValues<int64_t>("m", 10, {4, 4}, Box{{1, 1}, {2, 3}}));
  auto s = RestoreBox<int32_t>(*client, "mixed", 10, "s", 3, Box{});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(*s, BoxValues<int32_t>("s", 10, {}, Box{}));

  std::string out;
  EXPECT_EQ(RunCommand(absl::StrCat(CKPTCTL_BINARY, " verify ", prefix), &out), 0) << out;
  EXPECT_EQ(RunCommand(absl::StrCat(CKPTCTL_BINARY, " inspect --json ", prefix), &out), 0) << out;
  EXPECT_NE(out.find("\"num_shards\": 2"), std::string::npos) << out;
}

TEST_F(ClusterTest, OverlappingBoxesFailEveryTrainerAndPublishNothing) {
  StartCluster(2);
  auto results = RunTrainers(2, [&](int t) -> absl::Status {
    auto client = cluster_->Connect(t);
    Box box = t == 0 ? Box{{0}, {3}} : Box{{2}, {2}};
    RETURN_IF_ERROR(SaveShards(*client, "overlap", 1, t, 2, {MakeShard<float>("w", 1, 1, {4}, box)}));
    return client->Wait("overlap", 1);
  });
  for (const absl::Status& s : results) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find("'w'"), absl::string_view::npos) << s;
  }
  EXPECT_EQ(results[0].message(), results[1].message());
  // Nothing visible, nothing left behind.
  auto names = PosixFileSystem()->ListDir(JoinPath(cluster_->root(), "overlap"));
  EXPECT_TRUE(!names.ok() || names->empty());
  auto client = cluster_->Connect(0);
  EXPECT_EQ(client->ListCheckpoints("overlap")->checkpoints_size(), 0);
  EXPECT_EQ(RestoreBox<float>(*client, "overlap", std::nullopt, "w", 1, Box::Full({4})).status().code(),
            absl::StatusCode::kNotFound);

  // The daemons keep serving: a correct save of the same run succeeds.
  auto retry = RunTrainers(2, [&](int t) -> absl::Status {
    auto c = cluster_->Connect(t);
    RETURN_IF_ERROR(
        SaveShards(*c, "overlap", 2, t, 2, {MakeShard<float>("w", 1, 2, {4}, Box{{2 * t}, {2}})}));
    return c->Wait("overlap", 2);
  });
  for (const absl::Status& s : retry) EXPECT_TRUE(s.ok()) << s;
}

TEST_F(ClusterTest, CheckpointStateFileAfterThreeSteps) {
  StartCluster(2);
  for (int64_t step : {100, 200, 300}) {
    auto results = RunTrainers(2, [&](int t) -> absl::Status {
      auto client = cluster_->Connect(t);
      RETURN_IF_ERROR(SaveShards(*client, "state", step, t, 2,
                                 {MakeShard<float>("v", 1, step, {4, 2}, Box{{2 * t, 0}, {2, 2}})}));
      return client->Wait("state", step);
    });
    for (const absl::Status& s : results) ASSERT_TRUE(s.ok()) << s;
  }
  auto text =
      PosixFileSystem()->ReadFileToString(JoinPath(JoinPath(cluster_->root(), "state"), "checkpoint"), 4096);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text,
            "model_checkpoint_path: \"step-00000300/ckpt\"\n"
            "all_model_checkpoint_paths: \"step-00000100/ckpt\"\n"
            "all_model_checkpoint_paths: \"step-00000200/ckpt\"\n"
            "all_model_checkpoint_paths: \"step-00000300/ckpt\"\n");
  std::string out;
  ASSERT_EQ(
      RunCommand(absl::StrCat(CKPTCTL_BINARY, " ls --json ", JoinPath(cluster_->root(), "state")), &out), 0)
      << out;
  for (const char* step : {"\"step\": 100", "\"step\": 200", "\"step\": 300"}) {
    EXPECT_NE(out.find(step), std::string::npos) << out;
  }
  auto client = cluster_->Connect(0);
  auto list = client->ListCheckpoints("state");
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->checkpoints_size(), 3);
  EXPECT_EQ(list->checkpoints(2).step(), 300);
  std::vector<float> v(8);
  auto step = client->Restore(
      "state", std::nullopt,
      {RestoreTarget{.name = "v", .dtype = 1, .shape = {4, 2}, .data = v.data(), .size = 32}});
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, 300);
  EXPECT_EQ(v, BoxValues<float>("v", 300, {4, 2}, Box::Full({4, 2})));
  // Wait on a committed step answers at once; saving it again is refused.
  EXPECT_TRUE(client->Wait("state", 200).ok());
  EXPECT_EQ(
      SaveShards(*client, "state", 200, 0, 2, {MakeShard<float>("v", 1, 200, {4, 2}, Box{{0, 0}, {2, 2}})})
          .code(),
      absl::StatusCode::kAlreadyExists);
}

TEST_F(ClusterTest, BadInputIsInvalidArgumentAndNothingIsWritten) {
  StartCluster(2);
  auto client = cluster_->Connect(0);
  struct Case {
    std::string what;
    std::string run;
    std::vector<OwnedShard> shards;
    std::string field;
  };
  auto good = [](const std::string& name) { return MakeShard<float>(name, 1, 1, {4}, Box{{0}, {4}}); };
  OwnedShard negative = good("neg");
  negative.shard.shape = {-4};
  OwnedShard bad_dtype = good("dt");
  bad_dtype.shard.dtype = 99;
  OwnedShard string_dtype = good("str");
  string_dtype.shard.dtype = 7;
  OwnedShard outside = good("out");
  outside.shard.box_start = {2};
  OwnedShard short_bytes = good("short");
  short_bytes.shard.size -= 4;
  OwnedShard long_bytes = good("long");
  auto longer = std::make_shared<std::string>(*long_bytes.bytes + "xxxx");
  long_bytes.shard.data = longer->data();
  long_bytes.shard.size = longer->size();
  long_bytes.bytes = longer;
  OwnedShard huge = good("huge");  // 4 TiB declared, nothing sent: nothing may be allocated
  huge.shard.shape = {int64_t{1} << 40};
  huge.shard.box_start = {0};
  huge.shard.box_length = {int64_t{1} << 40};
  huge.shard.size = 0;
  std::vector<Case> cases = {
      {"negative dim", "r", {negative}, "shape"},
      {"unknown dtype", "r", {bad_dtype}, "dtype"},
      {"string dtype", "r", {string_dtype}, "dtype"},
      {"box outside shape", "r", {outside}, "box"},
      {"too few bytes", "r", {short_bytes}, "data"},
      {"too many bytes", "r", {long_bytes}, "data"},
      {"duplicate name", "r", {good("dup"), good("dup")}, "name"},
      {"slash in run", "a/b", {good("x")}, "run"},
      {"dot-dot run", "..", {good("x")}, "run"},
      {"NUL in run", std::string("a\0b", 3), {good("x")}, "run"},
      {"long run", std::string(129, 'r'), {good("x")}, "run"},
  };
  for (Transport transport : {Transport::kStream, Transport::kSharedMemory}) {
    for (const Case& c : cases) {
      absl::Status s = SaveShards(*client, c.run, 1, 0, 1, c.shards, transport);
      // A segment's size is checked against the descriptors before any byte is read.
      const std::string field =
          transport == Transport::kSharedMemory && c.field == "data" ? "shared_memory.size" : c.field;
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.what << ": " << s;
      EXPECT_NE(s.message().find(field), absl::string_view::npos) << c.what << ": " << s;
    }
  }
  // Declared sizes past the limits are refused before anything is allocated, 2^62
  // bytes included.
  absl::Status too_big = SaveShards(*client, "r", 1, 0, 1, {huge});
  EXPECT_EQ(too_big.code(), absl::StatusCode::kResourceExhausted) << too_big;
  EXPECT_NE(too_big.message().find("max_request_bytes"), absl::string_view::npos) << too_big;
  huge.shard.shape = {int64_t{1} << 59};  // x 8 bytes = 2^62
  huge.shard.dtype = kDtInt64;
  huge.shard.box_length = {int64_t{1} << 59};
  EXPECT_EQ(SaveShards(*client, "r", 1, 0, 1, {huge}).code(), absl::StatusCode::kResourceExhausted);
  // Nothing was written and the daemon still serves: the root holds only the daemons'
  // own lock files.
  auto names = PosixFileSystem()->ListDir(cluster_->root());
  ASSERT_TRUE(names.ok());
  std::sort(names->begin(), names->end());
  EXPECT_EQ(*names, (std::vector<std::string>{".ckptd-rank-0.lock", ".ckptd-rank-1.lock"}));
  auto status = client->Status();
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->pending_steps_size(), 0);
  // The socket directory admits only the daemon's user.
  struct stat st;
  ASSERT_EQ(::stat(DirName(cluster_->Address(0)).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  EXPECT_EQ(status->bytes_staged(), 0);
}

TEST_F(ClusterTest, RestoreErrorsNameTheProblem) {
  StartCluster(2);
  auto results = RunTrainers(2, [&](int t) -> absl::Status {
    auto client = cluster_->Connect(t);
    RETURN_IF_ERROR(SaveShards(*client, "errs", 5, t, 2,
                               {MakeShard<float>("w", 1, 5, {4, 4}, Box{{2 * t, 0}, {2, 4}}),
                                MakeShard<int64_t>("n", 9, 5, {3}, Box{{0}, {3}})}));
    return client->Wait("errs", 5);
  });
  for (const absl::Status& s : results) ASSERT_TRUE(s.ok()) << s;
  auto client = cluster_->Connect(0);
  EXPECT_EQ(RestoreBox<float>(*client, "errs", 5, "nope", 0, Box{}).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(RestoreBox<float>(*client, "errs", 6, "w", 1, Box::Full({4, 4})).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(RestoreBox<float>(*client, "errs", 5, "w", 9, Box::Full({4, 4})).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RestoreBox<float>(*client, "errs", 5, "w", 1, Box{{3, 0}, {2, 4}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<float> wrong_shape(16);
  EXPECT_EQ(
      client
          ->Restore(
              "errs", 5,
              {RestoreTarget{.name = "w", .dtype = 1, .shape = {16}, .data = wrong_shape.data(), .size = 64}})
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument);

  // Flip one byte of "n" in its data file: DATA_LOSS naming the tensor and the file,
  // and ckptctl verify exits 1 naming it.
  const std::string data_file = FlipBitInTensor(StepDir("errs", 5), 2, "n", 1);
  ASSERT_FALSE(data_file.empty());
  absl::Status loss = RestoreBox<int64_t>(*client, "errs", 5, "n", 9, Box::Full({3})).status();
  EXPECT_EQ(loss.code(), absl::StatusCode::kDataLoss) << loss;
  EXPECT_NE(loss.message().find("'n'"), absl::string_view::npos) << loss;
  EXPECT_NE(loss.message().find(data_file.substr(data_file.rfind('/') + 1)), absl::string_view::npos) << loss;
  std::string out;
  EXPECT_EQ(
      RunCommand(absl::StrCat(CKPTCTL_BINARY, " verify ", CheckpointStore::Prefix(StepDir("errs", 5))), &out),
      1)
      << out;
  EXPECT_NE(out.find("'n'"), std::string::npos) << out;
  // The other tensor is still readable.
  EXPECT_TRUE(RestoreBox<float>(*client, "errs", 5, "w", 1, Box::Full({4, 4})).ok());
}

TEST_F(ClusterTest, BarrierReleasesOnlyWhenEveryTrainerArrives) {
  StartCluster(2);
  // Three of four trainers: nobody is released before the deadline.
  auto partial = RunTrainers(3, [&](int t) -> absl::Status {
    return cluster_->Connect(t % 2)->Barrier("bar", t, 4, absl::Milliseconds(500));
  });
  for (const absl::Status& s : partial) {
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
    EXPECT_TRUE(IsClientTimeout(s)) << s;  // the trainers' own 500 ms, not the daemon's verdict
  }
  auto all = RunTrainers(4, [&](int t) -> absl::Status {
    auto client = cluster_->Connect(t % 2);
    RETURN_IF_ERROR(client->Barrier("bar2", t, 4));
    return client->Barrier("bar2", t, 4);
  });
  for (const absl::Status& s : all) EXPECT_TRUE(s.ok()) << s;
}

TEST(ClientTimeoutTest, AClientSideTimeoutIsToldApartFromAStepThatFailedItsDeadline) {
  Cluster cluster(1, "", {"--commit-timeout", "1s"});
  ASSERT_TRUE(cluster.Start().ok());
  auto client = cluster.Connect(0);
  // Trainer 0 of 2 saves; trainer 1 never comes: the daemon fails the step at 1 s.
  const float value = 1;
  TensorShard shard{.name = "w", .dtype = kDtFloat, .shape = {1}, .data = &value, .size = sizeof(value)};
  ASSERT_TRUE(client->Save("told", 1, 0, 2, {shard}).ok());
  const absl::Status failed = client->Wait("told", 1, absl::Minutes(1));
  EXPECT_EQ(failed.code(), absl::StatusCode::kDeadlineExceeded) << failed;
  EXPECT_FALSE(IsClientTimeout(failed)) << failed;
  EXPECT_NE(failed.message().find("missing trainer(s) 1"), absl::string_view::npos) << failed;
  // Nobody saves step 2: only the call's own 300 ms pass.
  const absl::Status timed_out = client->Wait("told", 2, absl::Milliseconds(300));
  EXPECT_EQ(timed_out.code(), absl::StatusCode::kDeadlineExceeded) << timed_out;
  EXPECT_TRUE(IsClientTimeout(timed_out)) << timed_out;
  EXPECT_EQ(cluster.Stop(), 0);
}

TEST_F(ClusterTest, ThreeDaemonsWriteEachBoxOnceAndRestoreAcrossThem) {
  StartCluster(3);
  auto results = RunTrainers(3, [&](int t) -> absl::Status {
    auto client = cluster_->Connect(t);
    RETURN_IF_ERROR(SaveShards(*client, "three", 1, t, 3,
                               {MakeShard<float>("w", 1, 1, {9, 4}, Box{{3 * t, 0}, {3, 4}}),
                                MakeShard<double>("r", 2, 1, {5}, Box{{0}, {5}})}));
    return client->Wait("three", 1);
  });
  for (const absl::Status& s : results) ASSERT_TRUE(s.ok()) << s;
  const std::string prefix = CheckpointStore::Prefix(StepDir("three", 1));
  uint64_t data_bytes = 0;
  for (int shard = 0; shard < 3; ++shard)
    data_bytes += *PosixFileSystem()->FileSize(DataPath(prefix, shard, 3));
  EXPECT_EQ(data_bytes, 9u * 4 * 4 + 5 * 8);
  for (int rank = 0; rank < 3; ++rank) {
    auto client = cluster_->Connect(rank);
    const Box span{{1, 1}, {7, 2}};
    auto w = RestoreBox<float>(*client, "three", 1, "w", 1, span);
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_EQ(*w, BoxValues<float>("w", 1, {9, 4}, span));
    auto r = RestoreBox<double>(*client, "three", 1, "r", 2, Box::Full({5}));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(*r, BoxValues<double>("r", 1, {5}, Box::Full({5})));
  }
}

// A streamed restore without fallback goes out while it is read, a group of about
// 64 MiB at a time: "a" (64 MiB) is one group, "b" and "c" the next. Its bytes arrive
// whole, and the bytes read from storage come in the trailer. When "c" fails its
// checksum, "a" has already been delivered and the call ends with DATA_LOSS naming
// "c"; a shared-memory restore of the same step fails alike, and with
// keep_targets_on_failure leaves the targets as they were.
TEST(StreamedRestoreTest, IsSentWhileReadAndAChecksumFailureLaterInItEndsItWithDataLoss) {
  Cluster cluster(1);
  ASSERT_TRUE(cluster.Start().ok());
  auto client = cluster.Connect(0);
  const std::vector<std::pair<std::string, size_t>> sizes = {
      {"a", 64 << 20}, {"b", 64 << 10}, {"c", 64 << 10}};
  std::vector<std::string> saved;
  std::vector<TensorShard> shards;
  for (const auto& [name, size] : sizes) {
    saved.emplace_back(size, '\0');
    for (size_t i = 0; i < size; i += 4096) saved.back()[i] = static_cast<char>(name[0] + i / 4096);
    shards.push_back({.name = name,
                      .dtype = kDtUint8,
                      .shape = {static_cast<int64_t>(size)},
                      .data = saved.back().data(),
                      .size = size});
  }
  for (int64_t step : {1, 2}) {
    ASSERT_TRUE(client->Save("piped", step, 0, 1, shards).ok());
    ASSERT_TRUE(client->Wait("piped", step).ok());
  }
  std::vector<std::string> back;
  std::vector<RestoreTarget> targets;
  for (const auto& [name, size] : sizes) back.emplace_back(size, 'x');
  for (size_t i = 0; i < sizes.size(); ++i) {
    targets.push_back({.name = sizes[i].first, .dtype = 0, .data = back[i].data(), .size = back[i].size()});
  }
  RestoreStats stats;
  RestoreOptions options{.stats = &stats, .transport = Transport::kStream};
  ASSERT_TRUE(client->Restore("piped", 1, targets, options).ok());
  EXPECT_TRUE(back == saved);
  int64_t total = 0;
  for (const auto& [name, size] : sizes) total += static_cast<int64_t>(size);
  EXPECT_GE(stats.storage_bytes_read, total);  // from the trailer: the header went out first
  EXPECT_EQ(stats.bytes_delivered, total);

  // Step 2, never read yet (so no cache holds it): one flipped bit in "c".
  ASSERT_FALSE(
      FlipBitInTensor(CheckpointStore(PosixFileSystem(), cluster.root()).StepDir("piped", 2), 1, "c", 5)
          .empty());

  auto stub = v1::Ckptd::NewStub(
      grpc::CreateCustomChannel("unix:" + cluster.Address(0), grpc::InsecureChannelCredentials(), [] {
        grpc::ChannelArguments args;
        args.SetMaxReceiveMessageSize(64 << 20);
        return args;
      }()));
  grpc::ClientContext ctx;
  v1::RestoreRequest request;
  request.set_run("piped");
  request.set_step(2);
  for (const auto& [name, size] : sizes) request.add_tensors()->set_name(name);
  auto stream = stub->Restore(&ctx, request);
  v1::RestoreResponse message;
  int headers = 0;
  int64_t received_a = 0;
  while (stream->Read(&message)) {
    if (message.has_header()) ++headers;
    if (message.has_chunk() && message.chunk().tensor_index() == 0)
      received_a += message.chunk().data().size();
  }
  const grpc::Status status = stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DATA_LOSS) << status.error_message();
  EXPECT_NE(status.error_message().find("'c'"), std::string::npos) << status.error_message();
  EXPECT_EQ(headers, 1);
  EXPECT_EQ(received_a, 64 << 20);

  // Over shared memory the same failure, asked to keep the targets, leaves them as they were.
  for (std::string& b : back) std::fill(b.begin(), b.end(), 'y');
  options.transport = Transport::kSharedMemory;
  options.keep_targets_on_failure = true;
  EXPECT_EQ(client->Restore("piped", 2, targets, options).status().code(), absl::StatusCode::kDataLoss);
  for (const std::string& b : back) EXPECT_EQ(b.find_first_not_of('y'), std::string::npos);
  // Without it, "a" (read and verified before "c" failed) may already be in place; "c" is not.
  options.keep_targets_on_failure = false;
  EXPECT_EQ(client->Restore("piped", 2, targets, options).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(back[0] == saved[0] || back[0].find_first_not_of('y') == std::string::npos);
  EXPECT_EQ(back[2].find_first_not_of('y'), std::string::npos);
  ASSERT_EQ(cluster.Stop(), 0);
}

// A streamed restore holds staging memory for about two groups, not for the whole
// reply: with 96 MiB of staging, 120 MiB in three tensors restore over the stream (the
// read of the second group waits until the first is sent), bit-exact. With fallback,
// which holds the whole reply, the same restore is refused at once.
TEST(StreamedRestoreTest, NeedsStagingForAboutTwoGroupsNotTheWholeReply) {
  Cluster cluster(1);
  ASSERT_TRUE(cluster.Start().ok());
  constexpr size_t kTensor = 40 << 20;
  std::vector<std::string> saved;
  std::vector<TensorShard> shards;
  for (const char* name : {"x", "y", "z"}) {
    saved.emplace_back(kTensor, name[0]);
    saved.back()[12345] = '!';
    shards.push_back({.name = name,
                      .dtype = kDtUint8,
                      .shape = {int64_t{kTensor}},
                      .data = saved.back().data(),
                      .size = kTensor});
  }
  {
    auto client = cluster.Connect(0);
    ASSERT_TRUE(client->Save("budget", 1, 0, 1, shards).ok());
    ASSERT_TRUE(client->Wait("budget", 1).ok());
  }
  ASSERT_EQ(cluster.Stop(), 0);
  const std::string config = cluster.dir() + "/small-staging.yaml";
  std::ofstream(config) << "staging:\n  memory_limit: " << (96 << 20) << "\n";
  cluster.AddArgs({"--config", config});
  ASSERT_TRUE(cluster.Start().ok());
  auto client = cluster.Connect(0);
  std::vector<std::string> back(3, std::string(kTensor, '\0'));
  std::vector<RestoreTarget> targets;
  for (size_t i = 0; i < 3; ++i) {
    targets.push_back({.name = shards[i].name, .dtype = 0, .data = back[i].data(), .size = kTensor});
  }
  RestoreOptions stream{.transport = Transport::kStream};
  absl::StatusOr<int64_t> restored = client->Restore("budget", 1, targets, stream);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_TRUE(back == saved);
  // With fallback the whole reply must be read before anything is sent: refused at
  // once, naming the limit, rather than waiting for room that never comes.
  auto stub = v1::Ckptd::NewStub(
      grpc::CreateChannel("unix:" + cluster.Address(0), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  v1::RestoreRequest request;
  request.set_run("budget");
  request.set_latest(true);
  request.set_fallback(true);
  for (const TensorShard& s : shards) request.add_tensors()->set_name(s.name);
  auto replies = stub->Restore(&ctx, request);
  v1::RestoreResponse reply;
  int messages = 0;
  while (replies->Read(&reply)) ++messages;
  const grpc::Status refused = replies->Finish();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << refused.error_message();
  EXPECT_NE(refused.error_message().find("staging.memory_limit"), std::string::npos)
      << refused.error_message();
  EXPECT_EQ(messages, 0);
  ASSERT_EQ(cluster.Stop(), 0);
}

}  // namespace
}  // namespace ckptd::testing
