// Erasure-coded parity across hosts (config `redundancy: parity`, `group`, `parity`;
// local storage): which hosts form a group, how a group's data files are cut into
// stripes and where each stripe's parity lives, and the Reed-Solomon code (ISA-L)
// that makes and uses the parity. Pure functions and values; any thread.
//
// Within a group of g members and P parity there are g stripes. Stripe s's parity
// lives on members s, s+1, ..., s+P-1 (mod g), its holders, and its data are one
// segment of each of the other K = g - P members, in member order. So a member's data
// file is cut into K segments of segment_bytes (the last one padded with zeros, as far
// as the code is concerned), and a member holds P parity chunks, one per stripe it
// holds (never one of a stripe its own data is in), each segment_bytes long. That is
// P/K of the data: the least any layout can store that keeps parity on the group's own
// hosts and survives P lost members, since the survivors' bytes must hold the group's
// data. A lost member's segment of stripe s is rebuilt from any K of the stripe's other
// chunks; Reed-Solomon codes bytewise, so any byte range of a segment is rebuilt from
// the same range of K others.
#ifndef CKPTD_DAEMON_COORD_PARITY_H_
#define CKPTD_DAEMON_COORD_PARITY_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace ckptd {

struct ParityGroups {
  std::vector<std::vector<int>> members;  // members[g]: its ranks, ascending
  std::vector<int> group_of;              // by rank
  std::vector<int> position;              // by rank: its index in members[group_of[rank]]
  std::string note;                       // why groups differ from `group_size`, if they do
};

// Groups of about `group_size` ranks (N / group_size groups, sizes differing by at most
// one, so N not a multiple of the size makes some groups larger: said in `note`), with
// at most `parity` members of a group in one failure domain (domains[r]: rank r's), so
// that losing a whole domain loses at most `parity` members of any group. Hosts are
// dealt to groups domain by domain. INVALID_ARGUMENT unless 1 <= parity < group_size;
// FAILED_PRECONDITION naming the domain when the domains cannot be spread so, or when
// there are fewer than parity + 1 ranks.
absl::StatusOr<ParityGroups> PlaceParityGroups(const std::vector<std::string>& domains, int group_size,
                                               int parity);

// Where a group's stripes are, for a group of `members` with `parity` (< members).
class StripeLayout {
 public:
  StripeLayout(int members, int parity) : members_(members), parity_(parity) {}
  int members() const { return members_; }
  int parity() const { return parity_; }
  int data_per_stripe() const { return members_ - parity_; }  // K
  // Stripe s's holders, by parity row (row r is on Holders(s)[r]).
  std::vector<int> Holders(int stripe) const;
  // Stripe s's data members, by code column.
  std::vector<int> DataMembers(int stripe) const;
  // The stripes `member`'s segments are in: its k-th segment is in DataStripes(member)[k].
  std::vector<int> DataStripes(int member) const;
  // The stripes whose parity `member` holds, in the order of the chunks in its parity
  // file, and its row in each.
  std::vector<std::pair<int, int>> HeldParity(int member) const;
  // The bytes of one segment (and of one parity chunk) for data files of these sizes:
  // the largest ceil(size / K), rounded up to 4 KiB for O_DIRECT reads.
  int64_t SegmentBytes(const std::vector<int64_t>& file_sizes) const;

 private:
  // Member m's place in stripe s, (m - s) mod g: rows below P hold the stripe's
  // parity (that row of it); the rest are its data.
  int Row(int member, int stripe) const { return (member - stripe + members_) % members_; }
  int members_, parity_;
};

// A Reed-Solomon code of K data and P parity chunks (a Cauchy matrix: any K of the
// K + P chunks determine the rest), through ISA-L. Immutable once made.
class ParityCoder {
 public:
  // UNIMPLEMENTED when ckptd was built without ISA-L; INVALID_ARGUMENT unless
  // 1 <= data, 1 <= parity, data + parity <= 255.
  static absl::StatusOr<ParityCoder> Create(int data, int parity);
  int data() const { return k_; }
  int parity() const { return p_; }
  // Parity row `row` (0..P-1) of the K chunks `data` (each `length` bytes) into `out`.
  void Encode(int row, const std::vector<const uint8_t*>& data, size_t length, uint8_t* out) const;
  // Rebuilds data chunks `wanted` (column numbers) from `available` chunks: (index,
  // bytes) where index j < K is data column j and K + r is parity row r; the first K
  // distinct ones are used. out[i] receives wanted[i] (`length` bytes each). DATA_LOSS
  // when fewer than K are available.
  absl::Status Decode(const std::vector<std::pair<int, const uint8_t*>>& available,
                      const std::vector<int>& wanted, size_t length, const std::vector<uint8_t*>& out) const;

 private:
  ParityCoder(int k, int p) : k_(k), p_(p) {}
  int k_, p_;
  std::vector<uint8_t> matrix_;         // (K + P) x K, identity on top
  std::vector<uint8_t> encode_tables_;  // ISA-L's tables for the P parity rows
};

}  // namespace ckptd

#endif  // CKPTD_DAEMON_COORD_PARITY_H_
