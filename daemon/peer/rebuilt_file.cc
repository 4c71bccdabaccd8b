#include "daemon/peer/rebuilt_file.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <set>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/base/status.h"
#include "daemon/coord/parity.h"

namespace ckptd {
namespace {

// Below this a range's chunks are read one after another: threads cost more than
// they save on an index-sized read.
constexpr size_t kParallelReadBytes = size_t{1} << 20;
// A long read is rebuilt in pieces of this size, this many at a time.
constexpr int64_t kPieceBytes = int64_t{8} << 20;
constexpr size_t kWorkers = 4;

// One chunk of a stripe that a rebuild may read: code index (column j < K for data,
// K + row for parity), where, and how many of the range's bytes the file has (a data
// file shorter than its segments counts as zeros beyond its end).
struct Chunk {
  int index = 0;
  const RandomAccessFile* file = nullptr;
  uint64_t offset = 0;
  size_t present = 0;
  std::string what{};
};

class RebuiltFile final : public RandomAccessFile {
 public:
  RebuiltFile(ParityCoder coder, StripeLayout layout, int lost, int64_t segment, int64_t size,
              std::vector<int64_t> sizes, ParitySources sources, std::vector<std::string> names,
              std::string what)
      : coder_(std::move(coder)),
        layout_(layout),
        lost_(lost),
        segment_(segment),
        size_(size),
        sizes_(std::move(sizes)),
        sources_(std::move(sources)),
        names_(std::move(names)),
        what_(std::move(what)) {}

  uint64_t Size() const override { return static_cast<uint64_t>(size_); }

  absl::Status Read(uint64_t offset, size_t n, char* dst) const override {
    if (offset + n > static_cast<uint64_t>(size_)) {
      return absl::OutOfRangeError(
          absl::StrCat("read [", offset, ", +", n, ") past the end of ", what_, " (", size_, " bytes)"));
    }
    // Pieces of at most kPieceBytes, each within one segment, rebuilt kWorkers at a
    // time: a rebuild reads K times the bytes it returns, over as many streams as the
    // peers can serve at once.
    struct Piece {
      int segment_index;
      int64_t within;
      size_t length;
      char* dst;
    };
    std::vector<Piece> pieces;
    while (n > 0) {
      const int64_t within = static_cast<int64_t>(offset) % segment_;
      const size_t length =
          static_cast<size_t>(std::min<int64_t>({static_cast<int64_t>(n), segment_ - within, kPieceBytes}));
      pieces.push_back({static_cast<int>(static_cast<int64_t>(offset) / segment_), within, length, dst});
      offset += length;
      dst += length;
      n -= length;
    }
    std::vector<absl::Status> results(pieces.size());
    std::atomic<size_t> next{0};
    auto work = [&] {
      for (size_t i = next++; i < pieces.size(); i = next++) {
        const Piece& p = pieces[i];
        results[i] = ReadFromStripe(p.segment_index, p.within, p.length, p.dst);
      }
    };
    std::vector<std::thread> workers;
    for (size_t w = 1; w < std::min<size_t>(pieces.size(), kWorkers); ++w) workers.emplace_back(work);
    work();
    for (std::thread& t : workers) t.join();
    for (const absl::Status& s : results) RETURN_IF_ERROR(s);
    return absl::OkStatus();
  }

 private:
  // The chunks of the stripe that holds the lost file's segment `segment_index`, at
  // [within, within + length) of each.
  std::vector<Chunk> ChunksOf(int stripe, int64_t within, size_t length) const {
    const int k = layout_.data_per_stripe();
    std::vector<Chunk> chunks;
    const std::vector<int> data = layout_.DataMembers(stripe);
    for (int column = 0; column < k; ++column) {
      const int member = data[column];
      if (member == lost_ || sources_.data[member] == nullptr) continue;
      const std::vector<int> stripes = layout_.DataStripes(member);
      const int64_t offset =
          (std::find(stripes.begin(), stripes.end(), stripe) - stripes.begin()) * segment_ + within;
      chunks.push_back({.index = column,
                        .file = sources_.data[member].get(),
                        .offset = static_cast<uint64_t>(offset),
                        .present = static_cast<size_t>(
                            std::clamp<int64_t>(sizes_[member] - offset, 0, static_cast<int64_t>(length))),
                        .what = absl::StrCat(names_[member], "'s data file")});
    }
    const std::vector<int> holders = layout_.Holders(stripe);
    for (int row = 0; row < layout_.parity(); ++row) {
      const int holder = holders[row];
      if (sources_.parity[holder] == nullptr) continue;
      const std::vector<std::pair<int, int>> held = layout_.HeldParity(holder);
      const int64_t chunk = std::find(held.begin(), held.end(), std::make_pair(stripe, row)) - held.begin();
      chunks.push_back({.index = k + row,
                        .file = sources_.parity[holder].get(),
                        .offset = static_cast<uint64_t>(chunk * segment_ + within),
                        .present = length,
                        .what = absl::StrCat(names_[holder], "'s parity file")});
    }
    return chunks;
  }

  absl::Status ReadFromStripe(int segment_index, int64_t within, size_t length, char* dst) const {
    const int k = layout_.data_per_stripe();
    const int stripe = layout_.DataStripes(lost_)[segment_index];
    const std::vector<int> data = layout_.DataMembers(stripe);
    const int wanted = static_cast<int>(std::find(data.begin(), data.end(), lost_) - data.begin());
    std::vector<Chunk> chunks = ChunksOf(stripe, within, length);
    // Not zeroed: each is read over, and only a shorter file's tail is zeroed.
    std::vector<std::unique_ptr<char[]>> buffers(static_cast<size_t>(k));
    for (auto& buffer : buffers) buffer = std::make_unique_for_overwrite<char[]>(length);
    std::vector<std::string> failures;
    // K chunks at a time; a chunk that cannot be read is dropped and the next one
    // taken, while K remain.
    while (static_cast<int>(chunks.size()) >= k) {
      std::vector<absl::Status> read(static_cast<size_t>(k));
      auto read_one = [&](int i) {
        const Chunk& chunk = chunks[i];
        std::memset(buffers[i].get() + chunk.present, 0, length - chunk.present);
        if (chunk.present > 0) {
          read[i] = Annotate(chunk.file->Read(chunk.offset, chunk.present, buffers[i].get()), chunk.what);
        }
      };
      if (length >= kParallelReadBytes && k > 1) {
        std::vector<std::thread> readers;
        for (int i = 0; i < k; ++i) readers.emplace_back(read_one, i);
        for (std::thread& t : readers) t.join();
      } else {
        for (int i = 0; i < k; ++i) read_one(i);
      }
      std::vector<int> failed;
      for (int i = 0; i < k; ++i) {
        if (!read[i].ok()) failed.push_back(i);
      }
      if (failed.empty()) {
        std::vector<std::pair<int, const uint8_t*>> available;
        for (int i = 0; i < k; ++i) {
          available.emplace_back(chunks[i].index, reinterpret_cast<const uint8_t*>(buffers[i].get()));
        }
        return coder_.Decode(available, {wanted}, length, {reinterpret_cast<uint8_t*>(dst)});
      }
      for (auto it = failed.rbegin(); it != failed.rend(); ++it) {
        failures.push_back(std::string(read[*it].message()));
        chunks.erase(chunks.begin() + *it);
      }
    }
    return absl::DataLossError(
        absl::StrCat("rebuilding ", what_, ": fewer than ", k,
                     " of its stripe's chunks could be read: ", absl::StrJoin(failures, "; ")));
  }

  ParityCoder coder_;
  StripeLayout layout_;
  int lost_;  // the lost file's position in its group
  int64_t segment_;
  int64_t size_;
  std::vector<int64_t> sizes_;  // by position: the members' data file sizes
  ParitySources sources_;
  std::vector<std::string> names_;  // by position: "rank 2 (host2)"
  std::string what_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<RandomAccessFile>> NewRebuiltFile(const CheckpointMeta& meta, int shard,
                                                                 ParitySources sources,
                                                                 const std::string& step) {
  const CheckpointMeta::ParityGroup* group = meta.ParityGroupOf(shard);
  const CheckpointMeta::Host* host = meta.FindHost(shard);
  if (group == nullptr || host == nullptr || group->segment_bytes <= 0) {
    return absl::DataLossError(absl::StrCat(step, ": ckptd.json has no parity group for rank ", shard));
  }
  const std::vector<int>& members = group->members;
  const int size = static_cast<int>(members.size());
  if (static_cast<int>(sources.data.size()) != size || static_cast<int>(sources.parity.size()) != size) {
    return absl::InternalError("parity sources do not match the group");
  }
  const StripeLayout layout(size, meta.parity.parity);
  const int lost = static_cast<int>(std::find(members.begin(), members.end(), shard) - members.begin());
  std::vector<int64_t> sizes;
  std::vector<std::string> names;
  for (int member : members) {
    const CheckpointMeta::Host* h = meta.FindHost(member);
    sizes.push_back(h == nullptr ? 0 : h->bytes);
    names.push_back(absl::StrCat("rank ", member, " (", meta.HostOf(member), ")"));
  }
  // Every stripe the file has a segment in needs K chunks that are not its own.
  const int k = layout.data_per_stripe();
  bool enough = true;
  for (int stripe : layout.DataStripes(lost)) {
    int available = 0;
    for (int member : layout.DataMembers(stripe))
      available += member != lost && sources.data[member] != nullptr;
    for (int holder : layout.Holders(stripe)) available += sources.parity[holder] != nullptr;
    enough = enough && available >= k;
  }
  const std::string what = absl::StrCat(names[lost], "'s data file");
  if (!enough) {
    std::vector<std::string> gone;
    for (int m = 0; m < size; ++m) {
      if (m == lost || sources.data[m] == nullptr || sources.parity[m] == nullptr) gone.push_back(names[m]);
    }
    std::set<std::string> tensors;
    for (const CheckpointMeta::Tensor& t : meta.tensors) {
      for (const CheckpointMeta::PlacedBox& b : t.boxes) {
        if (b.writer == shard) tensors.insert(t.name);
      }
    }
    return absl::DataLossError(absl::StrCat(
        step, ": ", what, " cannot be rebuilt: parity group ", group - meta.parity.groups.data(), " (ranks ",
        JoinBounded(members), ") has lost ", gone.size(), " hosts' files (", JoinBounded(gone),
        "), more than its parity ", meta.parity.parity, " can restore; tensors in it: ",
        tensors.empty() ? std::string("none")
                        : JoinBounded(std::vector<std::string>(tensors.begin(), tensors.end()))));
  }
  ASSIGN_OR_RETURN(ParityCoder coder, ParityCoder::Create(k, meta.parity.parity));
  return std::make_unique<RebuiltFile>(std::move(coder), layout, lost, group->segment_bytes, host->bytes,
                                       std::move(sizes), std::move(sources), std::move(names), what);
}

}  // namespace ckptd
