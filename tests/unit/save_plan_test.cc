#include "daemon/plan/save_plan.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace ckptd {
namespace {

ShardRef Shard(const std::string& name, Shape shape, Box box, int host, int trainer, int dtype = 1) {
  return {name, dtype, std::move(shape), std::move(box), host, trainer, 0, false, {}};
}

TEST(SavePlanTest, ReplicatedBoxWrittenOnce) {
  std::vector<ShardRef> shards;
  for (int t = 0; t < 4; ++t) shards.push_back(Shard("bias", {8}, Box{{0}, {8}}, t / 2, t));
  auto plan = MakeSavePlan(shards, 2);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->tensors.size(), 1u);
  EXPECT_EQ(plan->tensors[0].boxes.size(), 1u);
}

TEST(SavePlanTest, ShardedAndPartiallyReplicated) {
  std::vector<ShardRef> shards;
  for (int t = 0; t < 4; ++t) {
    shards.push_back(Shard("w", {8, 2}, Box{{t * 2, 0}, {2, 2}}, t / 2, t));
    shards.push_back(Shard("m", {8}, Box{{(t % 2) * 4}, {4}}, t / 2, t));
  }
  auto plan = MakeSavePlan(shards, 2);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->tensors.size(), 2u);
  EXPECT_EQ(plan->tensors[0].name, "m");
  EXPECT_EQ(plan->tensors[0].boxes.size(), 2u);
  EXPECT_EQ(plan->tensors[1].boxes.size(), 4u);
  // Each sharded box is written by the host holding it.
  for (const PlannedBox& b : plan->tensors[1].boxes) EXPECT_EQ(b.writer, b.box.start[0] / 4);
}

TEST(SavePlanTest, BalancesReplicatedBytesAcrossHosts) {
  // 64 equal fully replicated tensors on 4 hosts: each host should write 16.
  std::vector<ShardRef> shards;
  for (int i = 0; i < 64; ++i)
    for (int h = 0; h < 4; ++h)
      shards.push_back(Shard("t" + std::to_string(i), {256}, Box{{0}, {256}}, h, h));
  auto plan = MakeSavePlan(shards, 4);
  ASSERT_TRUE(plan.ok());
  for (int64_t bytes : plan->bytes_per_host) EXPECT_EQ(bytes, 16 * 256 * 4);
}

TEST(SavePlanTest, DeterministicAcrossInputOrder) {
  std::vector<ShardRef> shards;
  for (int i = 0; i < 10; ++i)
    for (int h = 0; h < 3; ++h)
      shards.push_back(Shard("t" + std::to_string(i), {i + 1}, Box{{0}, {i + 1}}, h, h));
  auto a = MakeSavePlan(shards, 3);
  std::reverse(shards.begin(), shards.end());
  auto b = MakeSavePlan(shards, 3);
  ASSERT_TRUE(a.ok() && b.ok());
  for (size_t i = 0; i < a->tensors.size(); ++i)
    EXPECT_EQ(a->tensors[i].boxes[0].writer, b->tensors[i].boxes[0].writer);
}

TEST(SavePlanTest, DtypeMismatchNamesTensor) {
  auto plan =
      MakeSavePlan({Shard("w", {4}, Box{{0}, {2}}, 0, 0, 1), Shard("w", {4}, Box{{2}, {2}}, 1, 1, 9)}, 2);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(plan.status().message().find("'w'"), absl::string_view::npos);
}

TEST(SavePlanTest, ShapeMismatchNamesTensor) {
  auto plan = MakeSavePlan({Shard("w", {4}, Box{{0}, {2}}, 0, 0), Shard("w", {6}, Box{{2}, {2}}, 1, 1)}, 2);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(plan.status().message().find("'w'"), absl::string_view::npos);
}

TEST(SavePlanTest, OverlapAndGapFail) {
  auto overlap =
      MakeSavePlan({Shard("w", {4}, Box{{0}, {3}}, 0, 0), Shard("w", {4}, Box{{2}, {2}}, 1, 1)}, 2);
  EXPECT_EQ(overlap.status().code(), absl::StatusCode::kInvalidArgument);
  auto gap = MakeSavePlan({Shard("w", {4}, Box{{0}, {2}}, 0, 0)}, 1);
  EXPECT_EQ(gap.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SavePlanTest, TrainerOnTwoHostsFails) {
  auto plan = MakeSavePlan({Shard("a", {1}, Box{{0}, {1}}, 0, 3), Shard("b", {1}, Box{{0}, {1}}, 1, 3)}, 2);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ckptd
