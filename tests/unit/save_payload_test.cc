// SavePayloadBuilder without gRPC: chunks that straddle boxes, byte counts that do not
// match the descriptors, boxes two devices both hold, bfloat16 narrowing, trainer state.
#include "daemon/service/save_payload.h"

#include <gtest/gtest.h>

#include <cstring>

#include "ckptd/v1/wire.h"
#include "daemon/base/dtype.h"
#include "daemon/bundle/bundle.h"

namespace ckptd {
namespace {

CheckedTensor Tensor(const std::string& name, int dtype, Shape shape, std::vector<Box> boxes) {
  CheckedTensor t;
  t.name = name;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.boxes = std::move(boxes);
  for (const Box& b : t.boxes) t.bytes += b.NumElements() * static_cast<int64_t>(DataTypeSize(dtype));
  return t;
}

std::string Bytes(const StagedBuffer& b) { return std::string(b.data(), static_cast<size_t>(b.size())); }

class SavePayloadTest : public ::testing::Test {
 protected:
  StagingArea staging_;
  std::unique_ptr<DeviceStager> device_ = DeviceStager::Create();
  v1::SaveHeader header_;
  const absl::Time deadline_ = absl::Now() + absl::Seconds(10);
};

TEST_F(SavePayloadTest, ChunksThatStraddleBoxesLandInOrder) {
  // 12 bytes of a whole float tensor, then row 1 of an int8 [2,4] tensor.
  const std::vector<CheckedTensor> tensors = {
      Tensor("a", kFloat, {3}, {Box::Full({3})}),
      Tensor("b", kInt8, {2, 4}, {Box{{1, 0}, {1, 4}}}),
  };
  SavePayloadBuilder builder(&staging_, device_.get(), tensors, deadline_);
  ASSERT_EQ(builder.host_bytes(), 16);
  std::string stream(16, '\0');
  for (size_t i = 0; i < stream.size(); ++i) stream[i] = static_cast<char>('A' + i);
  for (size_t at : {0, 5, 10}) ASSERT_TRUE(builder.AddChunk(stream.substr(at, at == 10 ? 6 : 5)).ok());
  ASSERT_TRUE(builder.EndOfStream().ok());
  ASSERT_TRUE(builder.CopyFromDevice().ok());
  header_.set_trainer_id(3);
  absl::StatusOr<TrainerPayload> payload = builder.Build(header_, Placement{});
  ASSERT_TRUE(payload.ok()) << payload.status();
  EXPECT_EQ(payload->trainer_id, 3);
  ASSERT_EQ(payload->tensors.size(), 2u);
  EXPECT_EQ(payload->tensors[0].name, "a");
  EXPECT_EQ(Bytes(payload->tensors[0].bytes), stream.substr(0, 12));
  EXPECT_EQ(payload->tensors[1].name, "b");
  EXPECT_EQ(payload->tensors[1].box, (Box{{1, 0}, {1, 4}}));
  EXPECT_EQ(Bytes(payload->tensors[1].bytes), stream.substr(12));
  EXPECT_EQ(staging_.bytes_staged(), 16);
}

TEST_F(SavePayloadTest, ByteCountsThatDisagreeWithTheDescriptorsAreRefused) {
  const std::vector<CheckedTensor> tensors = {Tensor("a", kFloat, {4}, {Box::Full({4})})};
  {
    SavePayloadBuilder builder(&staging_, device_.get(), tensors, deadline_);
    ASSERT_TRUE(builder.AddChunk(std::string(10, 'x')).ok());
    const absl::Status s = builder.AddChunk(std::string(7, 'x'));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find("more bytes than the descriptors need (16"), absl::string_view::npos) << s;
  }
  {
    SavePayloadBuilder builder(&staging_, device_.get(), tensors, deadline_);
    ASSERT_TRUE(builder.AddChunk(std::string(10, 'x')).ok());
    const absl::Status s = builder.EndOfStream();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find("received 10 bytes but the descriptors need 16"), absl::string_view::npos)
        << s;
  }
  {
    SavePayloadBuilder builder(&staging_, device_.get(), tensors, deadline_);
    const absl::Status s = builder.AddChunk(std::string(wire::kSaveChunkBytes + 1, 'x'));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  }
  EXPECT_EQ(staging_.bytes_staged(), 0);  // the refused builders gave their memory back
}

TEST_F(SavePayloadTest, ABoxTwoDevicesHoldIsStagedOnceAndAnEmptyBoxStillGetsABuffer) {
  // A replicated layout: both devices send the whole tensor; the stream carries both.
  CheckedTensor replicated = Tensor("r", kInt32, {2}, {Box::Full({2}), Box::Full({2})});
  replicated.has_layout = true;
  replicated.sharding_specs = {"unsharded"};
  const std::vector<CheckedTensor> tensors = {replicated, Tensor("empty", kFloat, {0}, {Box::Full({0})})};
  SavePayloadBuilder builder(&staging_, device_.get(), tensors, deadline_);
  ASSERT_EQ(builder.host_bytes(), 16);
  ASSERT_TRUE(builder
                  .AddChunk("12345678"
                            "12345678")
                  .ok());
  ASSERT_TRUE(builder.EndOfStream().ok());
  absl::StatusOr<TrainerPayload> payload = builder.Build(header_, Placement{});
  ASSERT_TRUE(payload.ok()) << payload.status();
  ASSERT_EQ(payload->tensors.size(), 2u);
  EXPECT_EQ(Bytes(payload->tensors[0].bytes), "12345678");
  EXPECT_TRUE(payload->tensors[0].has_layout);
  EXPECT_TRUE(payload->tensors[1].bytes.allocated());
  EXPECT_EQ(payload->tensors[1].bytes.size(), 0);
}

TEST_F(SavePayloadTest, Float32NarrowsToBfloat16AndTrainerStateBecomesStringScalars) {
  const std::vector<CheckedTensor> tensors = {Tensor("f", kFloat, {2}, {Box::Full({2})}),
                                              Tensor("i", kInt32, {1}, {Box::Full({1})})};
  SavePayloadBuilder builder(&staging_, device_.get(), tensors, deadline_);
  const float values[2] = {1.0f, -2.0f};
  std::string stream(reinterpret_cast<const char*>(values), 8);
  stream += std::string("\x07\0\0\0", 4);
  ASSERT_TRUE(builder.AddChunk(stream).ok());
  header_.set_trainer_id(1);
  header_.set_store_float32_as_bfloat16(true);
  (*header_.mutable_trainer_state())["iterator"] = "position-9";
  absl::StatusOr<TrainerPayload> payload = builder.Build(header_, Placement{});
  ASSERT_TRUE(payload.ok()) << payload.status();
  ASSERT_EQ(payload->tensors.size(), 3u);
  EXPECT_EQ(payload->tensors[0].dtype, kBfloat16);
  const uint16_t want[2] = {0x3f80, 0xc000};
  EXPECT_EQ(Bytes(payload->tensors[0].bytes), std::string(reinterpret_cast<const char*>(want), 4));
  EXPECT_EQ(payload->tensors[1].dtype, kInt32);  // only float32 narrows
  EXPECT_EQ(payload->tensors[2].name, TrainerStateName(1, "iterator"));
  EXPECT_EQ(payload->tensors[2].dtype, kString);
  EXPECT_EQ(Bytes(payload->tensors[2].bytes), EncodeStringScalar("position-9"));
}

}  // namespace
}  // namespace ckptd
