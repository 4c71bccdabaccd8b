#include "tests/fault/in_process_job.h"

#include <cstring>
#include <future>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/base/dtype.h"
#include "daemon/bundle/bundle.h"

namespace ckptd::testing {

std::vector<float> ExpectedW(int ranks, int64_t step) {
  std::vector<float> w(static_cast<size_t>(ranks) * 2 * 8);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(step * 1000 + static_cast<int64_t>(i));
  return w;
}

std::vector<int64_t> ExpectedR(int64_t step) {
  std::vector<int64_t> r(16);
  for (size_t i = 0; i < r.size(); ++i) r[i] = step * 7 + static_cast<int64_t>(i);
  return r;
}

InProcessJob::InProcessJob(const std::string& root, const std::vector<FileSystem*>& fs_per_rank,
                           CoordinatorOptions options, const InProcessDrain* drain)
    : group_(static_cast<int>(fs_per_rank.size())), members_(group_.Members()) {
  for (size_t r = 0; r < fs_per_rank.size(); ++r) {
    auto rank = std::make_unique<Rank>();
    rank->store = std::make_unique<CheckpointStore>(fs_per_rank[r], root);
    CoordinatorOptions mine = options;
    if (drain != nullptr) {
      rank->drain_store = std::make_unique<CheckpointStore>(drain->fs_per_rank[r], drain->root);
      rank->drainer = std::make_unique<Drainer>(rank->store.get(), rank->drain_store.get(), 0755,
                                                drain->bytes_per_second);
      mine.drain_store = rank->drain_store.get();
      mine.drainer = rank->drainer.get();
    }
    rank->coordinator =
        std::make_unique<Coordinator>(members_[r].get(), &rank->registry, rank->store.get(), mine);
    ranks_.push_back(std::move(rank));
  }
  for (auto& rank : ranks_) {
    Rank* raw = rank.get();
    raw->thread = std::thread([this, raw] { raw->coordinator->Run(stop_).IgnoreError(); });
  }
}

InProcessJob::~InProcessJob() {
  stop_ = true;
  for (auto& rank : ranks_) rank->thread.join();
}

std::vector<absl::Status> InProcessJob::Save(const std::string& run, int64_t step) {
  const int ranks = static_cast<int>(ranks_.size());
  const std::vector<float> w = ExpectedW(ranks, step);
  const std::vector<int64_t> r = ExpectedR(step);
  std::vector<std::promise<absl::Status>> done(ranks);
  std::vector<absl::Status> outcomes(ranks);
  for (int i = 0; i < ranks; ++i) {
    Rank& rank = *ranks_[i];
    TrainerPayload payload;
    payload.trainer_id = i;
    auto add = [&](const std::string& name, int dtype, Shape shape, Box box, const void* data, size_t size) {
      StagedBuffer buffer = *rank.staging.Allocate(static_cast<int64_t>(size));
      std::memcpy(buffer.data(), data, size);
      payload.tensors.push_back(
          {name, dtype, std::move(shape), std::move(box), std::move(buffer), false, {}});
    };
    add("w", kFloat, {2 * ranks, 8}, Box{{2 * i, 0}, {2, 8}}, w.data() + i * 16, 16 * sizeof(float));
    add("r", kInt64, {16}, Box{{0}, {16}}, r.data(), r.size() * sizeof(int64_t));
    const StepKey key{run, step};
    absl::Status staged = rank.registry.Stage(key, ranks, std::move(payload));
    if (!staged.ok()) {
      done[i].set_value(staged);
      continue;
    }
    rank.registry.AddStepWaiter(key,
                                Waiter{nullptr, [&done, i](const absl::Status& s) { done[i].set_value(s); }});
  }
  for (int i = 0; i < ranks; ++i) {
    auto future = done[i].get_future();
    if (future.wait_for(std::chrono::seconds(120)) != std::future_status::ready) {
      outcomes[i] = absl::DeadlineExceededError("test harness: no outcome within 120 s (hang)");
      continue;
    }
    outcomes[i] = future.get();
  }
  return outcomes;
}

std::string CheckVisibleState(const std::string& root, const std::string& run, int ranks, bool strict,
                              std::vector<int64_t>* visible) {
  FileSystem* fs = PosixFileSystem();
  CheckpointStore store(fs, root);
  auto steps = store.ListSteps(run);
  if (!steps.ok()) return absl::StrCat("listing: ", steps.status().message());
  *visible = *steps;
  for (int64_t step : *steps) {
    auto reader = BundleReader::Open(fs, CheckpointStore::Prefix(store.StepDir(run, step)));
    if (!reader.ok())
      return absl::StrCat("step ", step, " visible but unreadable: ", reader.status().message());
    std::vector<std::string> problems;
    int64_t bytes = 0;
    (*reader)->VerifyAll(&problems, &bytes);
    if (!problems.empty()) return absl::StrCat("step ", step, " visible but corrupt: ", problems.front());
    auto w = (*reader)->Lookup("w");
    auto r = (*reader)->Lookup("r");
    if (!w.ok() || !r.ok()) return absl::StrCat("step ", step, " lacks a tensor");
    std::vector<float> got_w(static_cast<size_t>(ranks) * 16);
    std::vector<int64_t> got_r(16);
    if (!(*reader)->ReadBox(*w, Box::Full(w->shape), reinterpret_cast<char*>(got_w.data())).ok() ||
        !(*reader)->ReadBox(*r, Box::Full(r->shape), reinterpret_cast<char*>(got_r.data())).ok()) {
      return absl::StrCat("step ", step, " unreadable");
    }
    if (got_w != ExpectedW(ranks, step) || got_r != ExpectedR(step))
      return absl::StrCat("step ", step, " has wrong bytes");
  }
  const std::string state_path = JoinPath(store.RunDir(run), "checkpoint");
  if (!fs->Exists(state_path)) {
    if (strict && !steps->empty()) return "no checkpoint state file though steps are committed";
    return "";
  }
  auto text = fs->ReadFileToString(state_path, 1 << 20);
  auto state = text.ok() ? ParseCheckpointState(*text) : absl::StatusOr<CheckpointState>(text.status());
  if (!state.ok()) return absl::StrCat("state file unreadable: ", state.status().message());
  std::vector<std::string> want;
  for (int64_t step : *steps) want.push_back(CheckpointStore::StepDirName(step) + "/ckpt");
  for (const std::string& path : state->all_model_checkpoint_paths) {
    if (std::find(want.begin(), want.end(), path) == want.end())
      return absl::StrCat("state file names missing ", path);
  }
  if (std::find(want.begin(), want.end(), state->model_checkpoint_path) == want.end()) {
    return absl::StrCat("state file's model_checkpoint_path ", state->model_checkpoint_path,
                        " is not visible");
  }
  if (strict && (state->all_model_checkpoint_paths != want || state->model_checkpoint_path != want.back())) {
    return absl::StrCat("state file lists ", absl::StrJoin(state->all_model_checkpoint_paths, ","),
                        " but visible are ", absl::StrJoin(want, ","));
  }
  return "";
}

}  // namespace ckptd::testing
