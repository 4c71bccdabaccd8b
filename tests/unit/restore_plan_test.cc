// Restore planning and reading without MPI or gRPC: a checkpoint written by the
// bundle writer, read back through PlanRestore and ReadPlan into other boxes, layouts
// and dtypes.
#include "daemon/restore/restore_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <numeric>

#include "daemon/base/dtype.h"
#include "daemon/base/status.h"
#include "daemon/bundle/bundle.h"
#include "daemon/bundle/crc32c.h"
#include "daemon/bundle/ordered_code.h"
#include "daemon/layout/cast.h"
#include "tests/common/temp_dir.h"

namespace ckptd {
namespace {

// "m": float[4, 6] saved as two row slabs in two shards; "v": int64[5] whole;
// trainer 3's state "it" = "pos-9".
class RestorePlanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    prefix_ = dir_.Sub("ckpt");
    m_.resize(24);
    std::iota(m_.begin(), m_.end(), 1.0f);
    v_ = {10, 20, 30, 40, 50};
    std::string shard0, shard1;
    IndexBuilder index(2);
    auto add = [&](std::string* file, int shard, const std::string& key, int dtype, const Shape& shape,
                   const void* data, size_t n) {
      tf::BundleEntryProto e;
      e.set_dtype(dtype);
      *e.mutable_shape() = ShapeToProto(shape);
      e.set_shard_id(shard);
      e.set_offset(static_cast<int64_t>(file->size()));
      e.set_size(static_cast<int64_t>(n));
      const int64_t elements = dtype == kString ? 1 : static_cast<int64_t>(n / DataTypeSize(dtype));
      auto crc = EntryChecksum(dtype, elements, static_cast<const char*>(data), n);
      ASSERT_TRUE(crc.ok()) << crc.status();
      e.set_crc32c(*crc);
      file->append(static_cast<const char*>(data), n);
      ASSERT_TRUE(index.Add(key, e).ok());
    };
    const Shape m_shape{4, 6};
    tf::BundleEntryProto full;
    full.set_dtype(kFloat);
    *full.mutable_shape() = ShapeToProto(m_shape);
    for (int s = 0; s < 2; ++s) {
      const Box box{{2 * s, 0}, {2, 6}};
      *full.add_slices() = BoxToSliceProto(box, m_shape);
      add(s == 0 ? &shard0 : &shard1, s, ordered_code::EncodeTensorNameSlice("m", box, m_shape), kFloat,
          {2, 6}, m_.data() + 12 * s, 48);
    }
    ASSERT_TRUE(index.Add("m", full).ok());
    add(&shard1, 1, "v", kInt64, {5}, v_.data(), 40);
    const std::string state = EncodeStringScalar("pos-9");
    add(&shard0, 0, TrainerStateName(3, "it"), kString, {}, state.data(), state.size());
    auto bytes = index.Finish();
    ASSERT_TRUE(bytes.ok());
    for (const auto& [path, contents] :
         {std::make_pair(IndexPath(prefix_), *bytes), std::make_pair(DataPath(prefix_, 0, 2), shard0),
          std::make_pair(DataPath(prefix_, 1, 2), shard1)}) {
      ASSERT_TRUE(PosixFileSystem()->WriteFileAtomically(path, contents).ok());
    }
    auto reader = BundleReader::Open(PosixFileSystem(), prefix_);
    ASSERT_TRUE(reader.ok()) << reader.status();
    reader_ = std::move(*reader);
  }

  float M(int64_t row, int64_t col) const { return m_[static_cast<size_t>(row * 6 + col)]; }

  testing::TempDir dir_;
  std::string prefix_;
  std::vector<float> m_;
  std::vector<int64_t> v_;
  std::unique_ptr<BundleReader> reader_;
};

TEST_F(RestorePlanTest, PlansBoxesBytesAndTheSharedMemoryLayout) {
  const std::vector<TensorWant> wants = {
      {.name = "v"},
      {.name = "m", .box = Box{{1, 2}, {2, 3}}},
      {.name = "m", .dtype = kBfloat16},
      {.name = "v", .outside_reply = true},
  };
  auto plan = PlanRestore(*reader_, wants, Placement{});
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->items.size(), 4u);
  EXPECT_EQ(plan->items[0].bytes, 40);
  EXPECT_EQ(plan->items[0].shared_memory_offset, 0);
  EXPECT_EQ(plan->items[1].boxes, (std::vector<Box>{Box{{1, 2}, {2, 3}}}));
  EXPECT_EQ(plan->items[1].bytes, 24);
  EXPECT_EQ(plan->items[1].shared_memory_offset, 64);  // 64-byte aligned after 40 bytes
  EXPECT_EQ(plan->items[2].dtype, kBfloat16);
  EXPECT_EQ(plan->items[2].bytes, 48);
  EXPECT_EQ(plan->items[2].shared_memory_offset, 128);
  EXPECT_EQ(plan->items[3].shared_memory_offset, -1);  // to device: no room in the segment
  EXPECT_EQ(plan->shared_memory_bytes, 176);
}

TEST_F(RestorePlanTest, ReadsAcrossSlicesIntoOtherBoxesLayoutsAndDtypes) {
  auto mesh = ParseMesh("|x=2,y=2|0,1,2,3|3|/d:3");
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  // Device 3 of x=2,y=2 holds rows 2-3, columns 3-5 when m is laid out (x, y).
  const Placement placement{.mesh = *mesh, .device_ids = {3}};
  const std::vector<TensorWant> wants = {
      {.name = "m", .box = Box{{1, 1}, {2, 4}}},                    // spans both slabs
      {.name = "m", .layout = std::vector<std::string>{"x", "y"}},  // a device's box
      {.name = "m", .dtype = kHalf},                                // converted
      {.name = "v", .box = Box{{3}, {2}}},
  };
  auto plan = PlanRestore(*reader_, wants, placement);
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::vector<std::string> out;
  std::vector<char*> outputs;
  for (const RestoreItem& item : plan->items) out.emplace_back(static_cast<size_t>(item.bytes), '\0');
  for (std::string& o : out) outputs.push_back(o.data());
  ASSERT_TRUE(ReadPlan(*reader_, *plan, outputs, 3).ok());

  const float* span = reinterpret_cast<const float*>(out[0].data());
  for (int r = 0; r < 2; ++r) {
    for (int c = 0; c < 4; ++c) EXPECT_EQ(span[r * 4 + c], M(1 + r, 1 + c)) << r << "," << c;
  }
  EXPECT_EQ(plan->items[1].boxes, (std::vector<Box>{Box{{2, 3}, {2, 3}}}));
  const float* device = reinterpret_cast<const float*>(out[1].data());
  for (int r = 0; r < 2; ++r) {
    for (int c = 0; c < 3; ++c) EXPECT_EQ(device[r * 3 + c], M(2 + r, 3 + c));
  }
  std::vector<float> halves(24);
  ASSERT_TRUE(ConvertElements(kHalf, out[2].data(), kFloat, reinterpret_cast<char*>(halves.data()), 24).ok());
  EXPECT_EQ(halves, m_);  // small integers survive float16 exactly
  const int64_t* tail = reinterpret_cast<const int64_t*>(out[3].data());
  EXPECT_EQ(tail[0], 40);
  EXPECT_EQ(tail[1], 50);
}

TEST_F(RestorePlanTest, RefusesBadWantsNamingTheField) {
  struct Case {
    TensorWant want;
    absl::StatusCode code;
    std::string needle;
  };
  const std::vector<Case> cases = {
      {{.name = "nope"}, absl::StatusCode::kNotFound, "'nope'"},
      {{.name = "v", .dtype = kFloat}, absl::StatusCode::kInvalidArgument, "tensors[0].dtype"},
      {{.name = "m", .shape = {6, 4}}, absl::StatusCode::kInvalidArgument, "tensors[0].shape"},
      {{.name = "m", .box = Box{{3, 0}, {2, 6}}}, absl::StatusCode::kInvalidArgument, "tensors[0].box"},
      {{.name = "m", .layout = std::vector<std::string>{"x", "y"}},
       absl::StatusCode::kInvalidArgument,
       "declares no mesh"},
  };
  for (const Case& c : cases) {
    auto plan = PlanRestore(*reader_, {c.want}, Placement{});
    EXPECT_EQ(plan.status().code(), c.code) << c.needle << ": " << plan.status();
    EXPECT_NE(plan.status().message().find(c.needle), absl::string_view::npos) << plan.status();
  }
}

TEST_F(RestorePlanTest, ReadVerifiesChecksumsOfWhatItReads) {
  auto data = PosixFileSystem()->ReadFileToString(DataPath(prefix_, 1, 2), 1 << 20);
  ASSERT_TRUE(data.ok());
  (*data)[5] ^= 0x10;  // inside m's second slab
  ASSERT_TRUE(PosixFileSystem()->WriteFileAtomically(DataPath(prefix_, 1, 2), *data).ok());
  auto reader = BundleReader::Open(PosixFileSystem(), prefix_);
  ASSERT_TRUE(reader.ok());
  // Rows 0-1 lie in the intact slab only: they read.
  auto top = PlanRestore(**reader, {{.name = "m", .box = Box{{0, 0}, {2, 6}}}}, Placement{});
  ASSERT_TRUE(top.ok());
  std::string out(48, '\0');
  EXPECT_TRUE(ReadPlan(**reader, *top, {out.data()}, 1).ok());
  // The whole tensor touches the bad slab.
  auto whole = PlanRestore(**reader, {{.name = "m"}}, Placement{});
  ASSERT_TRUE(whole.ok());
  std::string all(96, '\0');
  const absl::Status read = ReadPlan(**reader, *whole, {all.data()}, 2);
  EXPECT_EQ(read.code(), absl::StatusCode::kDataLoss) << read;
  EXPECT_NE(read.message().find("tensor 'm' slice 2,2:-"), absl::string_view::npos) << read;
}

TEST_F(RestorePlanTest, EachItemIsReportedOnceItsReadsAreVerifiedAndNeverIfOneFailed) {
  auto data = PosixFileSystem()->ReadFileToString(DataPath(prefix_, 1, 2), 1 << 20);
  ASSERT_TRUE(data.ok());
  (*data)[5] ^= 0x10;  // inside m's second slab; v, after it in the same file, is intact
  ASSERT_TRUE(PosixFileSystem()->WriteFileAtomically(DataPath(prefix_, 1, 2), *data).ok());
  auto reader = BundleReader::Open(PosixFileSystem(), prefix_);
  ASSERT_TRUE(reader.ok());
  // Rows 0-1 (the intact slab), rows 1-3 (both slabs: fails), v, and rows 0-1 again as half.
  const std::vector<TensorWant> wants = {{.name = "m", .box = Box{{0, 0}, {2, 6}}},
                                         {.name = "m", .box = Box{{1, 0}, {3, 6}}},
                                         {.name = "v"},
                                         {.name = "m", .dtype = kHalf, .box = Box{{0, 0}, {2, 6}}}};
  auto plan = PlanRestore(**reader, wants, Placement{});
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::string top(48, '\0'), rows(72, '\0'), v(40, '\0');
  std::vector<uint16_t> top_halves(12, 0), expected_halves(12, 0);
  ASSERT_TRUE(ConvertElements(kFloat, reinterpret_cast<const char*>(m_.data()), kHalf,
                              reinterpret_cast<char*>(expected_halves.data()), 12)
                  .ok());
  std::mutex mu;
  std::vector<size_t> reported;
  std::vector<bool> in_place_when_reported;
  const absl::Status read = ReadPlanItems(
      **reader, *plan, {top.data(), rows.data(), v.data(), reinterpret_cast<char*>(top_halves.data())}, 3, 0,
      4, [&](size_t item) {
        std::lock_guard<std::mutex> lock(mu);
        reported.push_back(item);
        in_place_when_reported.push_back(item == 0   ? std::memcmp(top.data(), m_.data(), 48) == 0
                                         : item == 2 ? std::memcmp(v.data(), v_.data(), 40) == 0
                                         : item == 3 ? top_halves == expected_halves
                                                     : false);
      });
  EXPECT_EQ(read.code(), absl::StatusCode::kDataLoss) << read;
  std::sort(reported.begin(), reported.end());
  EXPECT_EQ(reported, (std::vector<size_t>{0, 2, 3}));
  EXPECT_EQ(in_place_when_reported, std::vector<bool>(3, true));

  // On the intact file every item is reported, once.
  (*data)[5] ^= 0x10;
  ASSERT_TRUE(PosixFileSystem()->WriteFileAtomically(DataPath(prefix_, 1, 2), *data).ok());
  auto intact = BundleReader::Open(PosixFileSystem(), prefix_);
  ASSERT_TRUE(intact.ok());
  auto again = PlanRestore(**intact, wants, Placement{});
  ASSERT_TRUE(again.ok());
  reported.clear();
  ASSERT_TRUE(ReadPlanItems(**intact, *again,
                            {top.data(), rows.data(), v.data(), reinterpret_cast<char*>(top_halves.data())},
                            2, 0, 4,
                            [&](size_t item) {
                              std::lock_guard<std::mutex> lock(mu);
                              reported.push_back(item);
                            })
                  .ok());
  std::sort(reported.begin(), reported.end());
  EXPECT_EQ(reported, (std::vector<size_t>{0, 1, 2, 3}));
  EXPECT_EQ(std::memcmp(rows.data(), m_.data() + 6, 72), 0);
}

// Counts the read requests that reach each data file.
class CountingFileSystem final : public FileSystemWrapper {
 public:
  using FileSystemWrapper::FileSystemWrapper;
  absl::StatusOr<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(const std::string& path) override {
    ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> file, target()->NewRandomAccessFile(path));
    return std::unique_ptr<RandomAccessFile>(new Counted(std::move(file), &reads_));
  }
  int reads() const { return reads_; }

 private:
  class Counted final : public RandomAccessFile {
   public:
    Counted(std::unique_ptr<RandomAccessFile> file, std::atomic<int>* reads)
        : file_(std::move(file)), reads_(reads) {}
    absl::Status Read(uint64_t offset, size_t n, char* dst) const override {
      ++*reads_;
      return file_->Read(offset, n, dst);
    }
    uint64_t Size() const override { return file_->Size(); }

   private:
    std::unique_ptr<RandomAccessFile> file_;
    std::atomic<int>* reads_;
  };
  std::atomic<int> reads_{0};
};

TEST_F(RestorePlanTest, NeighbouringSmallPiecesAreReadInOneRequestAndEachIsStillVerified) {
  // Shard 1 holds m's second slab and then v: two whole pieces, side by side.
  const std::vector<TensorWant> wants = {{.name = "m", .box = Box{{2, 0}, {2, 6}}}, {.name = "v"}};
  CountingFileSystem counting(PosixFileSystem());
  auto reader = BundleReader::Open(&counting, prefix_);
  ASSERT_TRUE(reader.ok()) << reader.status();
  auto plan = PlanRestore(**reader, wants, Placement{});
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::string slab(48, '\0'), v(40, '\0');
  const int before = counting.reads();
  ASSERT_TRUE(ReadPlan(**reader, *plan, {slab.data(), v.data()}, 2).ok());
  EXPECT_EQ(counting.reads() - before, 1);
  EXPECT_EQ(std::memcmp(slab.data(), m_.data() + 12, 48), 0);
  EXPECT_EQ(std::memcmp(v.data(), v_.data(), 40), 0);

  // A flipped bit in v fails the batch naming v, not its neighbour.
  auto data = PosixFileSystem()->ReadFileToString(DataPath(prefix_, 1, 2), 1 << 20);
  ASSERT_TRUE(data.ok());
  (*data)[48 + 3] ^= 0x01;
  ASSERT_TRUE(PosixFileSystem()->WriteFileAtomically(DataPath(prefix_, 1, 2), *data).ok());
  auto damaged = BundleReader::Open(PosixFileSystem(), prefix_);
  ASSERT_TRUE(damaged.ok());
  auto again = PlanRestore(**damaged, wants, Placement{});
  ASSERT_TRUE(again.ok());
  const absl::Status read = ReadPlan(**damaged, *again, {slab.data(), v.data()}, 1);
  EXPECT_EQ(read.code(), absl::StatusCode::kDataLoss) << read;
  EXPECT_NE(read.message().find("tensor 'v': checksum mismatch"), absl::string_view::npos) << read;
}

TEST_F(RestorePlanTest, TrainerStateIsReadOnlyForItsTrainer) {
  auto mine = ReadTrainerState(*reader_, 3);
  ASSERT_TRUE(mine.ok()) << mine.status();
  EXPECT_EQ(*mine, (std::map<std::string, std::string>{{"it", "pos-9"}}));
  auto other = ReadTrainerState(*reader_, 1);
  ASSERT_TRUE(other.ok());
  EXPECT_TRUE(other->empty());
}

}  // namespace
}  // namespace ckptd
