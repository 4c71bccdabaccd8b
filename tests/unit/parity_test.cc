#include "daemon/coord/parity.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "daemon/bundle/checkpoint_meta.h"
#include "daemon/peer/rebuilt_file.h"

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

// A file in memory; reads fail while `broken`.
class MemoryFile final : public RandomAccessFile {
 public:
  explicit MemoryFile(std::string bytes, bool broken = false) : bytes_(std::move(bytes)), broken_(broken) {}
  absl::Status Read(uint64_t offset, size_t n, char* dst) const override {
    if (broken_) return absl::UnavailableError("the host stopped answering");
    if (offset + n > bytes_.size()) return absl::OutOfRangeError("past the end");
    std::copy_n(bytes_.data() + offset, n, dst);
    return absl::OkStatus();
  }
  uint64_t Size() const override { return bytes_.size(); }

 private:
  std::string bytes_;
  bool broken_;
};

// A group's files as the parity phase writes them: data files, and each member's
// parity file (its chunks in HeldParity order), with the ckptd.json that describes them.
struct SavedGroup {
  CheckpointMeta meta;
  std::vector<std::string> data, parity;
};

SavedGroup SaveGroup(int g, int p, std::mt19937& random) {
  SavedGroup saved;
  const StripeLayout layout(g, p);
  const int k = layout.data_per_stripe();
  std::vector<int64_t> sizes;
  for (int m = 0; m < g; ++m) {
    const std::vector<uint8_t> bytes = RandomBytes(random, 20000 + random() % 30000);
    saved.data.emplace_back(bytes.begin(), bytes.end());
    sizes.push_back(static_cast<int64_t>(bytes.size()));
  }
  const int64_t segment = layout.SegmentBytes(sizes);
  const ParityCoder coder = *ParityCoder::Create(k, p);
  for (int m = 0; m < g; ++m) {
    std::string parity;
    for (const auto& [stripe, row] : layout.HeldParity(m)) {
      std::vector<std::string> columns;
      std::vector<const uint8_t*> pointers;
      for (int member : layout.DataMembers(stripe)) {
        const std::vector<int> stripes = layout.DataStripes(member);
        const int64_t start = (std::find(stripes.begin(), stripes.end(), stripe) - stripes.begin()) * segment;
        std::string column(static_cast<size_t>(segment), '\0');
        const std::string& file = saved.data[member];
        if (start < static_cast<int64_t>(file.size())) {
          file.copy(column.data(), std::min<size_t>(segment, file.size() - start), start);
        }
        columns.push_back(std::move(column));
      }
      for (const std::string& column : columns)
        pointers.push_back(reinterpret_cast<const uint8_t*>(column.data()));
      std::string chunk(static_cast<size_t>(segment), '\0');
      coder.Encode(row, pointers, chunk.size(), reinterpret_cast<uint8_t*>(chunk.data()));
      parity += chunk;
    }
    saved.parity.push_back(std::move(parity));
    saved.meta.hosts.push_back({.rank = m,
                                .host = absl::StrCat("host", m),
                                .bytes = sizes[m],
                                .parity_bytes = static_cast<int64_t>(saved.parity.back().size())});
    saved.meta.tensors.push_back({.name = absl::StrCat("t", m), .boxes = {{.writer = m}}});
  }
  saved.meta.parity.parity = p;
  saved.meta.parity.groups.push_back({.segment_bytes = segment});
  for (int m = 0; m < g; ++m) saved.meta.parity.groups[0].members.push_back(m);
  return saved;
}

// The sources a rebuild gets when the members in `lost` are gone (and `broken`'s
// files fail every read).
ParitySources SourcesWithout(const SavedGroup& saved, uint32_t lost, int broken = -1) {
  ParitySources sources;
  for (size_t m = 0; m < saved.data.size(); ++m) {
    const bool gone = (lost >> m) & 1;
    sources.data.push_back(gone ? nullptr
                                : std::make_unique<MemoryFile>(saved.data[m], broken == static_cast<int>(m)));
    sources.parity.push_back(
        gone ? nullptr : std::make_unique<MemoryFile>(saved.parity[m], broken == static_cast<int>(m)));
  }
  return sources;
}

TEST(RebuiltFileTest, ALostFileReadsBackByteForByteFromAnyRangeAndMoreThanPLostIsDataLossNamingThem) {
  if (ParityCoder::Create(1, 1).status().code() == absl::StatusCode::kUnimplemented) {
    GTEST_SKIP() << "built without ISA-L";
  }
  std::mt19937 random(5);
  for (const auto& [g, p] : std::vector<std::pair<int, int>>{{3, 1}, {4, 2}, {5, 2}}) {
    const SavedGroup saved = SaveGroup(g, p, random);
    for (uint32_t lost = 1; lost < (1u << g); ++lost) {
      for (int m = 0; m < g; ++m) {
        if (!((lost >> m) & 1)) continue;
        SCOPED_TRACE(absl::StrCat(g, "/", p, " lost ", lost, " reading member ", m));
        absl::StatusOr<std::unique_ptr<RandomAccessFile>> file =
            NewRebuiltFile(saved.meta, m, SourcesWithout(saved, lost), "run 'r' step 1");
        if (__builtin_popcount(lost) > p) {
          ASSERT_EQ(file.status().code(), absl::StatusCode::kDataLoss) << file.status();
          EXPECT_NE(file.status().message().find(absl::StrCat("more than its parity ", p)),
                    std::string::npos);
          EXPECT_NE(file.status().message().find(absl::StrCat("rank ", m, " (host", m, ")")),
                    std::string::npos)
              << file.status();
          EXPECT_NE(file.status().message().find(absl::StrCat("tensors in it: t", m)), std::string::npos)
              << file.status();
          continue;
        }
        ASSERT_TRUE(file.ok()) << file.status();
        const std::string& want = saved.data[m];
        ASSERT_EQ((*file)->Size(), want.size());
        std::string whole(want.size(), '\0');
        ASSERT_TRUE((*file)->Read(0, whole.size(), whole.data()).ok());
        EXPECT_EQ(whole, want);
        const size_t a = random() % want.size(), n = 1 + random() % (want.size() - a);
        std::string part(n, '\0');
        ASSERT_TRUE((*file)->Read(a, n, part.data()).ok());
        EXPECT_EQ(part, want.substr(a, n));
        EXPECT_EQ((*file)->Read(want.size() - 1, 2, part.data()).code(), absl::StatusCode::kOutOfRange);
      }
    }
  }
}

TEST(RebuiltFileTest, ASurvivorThatFailsMidReadIsReplacedByASpareChunkWhileKRemain) {
  if (ParityCoder::Create(1, 1).status().code() == absl::StatusCode::kUnimplemented) {
    GTEST_SKIP() << "built without ISA-L";
  }
  std::mt19937 random(9);
  const SavedGroup saved = SaveGroup(4, 2, random);
  // Member 0 lost; member 1 opens but fails every read: member 2 and 3 are K = 2.
  auto file = NewRebuiltFile(saved.meta, 0, SourcesWithout(saved, 1u, /*broken=*/1), "run 'r' step 1");
  ASSERT_TRUE(file.ok()) << file.status();
  std::string whole(saved.data[0].size(), '\0');
  ASSERT_TRUE((*file)->Read(0, whole.size(), whole.data()).ok());
  EXPECT_EQ(whole, saved.data[0]);
  // With members 0 and 2 lost and 1 failing, fewer than K are left: DATA_LOSS with why.
  auto short_of_chunks =
      NewRebuiltFile(saved.meta, 0, SourcesWithout(saved, 5u, /*broken=*/1), "run 'r' step 1");
  ASSERT_TRUE(short_of_chunks.ok()) << short_of_chunks.status();
  const absl::Status read = (*short_of_chunks)->Read(0, whole.size(), whole.data());
  EXPECT_EQ(read.code(), absl::StatusCode::kDataLoss) << read;
  EXPECT_NE(read.message().find("the host stopped answering"), std::string::npos) << read;
}

}  // namespace
}  // namespace ckptd
