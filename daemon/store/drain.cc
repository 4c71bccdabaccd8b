#include "daemon/store/drain.h"

#include <algorithm>
#include <cstdlib>
#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "daemon/base/status.h"
#include "daemon/bundle/bundle.h"
#include "daemon/bundle/checkpoint_meta.h"
#include "daemon/bundle/crc32c.h"

namespace ckptd {
namespace {

// Copy unit: large enough for the O_DIRECT writer to stream, small enough that a
// cancel or the bandwidth limit takes effect promptly.
constexpr size_t kChunkBytes = size_t{8} << 20;
constexpr size_t kAlignment = 4096;
constexpr int64_t kMaxMetaBytes = int64_t{1} << 30;
constexpr char kPartialSuffix[] = ".partial";

std::string DrainTempSuffix(const std::string& id) { return absl::StrCat(".drain-", id); }

// Every file the step needs is in `temp` at the size the commit wrote. A drain root
// that is not one directory on every host would otherwise publish a checkpoint whose
// other hosts' data files are elsewhere.
absl::Status CheckDrainedFiles(const CheckpointStore& drain, const std::string& temp) {
  FileSystem* fs = drain.fs();
  if (!fs->Exists(IndexPath(CheckpointStore::Prefix(temp)))) {
    return absl::DataLossError(absl::StrCat(temp, " has no index: its drain is not complete"));
  }
  ASSIGN_OR_RETURN(CheckpointMeta meta, ReadCheckpointMeta(fs, temp));
  for (const CheckpointMeta::Host& h : meta.hosts) {
    absl::StatusOr<uint64_t> size = fs->FileSize(JoinPath(temp, h.file));
    if (!size.ok() || *size != static_cast<uint64_t>(h.bytes)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "drain: rank ", h.rank, "'s data file ", h.file, " is ",
          size.ok() ? absl::StrCat(*size, " bytes instead of ", h.bytes) : "missing", " in ", temp,
          ", though every rank reported its share copied: drain_to must be one directory that every host "
          "sees (a shared or remote-mounted file system)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string DrainTempDir(const CheckpointStore& drain, const std::string& run, int64_t step,
                         const std::string& id) {
  return absl::StrCat(drain.TempDir(run, step), DrainTempSuffix(id));
}

absl::StatusOr<std::string> CommitId(const CheckpointStore& store, const std::string& run, int64_t step) {
  ASSIGN_OR_RETURN(
      std::string meta,
      store.fs()->ReadFileToString(JoinPath(store.StepDir(run, step), kCheckpointMetaFile), kMaxMetaBytes));
  return absl::StrFormat("%08x", crc32c::Value(meta.data(), meta.size()));
}

absl::StatusOr<std::vector<std::string>> DrainShare(const CheckpointStore& source, const std::string& run,
                                                    int64_t step, int rank, int num_ranks) {
  const std::string step_dir = source.StepDir(run, step);
  ASSIGN_OR_RETURN(CheckpointMeta meta, ReadCheckpointMeta(source.fs(), step_dir));
  std::vector<std::string> files;
  if (meta.hosts.empty()) {
    // Written before ckptd.json named each host's file: rank 0 takes the whole step.
    if (rank != 0) return files;
    ASSIGN_OR_RETURN(files, source.fs()->ListDir(step_dir));
    std::sort(files.begin(), files.end());
    return files;
  }
  for (const CheckpointMeta::Host& h : meta.hosts) {
    if (h.rank % num_ranks == rank) files.push_back(h.file);
  }
  if (rank == 0) {
    files.push_back(kCheckpointMetaFile);
    files.push_back(IndexPath("ckpt"));  // last: a drained index means a finished share
  }
  return files;
}

absl::StatusOr<std::optional<int64_t>> NextStepToDrain(const CheckpointStore& source,
                                                       const CheckpointStore& drain, const std::string& run,
                                                       int every_n_steps) {
  ASSIGN_OR_RETURN(std::vector<int64_t> committed, source.ListSteps(run));
  ASSIGN_OR_RETURN(std::vector<int64_t> drained, drain.ListSteps(run));
  for (auto it = committed.rbegin(); it != committed.rend(); ++it) {
    if (!drained.empty() && *it <= drained.back()) break;
    if (every_n_steps <= 1 || *it % every_n_steps == 0) return std::optional<int64_t>(*it);
  }
  return std::optional<int64_t>();
}

absl::StatusOr<std::vector<int64_t>> PublishDrained(const CheckpointStore& drain, const DrainJob& job,
                                                    int keep_last, const std::set<int64_t>& protect) {
  FileSystem* fs = drain.fs();
  const std::string temp = DrainTempDir(drain, job.run, job.step, job.id);
  ASSIGN_OR_RETURN(bool already, drain.Committed(job.run, job.step));
  if (already) {
    // Drained before (by a daemon that crashed before it could say so).
    RETURN_IF_ERROR(fs->DeleteRecursively(temp));
  } else {
    RETURN_IF_ERROR(CheckDrainedFiles(drain, temp));
    bool renamed = false;
    RETURN_IF_ERROR(drain.PublishStep(temp, job.run, job.step, /*sync_contents=*/true, &renamed));
  }
  // No other drain of the run is in flight: any other temp directory is an orphan.
  RETURN_IF_ERROR(drain.RemoveOrphans(job.run).status());
  if (keep_last <= 0) return std::vector<int64_t>();
  return drain.ApplyRetention(job.run, keep_last, 0, protect, /*dry_run=*/false);
}

Drainer::Drainer(const CheckpointStore* source, const CheckpointStore* drain, uint32_t dir_mode,
                 int64_t bytes_per_second)
    : source_(source), drain_(drain), dir_mode_(dir_mode), bytes_per_second_(bytes_per_second) {
  thread_ = std::thread([this] { Loop(); });
}

Drainer::~Drainer() {
  {
    absl::MutexLock lock(&mu_);
    quit_ = true;
    cancel_ = true;
  }
  thread_.join();
}

bool Drainer::Start(DrainJob job) {
  absl::MutexLock lock(&mu_);
  if (progress_.running || next_.has_value()) return false;
  progress_ = Progress{.seq = job.seq, .running = true};
  cancel_ = false;
  next_ = std::move(job);
  return true;
}

void Drainer::Cancel() {
  absl::MutexLock lock(&mu_);
  if (progress_.running) cancel_ = true;
}

Drainer::Progress Drainer::Poll() const {
  absl::MutexLock lock(&mu_);
  return progress_;
}

bool Drainer::Cancelled() const {
  absl::MutexLock lock(&mu_);
  return cancel_;
}

void Drainer::Loop() {
  while (true) {
    DrainJob job;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](Drainer* d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(d->mu_) { return d->quit_ || d->next_.has_value(); },
          this));
      if (quit_) return;
      job = *std::move(next_);
      next_.reset();
    }
    started_ = absl::Now();
    copied_ = 0;
    absl::Status s = Copy(job);
    absl::MutexLock lock(&mu_);
    progress_.running = false;
    progress_.done = true;
    progress_.status = s;
    progress_.bytes = copied_;
    progress_.seconds = absl::ToDoubleSeconds(absl::Now() - started_);
  }
}

absl::Status Drainer::Copy(const DrainJob& job) {
  ASSIGN_OR_RETURN(bool committed, source_->Committed(job.run, job.step));
  if (!committed) {
    return absl::NotFoundError(
        absl::StrCat("step ", job.step, " of run '", job.run, "' is no longer in the checkpoint root"));
  }
  ASSIGN_OR_RETURN(std::vector<std::string> files,
                   DrainShare(*source_, job.run, job.step, job.rank, job.num_ranks));
  // Every host fills the one temp directory of the shared drain root.
  ASSIGN_OR_RETURN(const std::string temp, drain_->BeginStep(job.run, job.step, DrainTempSuffix(job.id),
                                                             dir_mode_, CheckpointStore::Begin::kJoin));
  const std::string from_dir = source_->StepDir(job.run, job.step);
  for (const std::string& name : files) {
    RETURN_IF_ERROR(CopyFile(JoinPath(from_dir, name), JoinPath(temp, name)));
  }
  return drain_->fs()->SyncDir(temp);
}

absl::Status Drainer::CopyFile(const std::string& from, const std::string& to) {
  ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> in, source_->fs()->NewRandomAccessFile(from));
  FileSystem* fs = drain_->fs();
  // A file under its final name was synced before it was renamed: what a resumed
  // drain of the same commit keeps.
  if (absl::StatusOr<uint64_t> size = fs->FileSize(to); size.ok() && *size == in->Size()) {
    return absl::OkStatus();
  }
  const std::string partial = absl::StrCat(to, kPartialSuffix);
  fs->DeleteFile(partial).IgnoreError();
  ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> out, fs->NewDirectWritableFile(partial));
  // Aligned, so that the O_DIRECT writer writes straight from it.
  std::unique_ptr<char, decltype(&std::free)> buffer(
      static_cast<char*>(std::aligned_alloc(kAlignment, kChunkBytes)), &std::free);
  if (buffer == nullptr) return absl::ResourceExhaustedError("drain: no memory for a copy buffer");
  for (uint64_t offset = 0; offset < in->Size();) {
    if (Cancelled()) return absl::CancelledError(absl::StrCat("drain of ", to, " cancelled"));
    const size_t n = static_cast<size_t>(std::min<uint64_t>(in->Size() - offset, kChunkBytes));
    RETURN_IF_ERROR(Annotate(in->Read(offset, n, buffer.get()), from));
    RETURN_IF_ERROR(Annotate(out->Append(absl::string_view(buffer.get(), n)), partial));
    offset += n;
    Pace(static_cast<int64_t>(n));
  }
  RETURN_IF_ERROR(Annotate(out->Sync(), partial));
  RETURN_IF_ERROR(Annotate(out->Close(), partial));
  return fs->Rename(partial, to);
}

void Drainer::Pace(int64_t more) {
  copied_ += more;
  {
    absl::MutexLock lock(&mu_);
    progress_.bytes = copied_;
  }
  if (bytes_per_second_ <= 0) return;
  const absl::Time due = started_ + absl::Seconds(static_cast<double>(copied_) / bytes_per_second_);
  // In slices, so that a cancel is seen within a tenth of a second.
  for (absl::Time now = absl::Now(); now < due && !Cancelled(); now = absl::Now()) {
    absl::SleepFor(std::min(due - now, absl::Milliseconds(100)));
  }
}

}  // namespace ckptd
