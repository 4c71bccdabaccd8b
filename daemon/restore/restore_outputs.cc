#include "daemon/restore/restore_outputs.h"

#include <algorithm>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "ckptd/v1/wire.h"
#include "daemon/base/dtype.h"
#include "daemon/base/status.h"

namespace ckptd {
namespace {

// Staging buffers for streamed items [begin, end), waiting for room until
// `deadline`; none for items sent from out.kept.
absl::Status AllocateStreamed(const RestorePlan& plan, size_t begin, size_t end, StagingArea* staging,
                              absl::Time deadline, RestoreOutputs& out) {
  static char nothing;  // an empty box: zero bytes read to a valid address
  for (size_t i = begin; i < end; ++i) {
    if (out.destinations[i] != nullptr) continue;  // bound for a device or host memory
    if (out.kept[i].data() != nullptr) continue;   // sent as it is kept
    if (plan.items[i].bytes == 0) {
      out.destinations[i] = &nothing;
      continue;
    }
    ASSIGN_OR_RETURN(out.streamed[i], staging->Allocate(plan.items[i].bytes, deadline));
    out.destinations[i] = out.streamed[i].data();
  }
  return absl::OkStatus();
}

// Whole entries kept in memory in the dtype asked for go out from there as they are:
// the tier checked them when it kept them, and a copy into staging would only add a
// pass over the bytes.
void FindKeptEntries(BundleReader& reader, const RestorePlan& plan, RestoreOutputs& out) {
  for (size_t i = 0; i < plan.items.size(); ++i) {
    const RestoreItem& item = plan.items[i];
    if (item.bytes > 0 && item.boxes.size() == 1 && item.info.pieces.size() == 1 &&
        item.info.pieces[0].box == item.boxes[0] && item.dtype == item.info.dtype && item.dtype != kString &&
        item.info.pieces[0].entry.size() == item.bytes) {
      if (const char* held = reader.KeptEntry(item.info.pieces[0].entry); held != nullptr) {
        out.kept[i] = absl::MakeConstSpan(held, static_cast<size_t>(item.bytes));
      }
    }
  }
}

}  // namespace

absl::StatusOr<RestoreOutputs> PrepareOutputs(const RestorePlan& plan, const RestoreWants& wants,
                                              const std::shared_ptr<SharedSegment>& reply,
                                              std::vector<std::shared_ptr<SharedSegment>> host_memory,
                                              StagingArea* staging, absl::Time deadline,
                                              bool defer_streamed) {
  RestoreOutputs out;
  out.host_memory = std::move(host_memory);
  out.streamed.resize(plan.items.size());
  out.kept.resize(plan.items.size());
  out.device_buffers.resize(plan.items.size());
  out.destinations.reserve(plan.items.size());
  for (size_t i = 0; i < plan.items.size(); ++i) {
    if (wants.devices[i].has_value()) {
      ASSIGN_OR_RETURN(out.device_buffers[i], staging->Allocate(plan.items[i].bytes, deadline));
      out.destinations.push_back(out.device_buffers[i].data());
    } else if (out.host_memory[i] != nullptr) {
      out.destinations.push_back(out.host_memory[i]->data());
    } else if (reply != nullptr) {
      out.destinations.push_back(reply->data() + plan.items[i].shared_memory_offset);
    } else {
      out.destinations.push_back(nullptr);  // streamed: AllocateStreamed
    }
  }
  if (reply == nullptr && !defer_streamed) {
    // The whole reply is held at once: say so now rather than wait for room that can
    // never come.
    int64_t streamed = 0;
    for (size_t i = 0; i < plan.items.size(); ++i) {
      if (out.destinations[i] == nullptr) streamed += plan.items[i].bytes;
    }
    if (streamed > staging->limit()) {
      return absl::ResourceExhaustedError(
          absl::StrCat("this streamed restore may still fall back to an older step or the drained copy, so "
                       "it holds its whole reply (",
                       streamed, " bytes) in staging memory, more than staging.memory_limit (",
                       staging->limit(), " bytes): restore over shared memory, or fewer tensors per call"));
    }
    RETURN_IF_ERROR(AllocateStreamed(plan, 0, plan.items.size(), staging, deadline, out));
  }
  return out;
}

v1::RestoreHeader RestoreHeaderFor(const RestorePlan& plan, const RestoreWants& wants, int64_t step,
                                   const std::string& note) {
  v1::RestoreHeader header;
  header.set_step(step);
  header.set_note(note);
  for (size_t i = 0; i < plan.items.size(); ++i) {
    const RestoreItem& item = plan.items[i];
    v1::TensorDescriptor* d = header.add_tensors();
    d->set_name(item.info.name);
    d->set_dtype(item.dtype);
    d->mutable_shape()->Add(item.info.shape.begin(), item.info.shape.end());
    for (const Box& box : item.boxes) {
      v1::Box* b = wants.tensors[i].layout.has_value() ? d->add_device_boxes() : d->mutable_box();
      b->mutable_start()->Add(box.start.begin(), box.start.end());
      b->mutable_length()->Add(box.length.begin(), box.length.end());
    }
    header.add_shared_memory_offsets(item.shared_memory_offset);
  }
  header.set_shared_memory_bytes(plan.shared_memory_bytes);
  return header;
}

absl::Status SendChunks(RestoreOutputs& out, size_t begin, size_t end, RestoreSink* sink) {
  for (size_t i = begin; i < end; ++i) {
    const bool from_kept = out.kept[i].data() != nullptr;
    const char* data = from_kept ? out.kept[i].data() : out.streamed[i].data();
    const size_t size = from_kept ? out.kept[i].size() : static_cast<size_t>(out.streamed[i].size());
    for (size_t off = 0; off < size; off += wire::kRestoreChunkBytes) {
      const absl::Span<const char> piece(data + off, std::min(size - off, wire::kRestoreChunkBytes));
      RETURN_IF_ERROR(sink->SendChunk(static_cast<int32_t>(i), static_cast<int64_t>(off), piece));
    }
    out.streamed[i] = StagedBuffer();  // memory back as soon as it is sent
  }
  return absl::OkStatus();
}

absl::Status ReadAndStream(BundleReader& reader, const RestorePlan& plan, StagingArea* staging,
                           absl::Time deadline, int threads, RestoreOutputs& out, RestoreSink* sink) {
  constexpr int64_t kGroupBytes = int64_t{64} << 20;
  std::vector<std::pair<size_t, size_t>> groups;  // item ranges
  for (size_t begin = 0, end = 0; begin < plan.items.size(); begin = end) {
    int64_t bytes = 0;
    while (end < plan.items.size() && bytes < kGroupBytes) bytes += plan.items[end++].bytes;
    groups.emplace_back(begin, end);
  }
  FindKeptEntries(reader, plan, out);
  absl::Status read;  // of the group read last; written by `next` only while it runs
  auto read_group = [&](size_t g) {
    read = AllocateStreamed(plan, groups[g].first, groups[g].second, staging, deadline, out);
    if (read.ok()) {
      read = ReadPlanItems(reader, plan, out.destinations, threads, groups[g].first, groups[g].second);
    }
  };
  if (!groups.empty()) read_group(0);
  for (size_t g = 0; g < groups.size(); ++g) {
    RETURN_IF_ERROR(read);
    std::thread next;
    if (g + 1 < groups.size()) next = std::thread(read_group, g + 1);
    const absl::Status sent = SendChunks(out, groups[g].first, groups[g].second, sink);
    if (next.joinable()) next.join();
    RETURN_IF_ERROR(sent);
  }
  return absl::OkStatus();
}

// One message per tensor would cost a restore of 100,000 small tensors as many
// writes; tensors not yet named when the reads end are implied by the trailer. The
// trainer's copy no longer follows the daemon's reads (measured in the README's benchmark section).
absl::Status ReadAndAnnounce(BundleReader& reader, const RestorePlan& plan, const RestoreOutputs& out,
                             int threads, RestoreSink* sink) {
  constexpr int64_t kReadyBytes = int64_t{16} << 20;
  // Guards the three below, and the sink: one thread sends at a time.
  absl::Mutex mu;
  v1::RestoreResponse ready;
  int64_t ready_bytes = 0;
  absl::Status sent;
  auto announce = [&](size_t item) {
    absl::MutexLock lock(&mu);
    ready.mutable_ready()->add_tensor_indices(static_cast<int32_t>(item));
    ready_bytes += plan.items[item].bytes;
    if (ready_bytes < kReadyBytes || !sent.ok()) return;
    sent = sink->Send(ready);  // a small message: the transport takes it at once
    ready.Clear();
    ready_bytes = 0;
  };
  RETURN_IF_ERROR(ReadPlanItems(reader, plan, out.destinations, threads, 0, plan.items.size(), announce));
  absl::MutexLock lock(&mu);
  return sent;
}

}  // namespace ckptd
