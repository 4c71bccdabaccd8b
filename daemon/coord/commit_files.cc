// The files of a commit on this rank: its data file (WriteLocalShard: the boxes the
// plan gives it, checksummed and synced) and, on rank 0, the step's index and
// ckptd.json from every rank's written entries (BuildStepFiles, WriteStepFiles).
// Coordinator methods, on the coordinator's thread; the phases that call them are in
// commit.cc.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "daemon/base/dtype.h"
#include "daemon/base/status.h"
#include "daemon/bundle/bundle.h"
#include "daemon/bundle/checkpoint_meta.h"
#include "daemon/coord/coordinator.h"
#include "daemon/layout/mesh.h"

namespace ckptd {
namespace {

// A staged box's name and extent, pointing into the staged tensor (or the plan).
struct StagedKey {
  absl::string_view name;
  const Box* box;
  friend bool operator==(const StagedKey& a, const StagedKey& b) {
    return a.name == b.name && *a.box == *b.box;
  }
  template <typename H>
  friend H AbslHashValue(H h, const StagedKey& k) {
    return H::combine(std::move(h), k.name, k.box->start, k.box->length);
  }
};

// One box this rank writes: its place in the plan and the staged bytes it holds.
struct WriteJob {
  const PlannedTensor* tensor;
  const PlannedBox* box;
  StagedTensor* staged;
};

// What this rank writes, in plan order; every other staged box (written by another
// host, or a second local replica) goes back to staging memory now. INTERNAL when the
// plan gives this rank a box it does not hold.
absl::StatusOr<std::vector<WriteJob>> PickLocalBoxes(const SavePlan& plan,
                                                     std::vector<TrainerPayload>& payloads, int rank) {
  // Looked up in place by name and box: a tree of copied names (and a tree of the
  // boxes used) took over a third of the write phase's CPU time at 100,000 tensors.
  absl::flat_hash_map<StagedKey, StagedTensor*> staged;
  const size_t staged_count = StagedTensorCount(payloads);
  staged.reserve(staged_count);
  for (TrainerPayload& p : payloads) {
    for (StagedTensor& t : p.tensors) staged.emplace(StagedKey{t.name, &t.box}, &t);
  }
  std::vector<WriteJob> jobs;
  absl::flat_hash_set<const StagedTensor*> used;
  used.reserve(staged_count);
  for (const PlannedTensor& t : plan.tensors) {
    for (const PlannedBox& b : t.boxes) {
      if (b.writer != rank) continue;
      auto it = staged.find(StagedKey{t.name, &b.box});
      if (it == staged.end()) {
        return absl::InternalError(absl::StrCat("plan assigned box ", b.box.ToString(), " of '", t.name,
                                                "' to rank ", rank, ", which does not hold it"));
      }
      jobs.push_back({.tensor = &t, .box = &b, .staged = it->second});
      used.insert(it->second);
    }
  }
  for (TrainerPayload& p : payloads) {
    for (StagedTensor& t : p.tensors) {
      if (used.count(&t) == 0) t.bytes = StagedBuffer();
    }
  }
  return jobs;
}

// The index entries of what this rank wrote, for rank 0's merge.
internal::WrittenEntries EntriesOf(const std::vector<WriteJob>& jobs,
                                   const std::vector<DataFileWriter::Written>& written, int rank) {
  internal::WrittenEntries entries;
  for (size_t i = 0; i < jobs.size(); ++i) {
    const WriteJob& j = jobs[i];
    internal::WrittenEntry* e = entries.add_entries();
    e->set_name(j.tensor->name);
    e->set_dtype(j.tensor->dtype);
    e->mutable_shape()->Add(j.tensor->shape.begin(), j.tensor->shape.end());
    e->mutable_start()->Add(j.box->box.start.begin(), j.box->box.start.end());
    e->mutable_length()->Add(j.box->box.length.begin(), j.box->box.length.end());
    e->set_shard(rank);
    e->set_offset(written[i].offset);
    e->set_size(j.box->bytes);
    e->set_crc32c(written[i].crc32c);
  }
  return entries;
}

}  // namespace

absl::Status Coordinator::WriteLocalShard(const StepKey& key, const SavePlan& plan,
                                          std::vector<TrainerPayload>& payloads, std::string* entries_out,
                                          int64_t* bytes_out) {
  const absl::Time started = absl::Now();
  const int rank = collective_->rank();
  ASSIGN_OR_RETURN(const std::vector<WriteJob> jobs, PickLocalBoxes(plan, payloads, rank));
  const bool observers_take_buffers =
      absl::c_any_of(observers_, [](const CommitObserver* o) { return o->TakesWrittenBuffers(); });
  std::vector<DataFileEntry> pieces;
  pieces.reserve(jobs.size());
  for (const WriteJob& j : jobs) {
    StagedTensor* s = j.staged;
    pieces.push_back({.dtype = j.tensor->dtype,
                      .elements = j.box->box.NumElements(),
                      .bytes = absl::string_view(s->bytes.data(), static_cast<size_t>(s->bytes.size())),
                      .done = [s, keep = observers_take_buffers] {
                        if (!keep) s->bytes = StagedBuffer();
                      }});
  }
  // A failed write leaves the boxes it did not reach staged: the payloads free them
  // when they go.
  int64_t file_bytes = 0;
  ASSIGN_OR_RETURN(std::vector<DataFileWriter::Written> written,
                   WriteDataFile(store_->fs(),
                                 DataPath(CheckpointStore::Prefix(store_->TempDir(key.run, key.step)), rank,
                                          collective_->size()),
                                 pieces, options_.checksum_threads, &file_bytes));
  if (observers_take_buffers) {
    std::vector<WrittenBox> boxes;
    boxes.reserve(jobs.size());
    for (size_t i = 0; i < jobs.size(); ++i) {
      boxes.push_back({.tensor = jobs[i].tensor->name,
                       .dtype = jobs[i].tensor->dtype,
                       .elements = jobs[i].box->box.NumElements(),
                       .offset = static_cast<uint64_t>(written[i].offset),
                       .crc32c = written[i].crc32c,
                       .bytes = &jobs[i].staged->bytes});
    }
    for (CommitObserver* observer : observers_) observer->OnWritten(key, boxes);
  }
  internal::WrittenEntries entries = EntriesOf(jobs, written, rank);
  entries.set_file_bytes(file_bytes);
  entries.set_write_seconds(absl::ToDoubleSeconds(absl::Now() - started));
  entries.set_host(HostName());
  *entries_out = entries.SerializeAsString();
  *bytes_out = file_bytes;
  return absl::OkStatus();
}

namespace {

// The index entries of tensor `t`'s boxes, from the hosts' reports of it (`reports`:
// every report naming `t`, in host order: of two reports of one box, the later
// host's counts).
absl::StatusOr<std::vector<std::pair<Box, tf::BundleEntryProto>>> EntriesOfBoxes(
    const PlannedTensor& t, absl::Span<const internal::WrittenEntry* const> reports) {
  std::vector<std::pair<Box, tf::BundleEntryProto>> pieces;
  pieces.reserve(t.boxes.size());
  for (const PlannedBox& b : t.boxes) {
    const internal::WrittenEntry* where = nullptr;
    for (const internal::WrittenEntry* e : reports) {
      if (absl::c_equal(e->start(), b.box.start) && absl::c_equal(e->length(), b.box.length)) where = e;
    }
    if (where == nullptr) {
      return absl::InternalError(
          absl::StrCat("no host reported writing box ", b.box.ToString(), " of '", t.name, "'"));
    }
    tf::BundleEntryProto e;
    e.set_shard_id(where->shard());
    e.set_offset(where->offset());
    e.set_size(where->size());
    e.set_crc32c(where->crc32c());
    pieces.emplace_back(b.box, std::move(e));
  }
  return pieces;
}

}  // namespace

absl::StatusOr<internal::StepFiles> Coordinator::BuildStepFiles(const StepKey& key, int trainer_count,
                                                                const SavePlan& plan,
                                                                const std::vector<std::string>& gathered,
                                                                absl::Time started) {
  const int num_shards = collective_->size();

  // Where each box's bytes landed: every host's reports, sorted by tensor name and
  // searched in place (building a map of copies of 100,000 entries, and freeing it,
  // was most of the merge).
  std::vector<internal::WrittenEntries> lists(gathered.size());
  std::vector<const internal::WrittenEntry*> located;
  CheckpointMeta meta{.version = options_.version,
                      .run = key.run,
                      .step = key.step,
                      .num_hosts = num_shards,
                      .storage = std::string(StorageName(options_.storage)),
                      .trainer_count = trainer_count,
                      .mesh = plan.mesh,
                      .bytes_per_host = plan.bytes_per_host};
  for (int host = 0; host < static_cast<int>(gathered.size()); ++host) {
    internal::WrittenEntries& list = lists[host];
    if (!list.ParseFromString(gathered[host])) {
      return absl::InternalError(absl::StrCat("rank ", host, " sent unparsable index entries"));
    }
    for (const internal::WrittenEntry& e : list.entries()) located.push_back(&e);
    meta.hosts.push_back({.rank = host,
                          .host = list.host(),
                          .file = DataPath("ckpt", host, num_shards),
                          .bytes = list.file_bytes(),
                          .write_seconds = list.write_seconds(),
                          .copies = replica_copies_.empty() ? std::vector<int>() : replica_copies_[host]});
    if (parity_ > 0) {
      CheckpointMeta::Host& h = meta.hosts.back();
      h.parity_file = ParityPath("ckpt", host, num_shards);
      h.parity_bytes = list.parity_bytes();
      h.parity_crc32c = list.parity_crc32c();
    }
    meta.max_write_seconds = std::max(meta.max_write_seconds, list.write_seconds());
  }

  if (parity_ > 0) {
    meta.parity.parity = parity_;
    for (const std::vector<int>& members : parity_groups_.members) {
      // Every member of a group computed the same segment size; any one's report does.
      meta.parity.groups.push_back({.members = members, .segment_bytes = lists[members[0]].segment_bytes()});
    }
  }

  // Stable: of two reports of one box, the later host's counts.
  std::stable_sort(
      located.begin(), located.end(),
      [](const internal::WrittenEntry* a, const internal::WrittenEntry* b) { return a->name() < b->name(); });
  IndexBuilder index(num_shards);
  const absl::StatusOr<Mesh> mesh = plan.mesh.empty() ? absl::NotFoundError("no mesh") : ParseMesh(plan.mesh);
  meta.tensors.reserve(plan.tensors.size());
  for (const PlannedTensor& t : plan.tensors) {
    CheckpointMeta::Tensor tensor{.name = t.name, .dtype = DataTypeName(t.dtype), .shape = t.shape};
    for (const PlannedBox& b : t.boxes) tensor.boxes.push_back({.box = b.box, .writer = b.writer});
    if (t.has_layout && mesh.ok()) tensor.layout = Layout{t.sharding_specs, *mesh}.ToString();
    meta.tensors.push_back(std::move(tensor));

    const auto first = std::lower_bound(
        located.begin(), located.end(), t.name,
        [](const internal::WrittenEntry* e, const std::string& name) { return e->name() < name; });
    const auto last = std::upper_bound(
        first, located.end(), t.name,
        [](const std::string& name, const internal::WrittenEntry* e) { return name < e->name(); });
    ASSIGN_OR_RETURN(
        auto pieces,
        EntriesOfBoxes(t, absl::MakeConstSpan(located.data() + (first - located.begin()), last - first)));
    RETURN_IF_ERROR(index.AddTensor(t.name, t.dtype, t.shape, std::move(pieces)));
  }
  ASSIGN_OR_RETURN(std::string index_bytes, index.Finish());

  meta.created_unix = absl::ToUnixSeconds(absl::Now());
  meta.commit_seconds = absl::ToDoubleSeconds(absl::Now() - started);
  internal::StepFiles files;
  files.set_index(std::move(index_bytes));
  files.set_meta(meta.ToJson());
  files.set_commit_seconds(meta.commit_seconds);
  return files;
}

absl::Status Coordinator::WriteStepFiles(const StepKey& key, const internal::StepFiles& files) {
  const std::string temp_dir = store_->TempDir(key.run, key.step);
  FileSystem* fs = store_->fs();
  for (const auto& [path, contents] :
       {std::make_pair(IndexPath(CheckpointStore::Prefix(temp_dir)), files.index()),
        std::make_pair(JoinPath(temp_dir, kCheckpointMetaFile), files.meta())}) {
    ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, fs->NewWritableFile(path));
    RETURN_IF_ERROR(file->Append(contents));
    RETURN_IF_ERROR(file->Sync());
    RETURN_IF_ERROR(file->Close());
  }
  return fs->SyncDir(temp_dir);
}

}  // namespace ckptd
