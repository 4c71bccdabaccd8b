#include "daemon/layout/mesh.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <set>

#include "daemon/layout/cast.h"
#include "daemon/plan/save_plan.h"

namespace ckptd {
namespace {

const char kMesh2x4[] =
    "|x=2,y=4|0,1,2,3,4,5,6,7|0,1,2,3,4,5,6,7|/job:localhost/replica:0/task:0/device:CPU:0,"
    "/job:localhost/replica:0/task:0/device:CPU:1,/job:localhost/replica:0/task:0/device:CPU:2,"
    "/job:localhost/replica:0/task:0/device:CPU:3,/job:localhost/replica:0/task:0/device:CPU:4,"
    "/job:localhost/replica:0/task:0/device:CPU:5,/job:localhost/replica:0/task:0/device:CPU:6,"
    "/job:localhost/replica:0/task:0/device:CPU:7";

TEST(MeshTest, ParsesDTensorLayoutStringAndRoundTrips) {
  const std::string text = std::string("sharding_specs:x,unsharded, mesh:") + kMesh2x4;
  auto layout = ParseLayout(text);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->sharding_specs, (std::vector<std::string>{"x", "unsharded"}));
  EXPECT_EQ(layout->mesh.dims.size(), 2u);
  EXPECT_EQ(layout->mesh.size(), 8);
  EXPECT_EQ(layout->mesh.local_devices.size(), 8u);
  EXPECT_EQ(layout->ToString(), text);
  EXPECT_EQ(layout->mesh.ToString(), kMesh2x4);
}

TEST(MeshTest, OptionalPartsRoundTrip) {
  for (const std::string text : {"name|a=2|5,9|5|/d:0|/g:0,/g:1", "|a=2|0,1|||use_xla_spmd",
                                 "|a=1,b=3|0,1,2|||/g:0,/g:1,/g:2|use_xla_spmd"}) {
    auto mesh = ParseMesh(text);
    ASSERT_TRUE(mesh.ok()) << text << ": " << mesh.status();
    EXPECT_EQ(mesh->ToString(), text);
  }
}

TEST(MeshTest, MalformedMeshesAreNamed) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"|x=2", "parts"},
      {"|x=2|0,1|0|", "local devices"},
      {"|x|0,1|||", "name=size"},
      {"|x=0|||", "name=size"},
      {"|x=two|0,1|||", "name=size"},
      {"|x=2,x=2|0,1,2,3|||", "twice"},
      {"||0|||", "no dimensions"},
      {"|x=2|0|||", "global device ids"},
      {"|x=2|0,0|||", "appears twice"},
      {"|x=2|0,a|||", "non-negative"},
      {"|x=2|0,1|7|/d:7|", "not a global id"},
      {"|unsharded=2|0,1|||", "reserved"},
      {"|x=2|0,1||||bogus", "unexpected"},
      // 2^32 x 2^32 wraps a 64-bit product to 0: each factor must be checked.
      {"|x=4294967296,y=4294967296|0|0|/d:0", "more than 2^24 devices"},
      {"|x=4096,y=4096,z=2|0|0|/d:0", "more than 2^24 devices"},
  };
  for (const auto& [text, needle] : cases) {
    auto mesh = ParseMesh(text);
    ASSERT_FALSE(mesh.ok()) << text;
    EXPECT_EQ(mesh.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_NE(mesh.status().message().find(needle), absl::string_view::npos) << text << ": " << mesh.status();
  }
}

TEST(MeshTest, MalformedLayoutsAreNamed) {
  const std::string mesh = "|x=2,y=4|0,1,2,3,4,5,6,7|||";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"x,unsharded, mesh:" + mesh, "sharding_specs:"},
      {"sharding_specs:x,unsharded,mesh:" + mesh, "mesh:"},
      {"sharding_specs:x,unsharded " + mesh, "mesh:"},
      {"sharding_specs:x,unsharded mesh:" + mesh, "ends with ','"},
      {"sharding_specs:x,,unsharded, mesh:" + mesh, "empty sharding spec"},
      {"sharding_specs:z, mesh:" + mesh, "'z'"},
      {"sharding_specs:x,x, mesh:" + mesh, "shards two"},
      {"sharding_specs:x, mesh:|x=2", "parts"},
  };
  for (const auto& [text, needle] : cases) {
    auto layout = ParseLayout(text);
    ASSERT_FALSE(layout.ok()) << text;
    EXPECT_EQ(layout.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(layout.status().message().find(needle), absl::string_view::npos)
        << text << ": " << layout.status();
  }
}

TEST(MeshTest, BoxForEveryDeviceTilesTheTensor) {
  auto mesh = ParseMesh("|x=2,y=4|0,1,2,3,4,5,6,7|||");
  ASSERT_TRUE(mesh.ok());
  const Shape shape{6, 8};
  for (const std::vector<std::string>& specs : std::vector<std::vector<std::string>>{
           {"x", "y"}, {"y", "x"}, {"x", "unsharded"}, {"unsharded", "y"}, {"unsharded", "unsharded"}}) {
    auto layout = MakeLayout(specs, *mesh);
    ASSERT_TRUE(layout.ok());
    std::set<Box> distinct;
    for (int64_t d = 0; d < 8; ++d) {
      auto box = layout->BoxFor(shape, d);
      if (specs[0] == "y") {  // 6 rows over y=4 does not divide
        ASSERT_FALSE(box.ok());
        EXPECT_NE(box.status().message().find("dimension 0"), absl::string_view::npos);
        EXPECT_NE(box.status().message().find("'y'"), absl::string_view::npos);
        break;
      }
      ASSERT_TRUE(box.ok()) << box.status();
      distinct.insert(*box);
    }
    if (specs[0] == "y") continue;
    EXPECT_TRUE(CheckTiling({distinct.begin(), distinct.end()}, shape, "t").ok());
  }
}

TEST(MeshTest, DeviceCoordinatesAreRowMajor) {
  auto mesh = ParseMesh("|x=2,y=4|10,11,12,13,14,15,16,17|||");
  ASSERT_TRUE(mesh.ok());
  EXPECT_EQ(*mesh->Coordinates(10), (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(*mesh->Coordinates(13), (std::vector<int64_t>{0, 3}));
  EXPECT_EQ(*mesh->Coordinates(14), (std::vector<int64_t>{1, 0}));
  EXPECT_FALSE(mesh->Coordinates(3).ok());
  auto layout = MakeLayout({"y", "x"}, *mesh);
  auto box = layout->BoxFor({8, 4}, 16);  // x=1, y=2
  ASSERT_TRUE(box.ok());
  EXPECT_EQ(box->start, (Shape{4, 2}));
  EXPECT_EQ(box->length, (Shape{2, 2}));
}

TEST(MeshCoverageTest, AcceptsExactCoverAndRecordsMeshWithoutLocalParts) {
  const std::string mesh = "|x=2|0,1|0|/cpu:0";
  auto recorded = CheckMeshCoverage({{0, 0, mesh, {0}}, {1, 1, "|x=2|0,1|1|/cpu:1", {1}}});
  ASSERT_TRUE(recorded.ok()) << recorded.status();
  EXPECT_EQ(*recorded, "|x=2|0,1||");
  EXPECT_EQ(*CheckMeshCoverage({{0, 0, "", {}}}), "");
}

TEST(MeshCoverageTest, RejectsDisagreementGapsAndDoubleClaims) {
  const std::string mesh = "|x=4|0,1,2,3|||";
  EXPECT_NE(CheckMeshCoverage({{0, 0, mesh, {0, 1}}, {1, 1, "|x=2,y=2|0,1,2,3|||", {2, 3}}})
                .status()
                .message()
                .find("disagree"),
            absl::string_view::npos);
  EXPECT_NE(CheckMeshCoverage({{0, 0, mesh, {0, 1}}, {1, 1, mesh, {2}}}).status().message().find("devices 3"),
            absl::string_view::npos);
  EXPECT_NE(
      CheckMeshCoverage({{0, 0, mesh, {0, 1, 2}}, {1, 1, mesh, {2, 3}}}).status().message().find("device 2"),
      absl::string_view::npos);
  EXPECT_NE(
      CheckMeshCoverage({{0, 0, mesh, {0, 1, 2, 3}}, {1, 1, "", {}}}).status().message().find("no mesh"),
      absl::string_view::npos);
}

float FromBits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

TEST(CastTest, Bfloat16RoundsToNearestEven) {
  EXPECT_EQ(FloatToBfloat16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBfloat16(-2.0f), 0xc000);
  EXPECT_EQ(FloatToBfloat16(FromBits(0x3f808000)), 0x3f80);  // tie, even stays
  EXPECT_EQ(FloatToBfloat16(FromBits(0x3f818000)), 0x3f82);  // tie, odd rounds up
  EXPECT_EQ(FloatToBfloat16(FromBits(0x3f808001)), 0x3f81);  // above the tie
  EXPECT_EQ(FloatToBfloat16(FromBits(0x3f807fff)), 0x3f80);  // below the tie
  EXPECT_EQ(FloatToBfloat16(FromBits(0x7f7fffff)), 0x7f80);  // max float rounds to inf
  EXPECT_EQ(FloatToBfloat16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(FloatToBfloat16(-std::numeric_limits<float>::infinity()), 0xff80);
  const uint16_t nan = FloatToBfloat16(FromBits(0x7f800001));  // signalling NaN with low payload only
  EXPECT_TRUE(std::isnan(Bfloat16ToFloat(nan)));
  EXPECT_TRUE(std::isnan(Bfloat16ToFloat(FloatToBfloat16(-std::nanf("")))));
  EXPECT_TRUE(std::signbit(Bfloat16ToFloat(FloatToBfloat16(-std::nanf("")))));
  EXPECT_EQ(Bfloat16ToFloat(0x4049), 3.140625f);
}

TEST(CastTest, HalfRoundsToNearestEvenWithSubnormalsAndOverflow) {
  EXPECT_EQ(FloatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalf(-2.5f), 0xc100);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65519.0f), 0x7bff);  // below the tie with infinity
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);  // tie rounds to even: infinity
  EXPECT_EQ(FloatToHalf(1e10f), 0x7c00);
  EXPECT_EQ(FloatToHalf(FromBits(0x33800000)), 0x0001);  // 2^-24, smallest subnormal
  EXPECT_EQ(FloatToHalf(FromBits(0x33000000)), 0x0000);  // 2^-25: tie with zero, even
  EXPECT_EQ(FloatToHalf(FromBits(0x33400000)), 0x0001);  // 1.5 x 2^-25 rounds up
  EXPECT_EQ(FloatToHalf(FromBits(0x38800000)), 0x0400);  // 2^-14, smallest normal
  EXPECT_EQ(FloatToHalf(1.0f + 1.0f / 2048), 0x3c00);    // tie at 1 + 2^-11: even
  EXPECT_EQ(FloatToHalf(1.0f + 3.0f / 2048), 0x3c02);    // tie, odd rounds up
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(std::nanf("")))));
  EXPECT_EQ(HalfToFloat(0x0001), FromBits(0x33800000));
  EXPECT_EQ(HalfToFloat(0x03ff), 1023.0f / (1 << 24));
  EXPECT_EQ(HalfToFloat(0xfc00), -std::numeric_limits<float>::infinity());
  // Every finite half converts to float and back unchanged.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00) continue;
    ASSERT_EQ(FloatToHalf(HalfToFloat(static_cast<uint16_t>(h))), h) << std::hex << h;
  }
}

TEST(CastTest, ConvertElementsPairs) {
  std::vector<float> in = {1.5f, -0.0f, 3.0e38f};
  std::vector<uint16_t> bf(3), h(3);
  ASSERT_TRUE(
      ConvertElements(1, reinterpret_cast<const char*>(in.data()), 14, reinterpret_cast<char*>(bf.data()), 3)
          .ok());
  EXPECT_EQ(bf[0], 0x3fc0);
  EXPECT_EQ(bf[1], 0x8000);
  ASSERT_TRUE(
      ConvertElements(14, reinterpret_cast<const char*>(bf.data()), 19, reinterpret_cast<char*>(h.data()), 3)
          .ok());
  EXPECT_EQ(h[0], 0x3e00);
  EXPECT_EQ(h[2], 0x7c00);  // too large for half
  EXPECT_EQ(ConvertElements(1, nullptr, 9, nullptr, 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(IsConvertible(3, 1));
}

}  // namespace
}  // namespace ckptd
