#include "daemon/bundle/bundle.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <numeric>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "daemon/base/dtype.h"
#include "daemon/bundle/checkpoint_meta.h"
#include "daemon/bundle/crc32c.h"
#include "daemon/bundle/ordered_code.h"
#include "tests/common/temp_dir.h"

namespace ckptd {
namespace {

FileSystem* fs() { return PosixFileSystem(); }

// Writes a 2-shard bundle by hand: "scalar" (int64, shard 0), "vec" (float[6], whole,
// shard 1) and "mat" (float[4,3], two row slices, one per shard).
class BundleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    prefix_ = dir_.Sub("ckpt");
    std::vector<float> mat(12);
    std::iota(mat.begin(), mat.end(), 0.5f);
    std::vector<float> vec = {1, 2, 3, 4, 5, 6};
    int64_t scalar = 42;
    std::string shard0, shard1;
    IndexBuilder index(2);
    auto add = [&](std::string* file, int shard, const std::string& key, int dtype, Shape shape,
                   const void* data, size_t n) {
      tf::BundleEntryProto e;
      e.set_dtype(dtype);
      *e.mutable_shape() = ShapeToProto(shape);
      e.set_shard_id(shard);
      e.set_offset(static_cast<int64_t>(file->size()));
      e.set_size(static_cast<int64_t>(n));
      e.set_crc32c(crc32c::Mask(crc32c::Value(static_cast<const char*>(data), n)));
      file->append(static_cast<const char*>(data), n);
      ASSERT_TRUE(index.Add(key, e).ok());
    };
    add(&shard0, 0, "scalar", kInt64, {}, &scalar, 8);
    add(&shard1, 1, "vec", kFloat, {6}, vec.data(), 24);
    const Shape mat_shape{4, 3};
    tf::BundleEntryProto full;
    full.set_dtype(kFloat);
    *full.mutable_shape() = ShapeToProto(mat_shape);
    for (int s = 0; s < 2; ++s) {
      Box box{{2 * s, 0}, {2, 3}};
      *full.add_slices() = BoxToSliceProto(box, mat_shape);
      add(s == 0 ? &shard0 : &shard1, s, ordered_code::EncodeTensorNameSlice("mat", box, mat_shape), kFloat,
          {2, 3}, mat.data() + 6 * s, 24);
    }
    ASSERT_TRUE(index.Add("mat", full).ok());
    auto bytes = index.Finish();
    ASSERT_TRUE(bytes.ok());
    Write(IndexPath(prefix_), *bytes);
    Write(DataPath(prefix_, 0, 2), shard0);
    Write(DataPath(prefix_, 1, 2), shard1);
    mat_ = mat;
  }

  void Write(const std::string& path, const std::string& contents) {
    auto file = fs()->NewWritableFile(path);
    ASSERT_TRUE(file.ok());
    ASSERT_TRUE((*file)->Append(contents).ok());
    ASSERT_TRUE((*file)->Close().ok());
  }

  testing::TempDir dir_;
  std::string prefix_;
  std::vector<float> mat_;
};

TEST_F(BundleTest, RoundTripWholeAndSliced) {
  auto reader = BundleReader::Open(fs(), prefix_);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->header().num_shards(), 2);
  EXPECT_EQ((*reader)->TensorNames(), (std::vector<std::string>{"mat", "scalar", "vec"}));

  auto scalar = (*reader)->Lookup("scalar");
  ASSERT_TRUE(scalar.ok());
  int64_t value = 0;
  ASSERT_TRUE((*reader)->ReadBox(*scalar, Box{}, reinterpret_cast<char*>(&value)).ok());
  EXPECT_EQ(value, 42);

  auto mat = (*reader)->Lookup("mat");
  ASSERT_TRUE(mat.ok()) << mat.status();
  EXPECT_EQ(mat->pieces.size(), 2u);
  std::vector<float> whole(12);
  ASSERT_TRUE((*reader)->ReadBox(*mat, Box::Full({4, 3}), reinterpret_cast<char*>(whole.data())).ok());
  EXPECT_EQ(whole, mat_);
  // A box spanning both slices: rows 1-2, columns 1-2.
  std::vector<float> part(4);
  ASSERT_TRUE((*reader)->ReadBox(*mat, Box{{1, 1}, {2, 2}}, reinterpret_cast<char*>(part.data())).ok());
  EXPECT_EQ(part, (std::vector<float>{mat_[4], mat_[5], mat_[7], mat_[8]}));
}

TEST_F(BundleTest, UnknownTensorIsNotFound) {
  auto reader = BundleReader::Open(fs(), prefix_);
  ASSERT_TRUE(reader.ok());
  EXPECT_EQ((*reader)->Lookup("nope").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(BundleTest, FlippedByteIsDataLossNamingTensorAndFile) {
  auto data = fs()->ReadFileToString(DataPath(prefix_, 1, 2), 1 << 20);
  ASSERT_TRUE(data.ok());
  (*data)[3] ^= 0x01;  // inside "vec"
  Write(DataPath(prefix_, 1, 2), *data);
  auto reader = BundleReader::Open(fs(), prefix_);
  ASSERT_TRUE(reader.ok());
  auto vec = (*reader)->Lookup("vec");
  ASSERT_TRUE(vec.ok());
  std::vector<float> out(6);
  absl::Status s = (*reader)->ReadBox(*vec, Box::Full({6}), reinterpret_cast<char*>(out.data()));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("'vec'"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("data-00001-of-00002"), absl::string_view::npos) << s;
}

TEST_F(BundleTest, CorruptSliceIsNamedAsPeopleWriteItNeverByItsBinaryKey) {
  auto data = fs()->ReadFileToString(DataPath(prefix_, 1, 2), 1 << 20);
  ASSERT_TRUE(data.ok());
  (*data)[30] ^= 0x01;  // inside "mat" rows 2-3, the slice in shard 1 after "vec"
  Write(DataPath(prefix_, 1, 2), *data);
  auto reader = BundleReader::Open(fs(), prefix_);
  ASSERT_TRUE(reader.ok());
  auto mat = (*reader)->Lookup("mat");
  ASSERT_TRUE(mat.ok());
  std::vector<float> out(12);
  absl::Status s = (*reader)->ReadBox(*mat, Box::Full({4, 3}), reinterpret_cast<char*>(out.data()));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("tensor 'mat' slice 2,2:-: checksum mismatch"), absl::string_view::npos) << s;
  std::vector<std::string> problems;
  int64_t bytes = 0;
  (*reader)->VerifyAll(&problems, &bytes);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("tensor 'mat' slice 2,2:-"), std::string::npos) << problems[0];
  for (const std::string& text : {std::string(s.message()), problems[0]}) {
    for (char c : text) EXPECT_TRUE(c >= 0x20 && c < 0x7f) << "unprintable byte in: " << absl::CEscape(text);
  }
}

TEST_F(BundleTest, TruncatedDataFileIsDataLoss) {
  auto data = fs()->ReadFileToString(DataPath(prefix_, 1, 2), 1 << 20);
  ASSERT_TRUE(data.ok());
  Write(DataPath(prefix_, 1, 2), data->substr(0, 10));
  auto reader = BundleReader::Open(fs(), prefix_);
  ASSERT_TRUE(reader.ok());
  auto vec = (*reader)->Lookup("vec");
  std::vector<float> out(6);
  EXPECT_EQ((*reader)->ReadBox(*vec, Box::Full({6}), reinterpret_cast<char*>(out.data())).code(),
            absl::StatusCode::kDataLoss);
}

TEST_F(BundleTest, GarbledOrTruncatedIndexIsDataLoss) {
  auto index = fs()->ReadFileToString(IndexPath(prefix_), 1 << 20);
  ASSERT_TRUE(index.ok());
  Write(IndexPath(prefix_), index->substr(0, index->size() / 2));
  EXPECT_EQ(BundleReader::Open(fs(), prefix_).status().code(), absl::StatusCode::kDataLoss);
  std::string garbled = *index;
  garbled[garbled.size() / 3] ^= 0x5a;
  Write(IndexPath(prefix_), garbled);
  EXPECT_EQ(BundleReader::Open(fs(), prefix_).status().code(), absl::StatusCode::kDataLoss);
  Write(IndexPath(prefix_), "");
  EXPECT_EQ(BundleReader::Open(fs(), prefix_).status().code(), absl::StatusCode::kDataLoss);
}

TEST_F(BundleTest, MissingIndexIsNotFound) {
  EXPECT_EQ(BundleReader::Open(fs(), dir_.Sub("absent")).status().code(), absl::StatusCode::kNotFound);
}

// An index is hostile input: entries past the end of their file or with absurd sizes
// must be clear errors, found before anything of that size is allocated.
TEST(BundleHostileIndexTest, PastTheEndAndAbsurdSizesAreDataLoss) {
  testing::TempDir dir;
  const std::string prefix = dir.Sub("ckpt");
  IndexBuilder index(1);
  auto entry = [](int dtype, Shape shape, int64_t offset, int64_t size) {
    tf::BundleEntryProto e;
    e.set_dtype(dtype);
    *e.mutable_shape() = ShapeToProto(shape);
    e.set_offset(offset);
    e.set_size(size);
    return e;
  };
  ASSERT_TRUE(index.Add("past_end", entry(kFloat, {4}, 8, 16)).ok());
  ASSERT_TRUE(index.Add("huge", entry(kFloat, {int64_t{1} << 40}, 0, int64_t{4} << 40)).ok());
  tf::BundleEntryProto sliced = entry(kFloat, {int64_t{1} << 40}, 0, 0);
  *sliced.add_slices() = BoxToSliceProto(Box{{0}, {2}}, {int64_t{1} << 40});
  ASSERT_TRUE(index.Add("sparse", sliced).ok());
  ASSERT_TRUE(index
                  .Add(ordered_code::EncodeTensorNameSlice("sparse", Box{{0}, {2}}, {int64_t{1} << 40}),
                       entry(kFloat, {2}, 0, 8))
                  .ok());
  auto bytes = index.Finish();
  ASSERT_TRUE(bytes.ok());
  ASSERT_TRUE(fs()->WriteFileAtomically(IndexPath(prefix), *bytes).ok());
  ASSERT_TRUE(fs()->WriteFileAtomically(DataPath(prefix, 0, 1), std::string(12, 'x')).ok());

  auto reader = BundleReader::Open(fs(), prefix);
  ASSERT_TRUE(reader.ok()) << reader.status();
  for (const char* name : {"past_end", "huge", "sparse"}) {
    auto info = (*reader)->Lookup(name);
    ASSERT_TRUE(info.ok()) << name;
    absl::Status s = (*reader)->CheckBoxReadable(*info, Box::Full(info->shape));
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << name << ": " << s;
    EXPECT_NE(s.message().find(name), absl::string_view::npos) << s;
  }
  // A size that disagrees with shape x dtype, or one that overflows, fails Open.
  IndexBuilder liar(1);
  ASSERT_TRUE(liar.Add("liar", entry(kFloat, {4}, 0, 1 << 30)).ok());
  ASSERT_TRUE(fs()->WriteFileAtomically(IndexPath(prefix), *liar.Finish()).ok());
  EXPECT_EQ(BundleReader::Open(fs(), prefix).status().code(), absl::StatusCode::kDataLoss);
  IndexBuilder overflow(1);
  ASSERT_TRUE(overflow.Add("overflow", entry(kDouble, {int64_t{1} << 62, 4}, 0, 8)).ok());
  ASSERT_TRUE(fs()->WriteFileAtomically(IndexPath(prefix), *overflow.Finish()).ok());
  EXPECT_EQ(BundleReader::Open(fs(), prefix).status().code(), absl::StatusCode::kDataLoss);
}

TEST(CheckpointStateTest, RoundTrip) {
  CheckpointState state{"step-00000003/ckpt", {"step-00000001/ckpt", "step-00000003/ckpt"}};
  auto parsed = ParseCheckpointState(FormatCheckpointState(state));
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(parsed->model_checkpoint_path, state.model_checkpoint_path);
  EXPECT_EQ(parsed->all_model_checkpoint_paths, state.all_model_checkpoint_paths);
  EXPECT_FALSE(ParseCheckpointState("garbage").ok());
}

}  // namespace
}  // namespace ckptd

namespace ckptd {
namespace {

TEST(CheckpointMetaTest, RoundTripsAndRefusesWhatIsNotOurs) {
  CheckpointMeta meta{.version = "0.1.0",
                      .run = "r",
                      .step = 300,
                      .num_hosts = 2,
                      .storage = "local",
                      .trainer_count = 4,
                      .mesh = "|x=2|0,1|0|/d:0",
                      .created_unix = 1700000000,
                      .bytes_per_host = {10, 20}};
  meta.hosts.push_back(
      {.rank = 1, .host = "node-7", .file = "ckpt.data-00001-of-00002", .bytes = 20, .write_seconds = 0.5});
  meta.tensors.push_back(
      {.name = "w",
       .dtype = "float",
       .shape = {4, 2},
       .boxes = {{.box = Box{{0, 0}, {2, 2}}, .writer = 0}, {.box = Box{{2, 0}, {2, 2}}, .writer = 1}},
       .layout = "sharding_specs:x,unsharded, mesh:|x=2|0,1|0|/d:0"});
  meta.tensors.push_back({.name = "scalar \"q\"\n\u00e9", .dtype = "int64"});
  meta.commit_seconds = 1.25;
  meta.max_write_seconds = 1e-05;
  meta.imported_from = "/some/where";
  meta.hosts.push_back({.rank = 0, .copies = {1}});
  meta.hosts[0].parity_file = "ckpt.parity-00001-of-00002";
  meta.hosts[0].parity_bytes = 8192;
  meta.hosts[0].parity_crc32c = 0xdeadbeef;
  meta.parity = {.parity = 1, .groups = {{.members = {0, 1}, .segment_bytes = 4096}}};
  // Written as nlohmann::json writes the same document, byte for byte.
  const std::string text = meta.ToJson();
  EXPECT_EQ(text, nlohmann::json::parse(text).dump(1));
  EXPECT_EQ(CheckpointMeta{}.ToJson(), nlohmann::json::parse(CheckpointMeta{}.ToJson()).dump(1));
  auto back = CheckpointMeta::FromJson(meta.ToJson());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->ToJson(), meta.ToJson());
  EXPECT_EQ(back->tensors[0].boxes[1].box, (Box{{2, 0}, {2, 2}}));
  EXPECT_EQ(back->hosts[0].file, "ckpt.data-00001-of-00002");
  EXPECT_EQ(back->hosts[0].host, "node-7");
  EXPECT_EQ(back->storage, "local");
  EXPECT_EQ(back->hosts[0].parity_crc32c, 0xdeadbeefu);
  ASSERT_NE(back->ParityGroupOf(1), nullptr);
  EXPECT_EQ(back->ParityGroupOf(1)->segment_bytes, 4096);
  EXPECT_EQ(back->ParityGroupOf(2), nullptr);
  int rank = 0, ranks = 0;
  EXPECT_TRUE(ParseParityFileName("/a/ckpt.parity-00001-of-00002", &rank, &ranks));
  EXPECT_EQ(rank, 1);
  EXPECT_EQ(ranks, 2);
  EXPECT_FALSE(ParseParityFileName("ckpt.parity-00001-of-00002.tmp", &rank, &ranks));
  EXPECT_FALSE(ParseParityFileName("ckpt.data-00001-of-00002", &rank, &ranks));
  // Files written before `storage` and `host` existed read as shared, host unknown.
  auto old = CheckpointMeta::FromJson(R"({"format": "ckptd/1", "hosts": [{"rank": 0}]})");
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_EQ(old->storage, "shared");
  EXPECT_EQ(old->hosts[0].host, "");
  for (const std::string& bad :
       {std::string("[]"), std::string("{\"format\": \"other/1\"}"),
        std::string("{\"format\": \"ckptd/1\", \"step\": \"x\"}"), std::string("{"),
        // Dims of the wrong type: not an array, or an array of something else.
        std::string(R"({"format": "ckptd/1", "tensors": [{"name": "w", "shape": 4}]})"),
        std::string(R"({"format": "ckptd/1", "tensors": [{"name": "w", "shape": [4, "2"]}]})"),
        std::string(R"({"format": "ckptd/1", "tensors": [{"name": "w", "boxes": [{"start": {}}]}]})")}) {
    EXPECT_EQ(CheckpointMeta::FromJson(bad).status().code(), absl::StatusCode::kDataLoss) << bad;
  }
}

}  // namespace
}  // namespace ckptd

namespace ckptd {
namespace {

TEST(DataFileWriterTest, AlignsLargeEntriesAndTheIndexReadsWhatItWrote) {
  testing::TempDir dir;
  const std::string prefix = dir.Sub("ckpt");
  auto writer = DataFileWriter::Create(PosixFileSystem(), DataPath(prefix, 0, 1));
  ASSERT_TRUE(writer.ok()) << writer.status();
  std::vector<float> small(3, 1.5f), tail = {7.0f, 8.0f};
  std::vector<float> large((2 << 20) / 4);
  for (size_t i = 0; i < large.size(); ++i) large[i] = static_cast<float>(i % 977);
  auto view = [](const std::vector<float>& v) {
    return absl::string_view(reinterpret_cast<const char*>(v.data()), v.size() * 4);
  };
  auto a = (*writer)->Append(kFloat, 3, view(small));
  auto b = (*writer)->Append(kFloat, static_cast<int64_t>(large.size()), view(large));
  auto c = (*writer)->Append(kFloat, 2, view(tail));
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(a->offset, 0);
  EXPECT_EQ(b->offset, 4096);              // 1 MiB or more: padded to a 4 KiB boundary
  EXPECT_EQ(c->offset, 4096 + (2 << 20));  // small entries follow directly
  EXPECT_EQ(a->crc32c, *EntryChecksum(kFloat, 3, reinterpret_cast<const char*>(small.data()), 12));
  ASSERT_TRUE((*writer)->Finish().ok());
  EXPECT_EQ(*PosixFileSystem()->FileSize(DataPath(prefix, 0, 1)), static_cast<uint64_t>(c->offset + 8));

  // "w" saved as two pieces (the small one and the tail) and "big" whole.
  IndexBuilder index(1);
  auto entry = [](const DataFileWriter::Written& w, size_t size) {
    tf::BundleEntryProto e;
    e.set_offset(w.offset);
    e.set_size(static_cast<int64_t>(size));
    e.set_crc32c(w.crc32c);
    return e;
  };
  ASSERT_TRUE(
      index.AddTensor("w", kFloat, {5}, {{Box{{0}, {3}}, entry(*a, 12)}, {Box{{3}, {2}}, entry(*c, 8)}})
          .ok());
  ASSERT_TRUE(index
                  .AddTensor("big", kFloat, {static_cast<int64_t>(large.size())},
                             {{Box::Full({static_cast<int64_t>(large.size())}), entry(*b, large.size() * 4)}})
                  .ok());
  auto bytes = index.Finish();
  ASSERT_TRUE(bytes.ok());
  ASSERT_TRUE(PosixFileSystem()->WriteFileAtomically(IndexPath(prefix), *bytes).ok());
  auto reader = BundleReader::Open(PosixFileSystem(), prefix);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->TensorNames(), (std::vector<std::string>{"big", "w"}));
  EXPECT_EQ((*reader)->Find("w")->slices_size(), 2);
  EXPECT_EQ((*reader)->Find("big")->slices_size(), 0);
  auto w = (*reader)->Lookup("w");
  ASSERT_TRUE(w.ok());
  std::vector<float> back(5);
  ASSERT_TRUE((*reader)->ReadBox(*w, Box::Full({5}), reinterpret_cast<char*>(back.data())).ok());
  EXPECT_EQ(back, (std::vector<float>{1.5f, 1.5f, 1.5f, 7.0f, 8.0f}));
  std::vector<std::string> problems;
  int64_t checked = 0;
  EXPECT_EQ((*reader)->VerifyAll(&problems, &checked), 3);
  EXPECT_TRUE(problems.empty()) << problems[0];
}

TEST(WriteDataFileTest, WritesInOrderChecksumsOnHelpersAndReleasesEachEntryOnce) {
  testing::TempDir dir;
  const std::string path = DataPath(dir.Sub("ckpt"), 0, 1);
  std::vector<std::string> payloads = {std::string(12, 'a'), std::string((1 << 20) + 8, 'b'), "",
                                       EncodeStringScalar("state")};
  for (size_t i = 0; i < payloads[1].size(); ++i) payloads[1][i] = static_cast<char>(i * 31 + 7);
  const int dtypes[] = {kFloat, kInt8, kFloat, kString};
  const int64_t elements[] = {3, static_cast<int64_t>(payloads[1].size()), 0, 1};
  std::vector<int> released(payloads.size(), 0);
  std::vector<DataFileEntry> entries;
  for (size_t i = 0; i < payloads.size(); ++i) {
    entries.push_back(
        {.dtype = dtypes[i], .elements = elements[i], .bytes = payloads[i], .done = [&released, i] {
           ++released[i];
         }});
  }
  int64_t file_bytes = 0;
  auto written = WriteDataFile(PosixFileSystem(), path, entries, /*checksum_threads=*/3, &file_bytes);
  ASSERT_TRUE(written.ok()) << written.status();
  ASSERT_EQ(written->size(), payloads.size());
  EXPECT_EQ(released, (std::vector<int>{1, 1, 1, 1}));
  EXPECT_EQ((*written)[0].offset, 0);
  EXPECT_EQ((*written)[1].offset, 4096);  // the large entry starts 4 KiB-aligned
  const std::string file = *PosixFileSystem()->ReadFileToString(path, 1 << 22);
  EXPECT_EQ(static_cast<int64_t>(file.size()), file_bytes);
  for (size_t i = 0; i < payloads.size(); ++i) {
    EXPECT_EQ(file.substr(static_cast<size_t>((*written)[i].offset), payloads[i].size()), payloads[i]) << i;
    EXPECT_EQ((*written)[i].crc32c,
              *EntryChecksum(dtypes[i], elements[i], payloads[i].data(), payloads[i].size()))
        << i;
  }
  // A directory in the way: the write fails, with nothing released that was not reached.
  std::vector<int> untouched(payloads.size(), 0);
  for (size_t i = 0; i < entries.size(); ++i) entries[i].done = [&untouched, i] { ++untouched[i]; };
  ASSERT_TRUE(PosixFileSystem()->CreateDirs(dir.Sub("blocked"), 0755).ok());
  EXPECT_FALSE(WriteDataFile(PosixFileSystem(), dir.Sub("blocked"), entries, 2, &file_bytes).ok());
  EXPECT_EQ(untouched, (std::vector<int>{0, 0, 0, 0}));
}

TEST(IndexBuilderTest, AKeyAddedTwiceFailsTheIndexWithAlreadyExistsNamingIt) {
  IndexBuilder index(1);
  tf::BundleEntryProto entry;
  ASSERT_TRUE(index.Add("b", entry).ok());
  ASSERT_TRUE(index.Add("a", entry).ok());
  ASSERT_TRUE(index.Add("b", entry).ok());  // found when the keys are sorted, at Finish
  absl::StatusOr<std::string> built = index.Finish();
  EXPECT_EQ(built.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_NE(built.status().message().find("'b'"), absl::string_view::npos) << built.status();
  EXPECT_EQ(index.Add("", entry).code(), absl::StatusCode::kInvalidArgument);
}

// A large entry is read in chunks through the disk's O_DIRECT slots, its unaligned
// tail apart: it is checked whole, and a flipped byte in any chunk (the first, one in
// the middle, the tail) is DATA_LOSS naming the tensor.
TEST(BundleLargeEntryTest, AnEntryReadInChunksIsCheckedWholeAndAFlipInAnyChunkIsDataLoss) {
  testing::TempDir dir;
  const std::string prefix = dir.Sub("ckpt");
  const size_t size = (9 << 20) + 4097;
  std::string bytes(size, '\0');
  for (size_t i = 0; i < size; ++i) bytes[i] = static_cast<char>((i * 2654435761u) >> 11);
  tf::BundleEntryProto entry;
  entry.set_dtype(kUint8);
  *entry.mutable_shape() = ShapeToProto({static_cast<int64_t>(size)});
  entry.set_shard_id(0);
  entry.set_offset(4096);  // the disk's reads start on a block
  entry.set_size(static_cast<int64_t>(size));
  entry.set_crc32c(crc32c::Mask(crc32c::Value(bytes.data(), size)));
  IndexBuilder index(1);
  ASSERT_TRUE(index.Add("big", entry).ok());
  auto index_bytes = index.Finish();
  ASSERT_TRUE(index_bytes.ok());
  ASSERT_TRUE(fs()->WriteFileAtomically(IndexPath(prefix), *index_bytes).ok());
  const std::string data_path = DataPath(prefix, 0, 1);
  constexpr size_t kNone = SIZE_MAX;
  for (size_t flip : {kNone, size_t{17}, (size_t{4} << 20) + 1, size - 1}) {
    std::string data = std::string(4096, 'p') + bytes;
    const bool flipped = flip != kNone;
    if (flipped) data[4096 + flip] ^= 0x10;
    ASSERT_TRUE(fs()->WriteFileAtomically(data_path, data).ok());
    auto reader = BundleReader::Open(fs(), prefix);
    ASSERT_TRUE(reader.ok()) << reader.status();
    std::string out(size, '\0');
    absl::Status s = (*reader)->ReadEntry("big", entry, out.data());
    const std::string where = absl::StrCat("flip at ", flip);
    if (!flipped) {
      ASSERT_TRUE(s.ok()) << where << ": " << s;
      EXPECT_TRUE(out == bytes) << where;
      continue;
    }
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << where << ": " << s;
    EXPECT_NE(s.message().find("tensor big: checksum mismatch in"), absl::string_view::npos) << where << s;
  }
}

}  // namespace
}  // namespace ckptd
