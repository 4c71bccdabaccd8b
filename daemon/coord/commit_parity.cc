// The parity phase of a commit (redundancy: parity), on the coordinator's thread:
// every rank encodes the stripes of its group whose parity it holds, from the other
// members' pending data files (read over the peer channel), into its parity file in
// the step's temp directory, so that the vote after it covers the parity and the
// publish renames it into place with the data. See parity.h for the layout.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/base/status.h"
#include "daemon/bundle/bundle.h"
#include "daemon/bundle/crc32c.h"
#include "daemon/coord/coordinator.h"

namespace ckptd {
namespace {

// Bytes of each segment encoded at a time: K reads of this size in flight at once.
constexpr int64_t kParityPieceBytes = int64_t{16} << 20;

// Page-aligned, so that a direct writer can take it as it is.
struct AlignedBuffer {
  explicit AlignedBuffer(size_t n)
      : bytes(static_cast<uint8_t*>(std::aligned_alloc(4096, (n + 4095) / 4096 * 4096)), &std::free) {}
  std::unique_ptr<uint8_t, decltype(&std::free)> bytes;
};

}  // namespace

absl::Status Coordinator::ParityPhase(Attempt& attempt, absl::Status* mine) {
  if (parity_ == 0) return absl::OkStatus();
  // Every rank's data file size: a group's segment size follows from its largest file.
  std::string size(sizeof(int64_t), '\0');
  std::memcpy(size.data(), &attempt.bytes, sizeof(int64_t));
  ASSIGN_OR_RETURN(std::vector<std::string> all, collective_->AllGather(size, attempt.deadline));
  std::vector<int64_t> sizes(all.size(), 0);
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r].size() != sizeof(int64_t)) return absl::InternalError("a rank sent an unparsable file size");
    std::memcpy(&sizes[r], all[r].data(), sizeof(int64_t));
  }
  const absl::Time started = absl::Now();
  *mine = Annotate(WriteParityFile(attempt, sizes), "parity");
  spdlog::debug("run '{}' step {}: parity written in {}", attempt.key.run, attempt.key.step,
                absl::FormatDuration(absl::Now() - started));
  return absl::OkStatus();
}

absl::Status Coordinator::WriteParityFile(Attempt& attempt, const std::vector<int64_t>& file_sizes) {
  const int rank = collective_->rank(), ranks = collective_->size();
  const std::vector<int>& members = parity_groups_.members[parity_groups_.group_of[rank]];
  const StripeLayout layout(static_cast<int>(members.size()), parity_);
  const int k = layout.data_per_stripe();
  std::vector<int64_t> group_sizes;
  for (int member : members) group_sizes.push_back(file_sizes[member]);
  const int64_t segment = layout.SegmentBytes(group_sizes);
  ASSIGN_OR_RETURN(ParityCoder coder, ParityCoder::Create(k, parity_));

  const std::string prefix = CheckpointStore::Prefix(store_->TempDir(attempt.key.run, attempt.key.step));
  const std::string path = ParityPath(prefix, rank, ranks);
  ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> out, store_->fs()->NewDirectWritableFile(path));
  const size_t piece_bytes = static_cast<size_t>(std::min(segment, kParityPieceBytes));
  std::vector<AlignedBuffer> inputs;
  for (int c = 0; c < k; ++c) inputs.emplace_back(std::max<size_t>(piece_bytes, 4096));
  AlignedBuffer output(std::max<size_t>(piece_bytes, 4096));
  if (output.bytes == nullptr ||
      absl::c_any_of(inputs, [](const AlignedBuffer& b) { return b.bytes == nullptr; })) {
    return absl::ResourceExhaustedError("no memory for the parity phase's buffers");
  }
  uint32_t crc = 0;
  int64_t written = 0;
  for (const auto& [stripe, row] : layout.HeldParity(parity_groups_.position[rank])) {
    // Column c of the stripe is member data[c]'s segment number segment_of[c].
    const std::vector<int> data = layout.DataMembers(stripe);
    std::vector<int64_t> segment_of(k);
    for (int c = 0; c < k; ++c) {
      const std::vector<int> stripes = layout.DataStripes(data[c]);
      segment_of[c] = std::find(stripes.begin(), stripes.end(), stripe) - stripes.begin();
    }
    for (int64_t done = 0; done < segment; done += static_cast<int64_t>(piece_bytes)) {
      const int64_t n = std::min<int64_t>(segment - done, static_cast<int64_t>(piece_bytes));
      std::vector<absl::Status> read(k);
      std::vector<std::thread> readers;
      for (int c = 0; c < k; ++c) {
        readers.emplace_back([&, c] {
          const int from = members[data[c]];
          const int64_t offset = segment_of[c] * segment + done;
          // Past the end of a shorter file the code sees zeros.
          const int64_t present = std::clamp<int64_t>(file_sizes[from] - offset, 0, n);
          uint8_t* dst = inputs[c].bytes.get();
          std::memset(dst + present, 0, static_cast<size_t>(n - present));
          if (present == 0) return;
          read[c] = Annotate(copier_->ReadStepRange(attempt.key, DataPath("ckpt", from, ranks), from,
                                                    /*pending=*/true, offset, present,
                                                    reinterpret_cast<char*>(dst), attempt.deadline),
                             absl::StrCat("rank ", from, "'s data file"));
        });
      }
      for (std::thread& t : readers) t.join();
      for (const absl::Status& s : read) RETURN_IF_ERROR(s);
      std::vector<const uint8_t*> columns;
      for (const AlignedBuffer& b : inputs) columns.push_back(b.bytes.get());
      coder.Encode(row, columns, static_cast<size_t>(n), output.bytes.get());
      const absl::string_view chunk(reinterpret_cast<const char*>(output.bytes.get()),
                                    static_cast<size_t>(n));
      crc = crc32c::Extend(crc, chunk.data(), chunk.size());
      RETURN_IF_ERROR(Annotate(out->Append(chunk), path));
      written += n;
    }
  }
  RETURN_IF_ERROR(Annotate(out->Sync(), path));
  RETURN_IF_ERROR(Annotate(out->Close(), path));
  // Protobuf merges concatenated messages: these fields join the written entries.
  internal::WrittenEntries tail;
  tail.set_parity_bytes(written);
  tail.set_parity_crc32c(crc);
  tail.set_segment_bytes(segment);
  attempt.entries += tail.SerializeAsString();
  return absl::OkStatus();
}

}  // namespace ckptd
