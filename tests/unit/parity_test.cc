#include "daemon/coord/parity.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

namespace ckptd {
namespace {

TEST(StripeLayoutTest, EveryMemberHoldsPParityChunksOfStripesItsDataIsNotIn) {
  for (int g = 2; g <= 9; ++g) {
    for (int p = 1; p < g; ++p) {
      const StripeLayout layout(g, p);
      std::vector<int> held(g, 0), data_in(g, 0);
      for (int s = 0; s < g; ++s) {
        const std::vector<int> holders = layout.Holders(s), data = layout.DataMembers(s);
        ASSERT_EQ(static_cast<int>(holders.size()), p);
        ASSERT_EQ(static_cast<int>(data.size()), g - p);
        std::set<int> all(holders.begin(), holders.end());
        all.insert(data.begin(), data.end());
        EXPECT_EQ(static_cast<int>(all.size()), g) << "holders and data overlap in stripe " << s;
        for (int h : holders) ++held[h];
        for (int d : data) ++data_in[d];
      }
      for (int m = 0; m < g; ++m) {
        EXPECT_EQ(held[m], p) << g << "/" << p << " member " << m;
        EXPECT_EQ(data_in[m], g - p);
        const std::vector<int> stripes = layout.DataStripes(m);
        ASSERT_EQ(static_cast<int>(stripes.size()), g - p);
        for (int s : stripes) {
          const std::vector<int> data = layout.DataMembers(s);
          EXPECT_NE(std::find(data.begin(), data.end(), m), data.end());
        }
        for (const auto& [s, row] : layout.HeldParity(m)) EXPECT_EQ(layout.Holders(s)[row], m);
      }
    }
  }
}

TEST(StripeLayoutTest, SegmentsAreTheLargestFilesShareRoundedToBlocks) {
  const StripeLayout layout(4, 1);
  EXPECT_EQ(layout.SegmentBytes({3 * 4096, 100, 0, 3 * 4096 + 1}), 8192);
  EXPECT_EQ(layout.SegmentBytes({0, 0, 0, 0}), 0);
  EXPECT_EQ(StripeLayout(4, 2).SegmentBytes({10}), 4096);
}

std::vector<uint8_t> RandomBytes(std::mt19937& random, size_t n) {
  std::vector<uint8_t> bytes(n);
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(random());
  return bytes;
}

TEST(ParityCoderTest, AnyKOfTheChunksRebuildTheDataAndFewerAreDataLoss) {
  std::mt19937 random(7);
  for (const auto& [k, p] : std::vector<std::pair<int, int>>{{1, 1}, {3, 1}, {2, 2}, {3, 2}, {5, 3}}) {
    absl::StatusOr<ParityCoder> coder = ParityCoder::Create(k, p);
    if (coder.status().code() == absl::StatusCode::kUnimplemented) GTEST_SKIP() << coder.status();
    ASSERT_TRUE(coder.ok()) << coder.status();
    const size_t length = 1000;
    std::vector<std::vector<uint8_t>> chunks;
    for (int j = 0; j < k; ++j) chunks.push_back(RandomBytes(random, length));
    std::vector<const uint8_t*> data;
    for (const auto& c : chunks) data.push_back(c.data());
    for (int r = 0; r < p; ++r) {
      chunks.emplace_back(length);
      coder->Encode(r, data, length, chunks.back().data());
    }
    // Every erasure pattern of the K + P chunks.
    for (uint32_t erased = 0; erased < (1u << (k + p)); ++erased) {
      std::vector<std::pair<int, const uint8_t*>> available;
      std::vector<int> wanted;
      for (int i = 0; i < k + p; ++i) {
        if ((erased >> i) & 1) {
          if (i < k) wanted.push_back(i);
        } else {
          available.emplace_back(i, chunks[i].data());
        }
      }
      std::vector<std::vector<uint8_t>> rebuilt(wanted.size(), std::vector<uint8_t>(length));
      std::vector<uint8_t*> out;
      for (auto& r : rebuilt) out.push_back(r.data());
      const absl::Status s = coder->Decode(available, wanted, length, out);
      if (__builtin_popcount(erased) > p) {
        EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << k << "+" << p << " erased " << erased;
        continue;
      }
      ASSERT_TRUE(s.ok()) << s;
      for (size_t i = 0; i < wanted.size(); ++i) {
        EXPECT_EQ(rebuilt[i], chunks[wanted[i]])
            << k << "+" << p << " erased " << erased << " column " << wanted[i];
      }
    }
  }
  EXPECT_EQ(ParityCoder::Create(0, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParityCoder::Create(200, 60).status().code(), absl::StatusCode::kInvalidArgument);
}

// A whole group, as the daemons will lay it out: each member's data file cut into
// segments, each holder's parity chunks. Losing any P members, every byte range of
// their files comes back from the survivors' same ranges; losing P + 1, none does.
TEST(ParityCoderTest, AGroupSurvivesAnyPLostMembersByteRangeByByteRange) {
  std::mt19937 random(11);
  for (const auto& [g, p] : std::vector<std::pair<int, int>>{{3, 1}, {4, 1}, {4, 2}, {5, 2}}) {
    const StripeLayout layout(g, p);
    const int k = layout.data_per_stripe();
    absl::StatusOr<ParityCoder> coder = ParityCoder::Create(k, p);
    if (coder.status().code() == absl::StatusCode::kUnimplemented) GTEST_SKIP() << coder.status();
    ASSERT_TRUE(coder.ok()) << coder.status();
    std::vector<std::vector<uint8_t>> files;
    std::vector<int64_t> sizes;
    for (int m = 0; m < g; ++m) {
      files.push_back(RandomBytes(random, 5000 + random() % 20000));
      sizes.push_back(static_cast<int64_t>(files.back().size()));
    }
    const size_t segment = static_cast<size_t>(layout.SegmentBytes(sizes));
    // Member m's segment of stripe s, zero-padded.
    auto segment_of = [&](int m, int s) {
      const std::vector<int> stripes = layout.DataStripes(m);
      const size_t index = std::find(stripes.begin(), stripes.end(), s) - stripes.begin();
      std::vector<uint8_t> bytes(segment, 0);
      const size_t start = index * segment;
      if (start < files[m].size())
        std::copy_n(files[m].begin() + start, std::min(segment, files[m].size() - start), bytes.begin());
      return bytes;
    };
    std::vector<std::vector<std::vector<uint8_t>>> parity(
        g, std::vector<std::vector<uint8_t>>(p));  // [stripe][row]
    for (int s = 0; s < g; ++s) {
      std::vector<std::vector<uint8_t>> segments;
      std::vector<const uint8_t*> data;
      for (int m : layout.DataMembers(s)) segments.push_back(segment_of(m, s));
      for (const auto& seg : segments) data.push_back(seg.data());
      for (int r = 0; r < p; ++r) {
        parity[s][r].resize(segment);
        coder->Encode(r, data, segment, parity[s][r].data());
      }
    }
    for (uint32_t lost = 1; lost < (1u << g); ++lost) {
      const bool survivable = __builtin_popcount(lost) <= p;
      for (int m = 0; m < g; ++m) {
        if (!((lost >> m) & 1)) continue;
        // Rebuild [a, b) of each of m's segments from the same range of the stripe's survivors.
        const size_t a = random() % segment, b = a + 1 + random() % (segment - a);
        const std::vector<int> stripes = layout.DataStripes(m);
        for (size_t index = 0; index < stripes.size(); ++index) {
          const int s = stripes[index];
          const std::vector<int> data_members = layout.DataMembers(s), holders = layout.Holders(s);
          std::vector<std::vector<uint8_t>> kept;
          std::vector<std::pair<int, const uint8_t*>> available;
          int column = -1;
          for (int j = 0; j < k; ++j) {
            if (data_members[j] == m) column = j;
            if ((lost >> data_members[j]) & 1) continue;
            kept.push_back(segment_of(data_members[j], s));
          }
          int next = 0;
          for (int j = 0; j < k; ++j) {
            if (!((lost >> data_members[j]) & 1)) available.emplace_back(j, kept[next++].data() + a);
          }
          for (int r = 0; r < p; ++r) {
            if (!((lost >> holders[r]) & 1)) available.emplace_back(k + r, parity[s][r].data() + a);
          }
          std::vector<uint8_t> rebuilt(b - a);
          const absl::Status status = coder->Decode(available, {column}, b - a, {rebuilt.data()});
          if (!survivable) {
            EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
            continue;
          }
          ASSERT_TRUE(status.ok()) << status;
          const std::vector<uint8_t> want = segment_of(m, s);
          EXPECT_TRUE(std::equal(rebuilt.begin(), rebuilt.end(), want.begin() + a))
              << g << "/" << p << " lost " << lost << " member " << m << " stripe " << s;
        }
      }
    }
  }
}

TEST(PlaceParityGroupsTest, GroupsOfTheSizeAndANoteWhenTheHostsDoNotDivide) {
  auto even = PlaceParityGroups({"h0", "h1", "h2", "h3", "h4", "h5", "h6", "h7"}, 4, 1);
  ASSERT_TRUE(even.ok()) << even.status();
  ASSERT_EQ(even->members.size(), 2u);
  EXPECT_EQ(even->members[0], (std::vector<int>{0, 2, 4, 6}));
  EXPECT_EQ(even->members[1], (std::vector<int>{1, 3, 5, 7}));
  EXPECT_EQ(even->group_of[5], 1);
  EXPECT_EQ(even->position[5], 2);
  EXPECT_EQ(even->note, "");
  auto uneven = PlaceParityGroups({"h0", "h1", "h2", "h3", "h4", "h5", "h6", "h7", "h8", "h9"}, 4, 1);
  ASSERT_TRUE(uneven.ok()) << uneven.status();
  EXPECT_EQ(uneven->members.size(), 2u);
  EXPECT_EQ(uneven->members[0].size() + uneven->members[1].size(), 10u);
  EXPECT_EQ(uneven->note, "10 hosts are not a multiple of group 4: 2 groups of 5 hosts");
  auto small = PlaceParityGroups({"h0", "h1", "h2"}, 4, 1);
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ(small->note, "3 hosts are not a multiple of group 4: 1 group of 3 hosts");
  EXPECT_EQ(PlaceParityGroups({"h0", "h1"}, 4, 2).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(PlaceParityGroups({"h0", "h1"}, 2, 2).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlaceParityGroups({"h0", "h1"}, 2, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(PlaceParityGroupsTest, NoGroupHasMoreThanPMembersInOneFailureDomain) {
  // 8 hosts in 4 racks of 2 (rack r: ranks r and r + 4), groups of 4 with P = 1.
  const std::vector<std::string> racks = {"a", "b", "c", "d", "a", "b", "c", "d"};
  auto groups = PlaceParityGroups(racks, 4, 1);
  ASSERT_TRUE(groups.ok()) << groups.status();
  for (const std::vector<int>& members : groups->members) {
    std::set<std::string> seen;
    for (int r : members) EXPECT_TRUE(seen.insert(racks[r]).second) << "two of rack " << racks[r];
  }
  const absl::Status crowded = PlaceParityGroups({"a", "a", "a", "b"}, 4, 1).status();
  EXPECT_EQ(crowded.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(crowded.message().find("failure domain 'a'"), absl::string_view::npos) << crowded;
  EXPECT_TRUE(PlaceParityGroups({"a", "a", "b", "b"}, 4, 2).ok());
}

}  // namespace
}  // namespace ckptd
