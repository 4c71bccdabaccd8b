#include "daemon/coord/parity.h"

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

#ifdef CKPTD_HAVE_ISAL
#include <isa-l/erasure_code.h>
#endif

namespace ckptd {

absl::StatusOr<ParityGroups> PlaceParityGroups(const std::vector<std::string>& domains, int group_size,
                                               int parity) {
  if (parity < 1 || group_size <= parity) {
    return absl::InvalidArgumentError(
        absl::StrCat("parity: needs 1 <= parity < group, not parity ", parity, " with group ", group_size));
  }
  const int ranks = static_cast<int>(domains.size());
  if (ranks < parity + 1) {
    return absl::FailedPreconditionError(absl::StrCat("parity: ", parity,
                                                      " parity chunks per stripe need at least ", parity + 1,
                                                      " hosts; the job has ", ranks));
  }
  const int count = std::max(1, ranks / group_size);
  ParityGroups groups;
  groups.members.resize(count);
  groups.group_of.assign(ranks, 0);
  groups.position.assign(ranks, 0);
  // Dealt domain by domain (ranks of one domain in a row), so a domain's hosts land in
  // as many different groups as there are.
  std::vector<int> order(ranks);
  for (int r = 0; r < ranks; ++r) order[r] = r;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return domains[a] < domains[b]; });
  for (int i = 0; i < ranks; ++i) groups.members[i % count].push_back(order[i]);
  for (int g = 0; g < count; ++g) {
    std::vector<int>& members = groups.members[g];
    std::sort(members.begin(), members.end());
    std::map<std::string, int> per_domain;
    for (size_t i = 0; i < members.size(); ++i) {
      groups.group_of[members[i]] = g;
      groups.position[members[i]] = static_cast<int>(i);
      if (++per_domain[domains[members[i]]] > parity) {
        return absl::FailedPreconditionError(
            absl::StrCat("parity: failure domain '", domains[members[i]], "' has more hosts than ", count,
                         " groups can spread with at most ", parity,
                         " of a group in one domain; use a larger group, more ",
                         "parity, or a finer failure_domains map"));
      }
    }
  }
  if (ranks % group_size != 0 || ranks < group_size) {
    std::set<size_t> sizes;
    for (const std::vector<int>& members : groups.members) sizes.insert(members.size());
    groups.note =
        absl::StrCat(ranks, " hosts are not a multiple of group ", group_size, ": ", count,
                     count == 1 ? " group of " : " groups of ", absl::StrJoin(sizes, " or "), " hosts");
  }
  return groups;
}

std::vector<int> StripeLayout::Holders(int stripe) const {
  std::vector<int> holders;
  // Row r of stripe s is member s + r: the inverse of Row.
  for (int r = 0; r < parity_; ++r) holders.push_back((stripe + r) % members_);
  return holders;
}

std::vector<int> StripeLayout::DataMembers(int stripe) const {
  std::vector<int> data;
  for (int m = 0; m < members_; ++m) {
    if (Row(m, stripe) >= parity_) data.push_back(m);
  }
  return data;
}

std::vector<int> StripeLayout::DataStripes(int member) const {
  std::vector<int> stripes;
  for (int s = 0; s < members_; ++s) {
    if (Row(member, s) >= parity_) stripes.push_back(s);
  }
  return stripes;
}

std::vector<std::pair<int, int>> StripeLayout::HeldParity(int member) const {
  std::vector<std::pair<int, int>> held;
  for (int s = 0; s < members_; ++s) {
    const int row = Row(member, s);
    if (row < parity_) held.emplace_back(s, row);
  }
  return held;
}

int64_t StripeLayout::SegmentBytes(const std::vector<int64_t>& file_sizes) const {
  const int64_t k = data_per_stripe();
  int64_t largest = 0;
  for (int64_t size : file_sizes) largest = std::max(largest, (size + k - 1) / k);
  return (largest + 4095) / 4096 * 4096;
}

absl::StatusOr<ParityCoder> ParityCoder::Create(int data, int parity) {
  if (data < 1 || parity < 1 || data + parity > 255) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a Reed-Solomon code needs 1 <= data, 1 <= parity, data + parity <= 255, not ", data, " + ", parity));
  }
#ifdef CKPTD_HAVE_ISAL
  ParityCoder coder(data, parity);
  coder.matrix_.resize(static_cast<size_t>((data + parity) * data));
  gf_gen_cauchy1_matrix(coder.matrix_.data(), data + parity, data);
  coder.encode_tables_.resize(static_cast<size_t>(32 * data * parity));
  ec_init_tables(data, parity, coder.matrix_.data() + data * data, coder.encode_tables_.data());
  return coder;
#else
  return absl::UnimplementedError("parity needs ISA-L (Debian's libisal-dev) when ckptd is built");
#endif
}

void ParityCoder::Encode(int row, const std::vector<const uint8_t*>& data, size_t length,
                         uint8_t* out) const {
#ifdef CKPTD_HAVE_ISAL
  // ISA-L's tables for one row are that row's slice of the P-row tables.
  std::vector<unsigned char*> sources(data.size());
  for (size_t i = 0; i < data.size(); ++i) sources[i] = const_cast<unsigned char*>(data[i]);
  unsigned char* outputs[1] = {out};
  ec_encode_data(static_cast<int>(length), k_, 1,
                 const_cast<unsigned char*>(encode_tables_.data()) + static_cast<size_t>(32 * k_ * row),
                 sources.data(), outputs);
#else
  (void)row, (void)data, (void)length, (void)out;
#endif
}

absl::Status ParityCoder::Decode(const std::vector<std::pair<int, const uint8_t*>>& available,
                                 const std::vector<int>& wanted, size_t length,
                                 const std::vector<uint8_t*>& out) const {
  std::vector<int> rows;
  std::vector<unsigned char*> sources;
  for (const auto& [index, bytes] : available) {
    if (static_cast<int>(rows.size()) == k_) break;
    if (index < 0 || index >= k_ + p_ || std::find(rows.begin(), rows.end(), index) != rows.end()) continue;
    rows.push_back(index);
    sources.push_back(const_cast<unsigned char*>(bytes));
  }
  if (static_cast<int>(rows.size()) < k_) {
    return absl::DataLossError(absl::StrCat("a stripe needs ", k_, " of its ", k_ + p_,
                                            " chunks to be rebuilt; ", rows.size(), " are left"));
  }
  if (wanted.size() != out.size()) return absl::InvalidArgumentError("one output per wanted chunk");
#ifdef CKPTD_HAVE_ISAL
  // The available chunks are `rows` of the code matrix times the data; inverting that
  // square matrix gives the data from them, and its row w rebuilds data column w.
  std::vector<unsigned char> square(static_cast<size_t>(k_ * k_)), inverse(static_cast<size_t>(k_ * k_));
  for (int i = 0; i < k_; ++i) {
    std::copy_n(matrix_.data() + rows[i] * k_, k_, square.data() + i * k_);
  }
  if (gf_invert_matrix(square.data(), inverse.data(), k_) != 0) {
    return absl::InternalError("the parity code's matrix did not invert");
  }
  std::vector<unsigned char> decode(static_cast<size_t>(k_) * wanted.size());
  for (size_t i = 0; i < wanted.size(); ++i) {
    if (wanted[i] < 0 || wanted[i] >= k_)
      return absl::InvalidArgumentError("a wanted chunk is not a data column");
    std::copy_n(inverse.data() + wanted[i] * k_, k_, decode.data() + i * k_);
  }
  std::vector<unsigned char> tables(32 * static_cast<size_t>(k_) * wanted.size());
  ec_init_tables(k_, static_cast<int>(wanted.size()), decode.data(), tables.data());
  std::vector<unsigned char*> outputs(out.begin(), out.end());
  ec_encode_data(static_cast<int>(length), k_, static_cast<int>(wanted.size()), tables.data(), sources.data(),
                 outputs.data());
  return absl::OkStatus();
#else
  (void)length;
  return absl::UnimplementedError("parity needs ISA-L (Debian's libisal-dev) when ckptd is built");
#endif
}

}  // namespace ckptd
