// Meshes, layouts and resharding end to end: a checkpoint saved on mesh x=2,y=4 over
// 2 daemons with mixed layouts restores bit-exact onto other meshes, layouts and host
// counts; dtype conversion, trainer state, mesh checks and writer balance.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/base/status.h"
#include "daemon/bundle/bundle.h"
#include "daemon/layout/cast.h"
#include "daemon/layout/mesh.h"
#include "daemon/store/checkpoint_store.h"
#include "tests/integration/cluster.h"

namespace ckptd::testing {
namespace {

struct Spec {
  std::string name;
  int dtype;
  size_t element_size;
  Shape shape;
  std::vector<std::string> saved_specs;  // layout on the saving mesh x=2,y=4
};

const std::vector<Spec>& Model() {
  static const std::vector<Spec> model = {
      {"a/f32", kDtFloat, 4, {24, 48}, {"x", "y"}},
      {"b/bf16", kDtBfloat16, 2, {24, 16}, {"unsharded", "y"}},
      {"c/i8", kDtInt8, 1, {48}, {"x"}},
      {"d/i64", kDtInt64, 8, {16, 6}, {"y", "unsharded"}},
      {"e/bool", kDtBool, 1, {24}, {"unsharded"}},
      {"f/f16", kDtHalf, 2, {12, 24}, {"x", "y"}},
      {"g/scalar", kDtFloat, 4, {}, {}},
  };
  return model;
}

// Element bytes are a hash of (tensor, global row-major index); bools are 0 or 1.
std::string BoxBytes(const Spec& t, const Box& box) {
  uint64_t seed = std::hash<std::string>()(t.name);
  std::string out;
  const int64_t n = box.NumElements();
  std::vector<int64_t> idx(box.rank(), 0);
  for (int64_t e = 0; e < n; ++e) {
    int64_t global = 0;
    for (size_t d = 0; d < box.rank(); ++d) global = global * t.shape[d] + box.start[d] + idx[d];
    uint64_t x = (static_cast<uint64_t>(global) + 1) * 0x9E3779B97F4A7C15ull ^ seed;
    x ^= x >> 31;
    if (t.dtype == kDtBool) x &= 1;
    out.append(reinterpret_cast<const char*>(&x), t.element_size);
    for (size_t d = box.rank(); d > 0; --d) {
      if (++idx[d - 1] < box.length[d - 1]) break;
      idx[d - 1] = 0;
    }
  }
  return out;
}

// A mesh string as trainer `devices` would send it (its own local ids and devices).
std::string MeshFor(const std::string& dims, int64_t size, const std::vector<int64_t>& devices) {
  std::vector<int64_t> all(size);
  std::iota(all.begin(), all.end(), 0);
  std::vector<std::string> names;
  for (int64_t d : devices) names.push_back(absl::StrCat("/job:localhost/replica:0/task:0/device:CPU:", d));
  return absl::StrCat("|", dims, "|", absl::StrJoin(all, ","), "|", absl::StrJoin(devices, ","), "|",
                      absl::StrJoin(names, ","));
}

std::vector<int64_t> DevicesOf(int trainer, int per_trainer) {
  std::vector<int64_t> d;
  for (int i = 0; i < per_trainer; ++i) d.push_back(trainer * per_trainer + i);
  return d;
}

// Restores every model tensor with `specs` onto a mesh and checks each device's bytes.
absl::Status RestoreAndCheck(Client& client, const std::string& run, int trainer, const std::string& mesh,
                             const std::vector<int64_t>& devices,
                             const std::vector<std::vector<std::string>>& specs) {
  auto parsed = ParseMesh(mesh);
  if (!parsed.ok()) return parsed.status();
  NamedTensors tensors;
  std::vector<std::vector<std::string>> buffers(Model().size());
  std::vector<std::vector<Box>> boxes(Model().size());
  for (size_t i = 0; i < Model().size(); ++i) {
    const Spec& t = Model()[i];
    ASSIGN_OR_RETURN(Layout layout, MakeLayout(specs[i], *parsed));
    NamedTensor named{t.dtype, AsVector(t.shape), specs[i], {}};
    for (int64_t d : devices) {
      ASSIGN_OR_RETURN(Box box, layout.BoxFor(t.shape, d));
      boxes[i].push_back(box);
      buffers[i].push_back(std::string(static_cast<size_t>(box.NumElements()) * t.element_size, '\xee'));
    }
    for (std::string& b : buffers[i]) named.device_data.emplace_back(b.data(), b.size());
    tensors.emplace_back(t.name, std::move(named));
  }
  RestoreOptions options;
  options.mesh = mesh;
  options.device_ids = devices;
  options.trainer_id = trainer;
  auto step = client.RestoreByName(run, std::nullopt, tensors, options);
  if (!step.ok()) return step.status();
  for (size_t i = 0; i < Model().size(); ++i) {
    for (size_t d = 0; d < devices.size(); ++d) {
      if (buffers[i][d] != BoxBytes(Model()[i], boxes[i][d])) {
        return absl::DataLossError(absl::StrCat("trainer ", trainer, ": ", Model()[i].name, " on device ",
                                                devices[d], " box ", boxes[i][d].ToString(), " differs"));
      }
    }
  }
  return absl::OkStatus();
}

class ReshardTest : public ::testing::Test {
 protected:
  static constexpr char kRun[] = "reshard";
  static constexpr char kSaveDims[] = "x=2,y=4";

  // Saves the model at step 1 on mesh x=2,y=4: 4 trainers with 2 devices each, 2 per daemon.
  void SetUp() override {
    saver_ = std::make_unique<Cluster>(2, root_.path());
    ASSERT_TRUE(saver_->Start().ok());
    auto results = RunTrainers(4, [&](int t) -> absl::Status {
      auto client = saver_->Connect(t / 2);
      const std::vector<int64_t> devices = DevicesOf(t, 2);
      const std::string mesh = MeshFor(kSaveDims, 8, devices);
      ASSIGN_OR_RETURN(Mesh parsed, ParseMesh(mesh));
      std::vector<std::string> storage;
      storage.reserve(Model().size() * devices.size());
      NamedTensors tensors;
      for (const Spec& s : Model()) {
        ASSIGN_OR_RETURN(Layout layout, MakeLayout(s.saved_specs, parsed));
        NamedTensor named{s.dtype, AsVector(s.shape), s.saved_specs, {}};
        for (int64_t d : devices) {
          ASSIGN_OR_RETURN(Box box, layout.BoxFor(s.shape, d));
          storage.push_back(BoxBytes(s, box));
          named.device_data.emplace_back(storage.back().data(), storage.back().size());
        }
        tensors.emplace_back(s.name, std::move(named));
      }
      SaveOptions options;
      options.mesh = mesh;
      options.device_ids = devices;
      options.trainer_state = {{"iterator", absl::StrCat("position-", t * 1000)},
                               {"rng", std::string("\0\x01\xff", 3) + std::to_string(t)}};
      RETURN_IF_ERROR(client->SaveByName(kRun, 1, t, 4, tensors, options).status());
      return client->Wait(kRun, 1);
    });
    for (int t = 0; t < 4; ++t) ASSERT_TRUE(results[t].ok()) << "trainer " << t << ": " << results[t];
  }

  void TearDown() override {
    if (saver_ != nullptr) {
      EXPECT_EQ(saver_->Stop(), 0);
    }
  }

  // Another job may restore from the root only once the saver's daemons are gone:
  // one daemon per rank and root.
  void StopSaver() {
    EXPECT_EQ(saver_->Stop(), 0);
    saver_.reset();
  }

  std::string Prefix() const {
    return CheckpointStore::Prefix(CheckpointStore(PosixFileSystem(), root_.path()).StepDir(kRun, 1));
  }

  TempDir root_;
  std::unique_ptr<Cluster> saver_;
};

std::vector<std::vector<std::string>> SavedSpecs() {
  std::vector<std::vector<std::string>> specs;
  for (const Spec& s : Model()) specs.push_back(s.saved_specs);
  return specs;
}

TEST_F(ReshardTest, RestoresOnThreeDaemonsWithMeshX3Y2) {
  StopSaver();
  Cluster three(3, root_.path());
  ASSERT_TRUE(three.Start().ok());
  const std::vector<std::vector<std::string>> specs = {
      {"x", "y"}, {"unsharded", "y"}, {"x"}, {"y", "unsharded"}, {"unsharded"}, {"x", "y"}, {}};
  auto results = RunTrainers(3, [&](int t) -> absl::Status {
    auto client = three.Connect(t);
    const std::vector<int64_t> devices = DevicesOf(t, 2);
    return RestoreAndCheck(*client, kRun, t, MeshFor("x=3,y=2", 6, devices), devices, specs);
  });
  for (int t = 0; t < 3; ++t) EXPECT_TRUE(results[t].ok()) << results[t];
  EXPECT_EQ(three.Stop(), 0);
}

TEST_F(ReshardTest, RestoresOnOneDaemonWithOneDevice) {
  StopSaver();
  Cluster one(1, root_.path());
  ASSERT_TRUE(one.Start().ok());
  const std::vector<std::vector<std::string>> specs = {
      {"x", "unsharded"}, {"unsharded", "x"},         {"x"}, {"x", "unsharded"},
      {"unsharded"},      {"unsharded", "unsharded"}, {}};
  {
    auto client = one.Connect(0);
    EXPECT_TRUE(RestoreAndCheck(*client, kRun, 0, MeshFor("x=1", 1, {0}), {0}, specs).ok());
  }
  EXPECT_EQ(one.Stop(), 0);
}

TEST_F(ReshardTest, RestoresFullyReplicatedAndWithSwappedSharding) {
  const std::vector<std::vector<std::string>> replicated = {{"unsharded", "unsharded"},
                                                            {"unsharded", "unsharded"},
                                                            {"unsharded"},
                                                            {"unsharded", "unsharded"},
                                                            {"unsharded"},
                                                            {"unsharded", "unsharded"},
                                                            {}};
  const std::vector<std::vector<std::string>> swapped = {
      {"y", "x"}, {"y", "unsharded"}, {"y"}, {"unsharded", "x"}, {"x"}, {"y", "x"}, {}};
  for (const auto& specs : {replicated, swapped, SavedSpecs()}) {
    auto results = RunTrainers(4, [&](int t) -> absl::Status {
      auto client = saver_->Connect(t / 2);
      const std::vector<int64_t> devices = DevicesOf(t, 2);
      return RestoreAndCheck(*client, kRun, t, MeshFor(kSaveDims, 8, devices), devices, specs);
    });
    for (int t = 0; t < 4; ++t) EXPECT_TRUE(results[t].ok()) << results[t];
  }
}

TEST_F(ReshardTest, TwoWayShardedTensorRestoresAsRowSlabs) {
  const Spec& a = Model()[0];
  auto client = saver_->Connect(1);
  for (int64_t slab = 0; slab < 3; ++slab) {
    const Box box{{slab * 8, 0}, {8, 48}};
    std::string out(8 * 48 * 4, '\0');
    auto step = client->Restore(kRun, 1,
                                {RestoreTarget{a.name, a.dtype, AsVector(a.shape), AsVector(box.start),
                                               AsVector(box.length), out.data(), out.size()}});
    ASSERT_TRUE(step.ok()) << step.status();
    EXPECT_EQ(out, BoxBytes(a, box)) << "slab " << slab;
  }
}

TEST_F(ReshardTest, EachTrainerGetsItsOwnState) {
  auto results = RunTrainers(4, [&](int t) -> absl::Status {
    auto client = saver_->Connect(t / 2);
    std::map<std::string, std::string> state;
    RestoreOptions options;
    options.trainer_id = t;
    options.trainer_state = &state;
    RETURN_IF_ERROR(client->Restore(kRun, 1, {}, options).status());
    const std::map<std::string, std::string> want = {
        {"iterator", absl::StrCat("position-", t * 1000)},
        {"rng", std::string("\0\x01\xff", 3) + std::to_string(t)}};
    if (state != want) return absl::InternalError(absl::StrCat("trainer ", t, " got other state"));
    return absl::OkStatus();
  });
  for (const absl::Status& s : results) EXPECT_TRUE(s.ok()) << s;
}

TEST_F(ReshardTest, InspectShowsLayoutsAndIndexIsSlicedBundle) {
  std::string out;
  ASSERT_EQ(RunCommand(absl::StrCat(CKPTCTL_BINARY, " inspect ", Prefix()), &out), 0) << out;
  EXPECT_NE(out.find("mesh: |x=2,y=4|0,1,2,3,4,5,6,7||"), std::string::npos) << out;
  EXPECT_NE(out.find("sharding_specs:x,y, mesh:|x=2,y=4|"), std::string::npos) << out;
  EXPECT_NE(out.find("sharding_specs:unsharded,y, mesh:"), std::string::npos) << out;
  ASSERT_EQ(RunCommand(absl::StrCat(CKPTCTL_BINARY, " inspect --json ", Prefix()), &out), 0) << out;
  const nlohmann::json j = nlohmann::json::parse(out);
  EXPECT_EQ(j["mesh"], "|x=2,y=4|0,1,2,3,4,5,6,7||");
  // The index is a TF bundle with sliced entries the core reader opens.
  auto reader = BundleReader::Open(PosixFileSystem(), Prefix());
  ASSERT_TRUE(reader.ok()) << reader.status();
  auto a = (*reader)->Lookup("a/f32");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->pieces.size(), 8u);  // 2 x 4 distinct boxes
  EXPECT_EQ((*reader)->Lookup("b/bf16")->pieces.size(), 4u);
  EXPECT_EQ((*reader)->Find("e/bool")->slices_size(), 0);  // replicated: one plain entry
  EXPECT_EQ(RunCommand(absl::StrCat(CKPTCTL_BINARY, " verify ", Prefix()), &out), 0) << out;
}

TEST_F(ReshardTest, DtypeConversionOnSaveAndRestore) {
  // Saved float32 as bfloat16 (should_cast); values chosen to exercise rounding.
  const std::vector<float> values = {1.0f,
                                     1.00390625f /* tie: even */,
                                     1.01171875f /* tie: up */,
                                     -3.3f,
                                     std::numeric_limits<float>::infinity(),
                                     std::nanf("")};
  auto results = RunTrainers(4, [&](int t) -> absl::Status {
    auto client = saver_->Connect(t / 2);
    SaveOptions options;
    options.store_float32_as_bfloat16 = true;
    std::vector<TensorShard> shards;
    if (t == 0)
      shards.push_back(
          {.name = "w", .dtype = kDtFloat, .shape = {6}, .data = values.data(), .size = values.size() * 4});
    RETURN_IF_ERROR(client->Save(kRun, 2, t, 4, shards, options).status());
    return client->Wait(kRun, 2);
  });
  for (const absl::Status& s : results) ASSERT_TRUE(s.ok()) << s;
  auto reader = BundleReader::Open(
      PosixFileSystem(),
      CheckpointStore::Prefix(CheckpointStore(PosixFileSystem(), root_.path()).StepDir(kRun, 2)));
  ASSERT_TRUE(reader.ok());
  EXPECT_EQ((*reader)->Find("w")->dtype(), kDtBfloat16);

  auto client = saver_->Connect(0);
  std::vector<float> back(6);
  ASSERT_TRUE(
      client
          ->Restore(
              kRun, 2,
              {RestoreTarget{.name = "w", .dtype = kDtFloat, .shape = {6}, .data = back.data(), .size = 24}})
          .ok());
  EXPECT_EQ(back[0], 1.0f);
  EXPECT_EQ(back[1], 1.0f);
  EXPECT_EQ(back[2], 1.015625f);
  EXPECT_EQ(back[3], Bfloat16ToFloat(FloatToBfloat16(-3.3f)));
  EXPECT_TRUE(std::isinf(back[4]));
  EXPECT_TRUE(std::isnan(back[5]));
  std::vector<uint16_t> half(6);
  ASSERT_TRUE(
      client
          ->Restore(
              kRun, 2,
              {RestoreTarget{.name = "w", .dtype = kDtHalf, .shape = {6}, .data = half.data(), .size = 12}})
          .ok());
  EXPECT_EQ(half[0], 0x3c00);
  EXPECT_EQ(half[4], 0x7c00);
  // Stored float16 read as float32, and a conversion that is not allowed.
  const Spec& f = Model()[5];
  std::vector<float> f32(12 * 24);
  ASSERT_TRUE(
      client
          ->Restore(
              kRun, 1,
              {RestoreTarget{.name = f.name, .dtype = kDtFloat, .data = f32.data(), .size = f32.size() * 4}})
          .ok());
  const std::string stored = BoxBytes(f, Box::Full(f.shape));
  for (size_t i = 0; i < f32.size(); ++i) {
    uint16_t h;
    std::memcpy(&h, stored.data() + 2 * i, 2);
    const float want = HalfToFloat(h);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(f32[i]));
    } else {
      EXPECT_EQ(f32[i], want) << i;
    }
  }
  std::vector<int64_t> wrong(48);
  EXPECT_EQ(
      client
          ->Restore(kRun, 1,
                    {RestoreTarget{.name = "c/i8", .dtype = kDtInt64, .data = wrong.data(), .size = 48 * 8}})
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument);
}

TEST_F(ReshardTest, MeshMistakesAreClearErrors) {
  // Layout that does not divide: 24 rows over y=4 is fine, 6 columns over y=4 is not.
  auto client = saver_->Connect(0);
  const std::vector<int64_t> devices = DevicesOf(0, 2);
  std::vector<std::vector<std::string>> specs = SavedSpecs();
  specs[3] = {"unsharded", "y"};
  absl::Status s = RestoreAndCheck(*client, kRun, 0, MeshFor(kSaveDims, 8, devices), devices, specs);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("does not divide"), absl::string_view::npos) << s;
  // A device the mesh does not have.
  EXPECT_EQ(RestoreAndCheck(*client, kRun, 0, MeshFor(kSaveDims, 8, {0}), {9}, SavedSpecs()).code(),
            absl::StatusCode::kInvalidArgument);

  // Hosts that disagree on the mesh fail the step for every trainer.
  auto results = RunTrainers(2, [&](int t) -> absl::Status {
    auto c = saver_->Connect(t);
    SaveOptions options;
    options.mesh = t == 0 ? MeshFor("x=2", 2, {0}) : MeshFor("y=2", 2, {1});
    options.device_ids = {t};
    int32_t v = t;
    TensorShard shard{.name = "v",
                      .dtype = kDtInt32,
                      .shape = {2},
                      .data = nullptr,
                      .size = 0,
                      .use_layout = true,
                      .sharding_specs = {"unsharded"},
                      .device_data = {{&v, 4}}};
    shard.shape = {1};
    RETURN_IF_ERROR(c->Save("mesh-mismatch", 1, t, 2, {shard}, options).status());
    return c->Wait("mesh-mismatch", 1);
  });
  for (const absl::Status& r : results) {
    EXPECT_EQ(r.code(), absl::StatusCode::kInvalidArgument) << r;
    EXPECT_NE(r.message().find("disagree on the mesh"), absl::string_view::npos) << r;
  }

  // Barrier: trainers whose devices do not add up to the mesh are told so.
  auto barrier = RunTrainers(2, [&](int t) -> absl::Status {
    return saver_->Connect(t)->Barrier("bar", t, 2, absl::Seconds(30), MeshFor("x=4", 4, {t}), {t});
  });
  for (const absl::Status& r : barrier) {
    EXPECT_EQ(r.code(), absl::StatusCode::kFailedPrecondition) << r;
    EXPECT_NE(r.message().find("declared 2 devices but the mesh has 4"), absl::string_view::npos) << r;
  }
  auto good = RunTrainers(2, [&](int t) -> absl::Status {
    return saver_->Connect(t)->Barrier("bar-ok", t, 2, absl::Seconds(30), MeshFor("x=2", 2, {t}), {t});
  });
  for (const absl::Status& r : good) EXPECT_TRUE(r.ok()) << r;
}

// A data-parallel model on 4 hosts: every tensor fully replicated, 64 equal tensors.
// Each is written once, and the busiest host writes at most 1.1x the mean.
TEST(WriterBalanceTest, DataParallelModelSpreadsWritesOverFourHosts) {
  Cluster four(4);
  ASSERT_TRUE(four.Start().ok());
  auto results = RunTrainers(4, [&](int t) -> absl::Status {
    auto client = four.Connect(t);
    std::vector<float> data(256, static_cast<float>(t));
    NamedTensors tensors;
    for (int i = 0; i < 64; ++i) {
      std::fill(data.begin(), data.end(), static_cast<float>(i));
      tensors.emplace_back(absl::StrCat("layer", i), NamedTensor{kDtFloat, {256}, {"unsharded"}, {}});
    }
    std::vector<std::vector<float>> buffers(64);
    for (int i = 0; i < 64; ++i) {
      buffers[i].assign(256, static_cast<float>(i));
      tensors[i].second.device_data.emplace_back(buffers[i].data(), 1024);
    }
    SaveOptions options;
    options.mesh = MeshFor("batch=4", 4, {t});
    options.device_ids = {t};
    RETURN_IF_ERROR(client->SaveByName("dp", 1, t, 4, tensors, options).status());
    return client->Wait("dp", 1);
  });
  for (const absl::Status& s : results) ASSERT_TRUE(s.ok()) << s;
  const std::string step_dir = CheckpointStore(PosixFileSystem(), four.root()).StepDir("dp", 1);
  std::ifstream in(JoinPath(step_dir, "ckptd.json"));
  const nlohmann::json meta = nlohmann::json::parse(in);
  std::vector<int64_t> per_host = meta["bytes_per_host"].get<std::vector<int64_t>>();
  ASSERT_EQ(per_host.size(), 4u);
  const int64_t total = std::accumulate(per_host.begin(), per_host.end(), int64_t{0});
  EXPECT_EQ(total, 64 * 1024);  // each tensor written once
  EXPECT_LE(*std::max_element(per_host.begin(), per_host.end()) * 4, total * 11 / 10);
  uint64_t file_bytes = 0;
  for (int shard = 0; shard < 4; ++shard) {
    file_bytes += *PosixFileSystem()->FileSize(DataPath(CheckpointStore::Prefix(step_dir), shard, 4));
  }
  EXPECT_EQ(file_bytes, 64u * 1024);
  EXPECT_EQ(four.Stop(), 0);
}

}  // namespace
}  // namespace ckptd::testing
