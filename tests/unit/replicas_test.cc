#include "daemon/coord/replicas.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>

namespace ckptd {
namespace {

using ::testing::ElementsAre;

TEST(PlaceReplicasTest, NoneWhenZero) {
  auto copies = PlaceReplicas({"h0", "h1"}, 0);
  ASSERT_TRUE(copies.ok());
  EXPECT_THAT(*copies, ElementsAre(ElementsAre(), ElementsAre()));
}

TEST(PlaceReplicasTest, NextHostsAroundTheRing) {
  auto copies = PlaceReplicas({"h0", "h1", "h2", "h3"}, 2);
  ASSERT_TRUE(copies.ok()) << copies.status();
  EXPECT_THAT(*copies,
              ElementsAre(ElementsAre(1, 2), ElementsAre(2, 3), ElementsAre(3, 0), ElementsAre(0, 1)));
}

TEST(PlaceReplicasTest, CopiesNeverShareAFailureDomain) {
  // Two racks of two hosts: a file's copy must be on the other rack.
  const std::vector<std::string> racks = {"a", "a", "b", "b"};
  auto copies = PlaceReplicas(racks, 1);
  ASSERT_TRUE(copies.ok()) << copies.status();
  EXPECT_THAT(*copies, ElementsAre(ElementsAre(2), ElementsAre(2), ElementsAre(0), ElementsAre(0)));
  // Several daemons on one host are one domain (their host name).
  auto same_host = PlaceReplicas({"x", "x", "y"}, 1);
  ASSERT_TRUE(same_host.ok());
  EXPECT_THAT(*same_host, ElementsAre(ElementsAre(2), ElementsAre(2), ElementsAre(0)));
}

TEST(PlaceReplicasTest, TooFewDomainsIsAnErrorNamingThem) {
  auto copies = PlaceReplicas({"a", "a", "b"}, 2);
  EXPECT_EQ(copies.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(copies.status().message().find("need 3 hosts"), std::string::npos) << copies.status();
  EXPECT_NE(copies.status().message().find("(a, b)"), std::string::npos) << copies.status();
}

TEST(PlaceReplicasTest, EveryPlacementIsValidForManyShapes) {
  for (int ranks = 1; ranks <= 9; ++ranks) {
    for (int racks = 1; racks <= ranks; ++racks) {
      std::vector<std::string> domains;
      for (int r = 0; r < ranks; ++r) domains.push_back(std::to_string(r % racks));
      for (int k = 0; k < racks; ++k) {
        auto copies = PlaceReplicas(domains, k);
        ASSERT_TRUE(copies.ok()) << ranks << " ranks, " << racks << " racks, k " << k;
        for (int r = 0; r < ranks; ++r) {
          std::set<std::string> seen = {domains[r]};
          ASSERT_EQ(static_cast<int>((*copies)[r].size()), k);
          for (int c : (*copies)[r]) EXPECT_TRUE(seen.insert(domains[c]).second) << "rank " << r;
        }
      }
      EXPECT_FALSE(PlaceReplicas(domains, racks).ok());
    }
  }
}

}  // namespace
}  // namespace ckptd
