// A demo trainer: holds its part of a ~256 MiB model (float32, bfloat16 and int64
// tensors; some sharded across trainers, some replicated), saves it for several steps
// through its local ckptd, then restores the newest step in a different partition and
// checks every byte. Tensor contents are a pure function of (tensor, step, element), so
// any trainer can check any box. Prints one JSON line of measurements.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "ckptd/client.h"

namespace {

struct TensorSpec {
  std::string name;
  int dtype;
  size_t element_size;
  std::vector<int64_t> shape;
};

// Element bytes at global row-major index `g`: a hash, cut to the element size.
inline uint64_t ElementBits(uint32_t seed, uint64_t g) {
  uint64_t x = (g + 1) * 0x9E3779B97F4A7C15ull ^ (static_cast<uint64_t>(seed) << 32);
  x ^= x >> 29;
  return x * 0xBF58476D1CE4E5B9ull;
}

uint32_t Seed(const std::string& name, int64_t step) {
  uint32_t h = 2166136261u;
  for (char c : name) h = (h ^ static_cast<uint8_t>(c)) * 16777619u;
  return h ^ static_cast<uint32_t>(step * 7919);
}

// Fills the row-major bytes of box (start, length) of a 2-D or lower tensor.
void FillBox(const TensorSpec& t, int64_t step, const std::vector<int64_t>& start,
             const std::vector<int64_t>& length, char* out) {
  const uint32_t seed = Seed(t.name, step);
  const int64_t cols = t.shape.size() == 2 ? t.shape[1] : 1;
  const int64_t rows = length.empty() ? 1 : length[0];
  const int64_t width = length.size() == 2 ? length[1] : 1;
  const int64_t r0 = start.empty() ? 0 : start[0];
  const int64_t c0 = start.size() == 2 ? start[1] : 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < width; ++c) {
      const uint64_t bits = ElementBits(seed, static_cast<uint64_t>((r0 + r) * cols + c0 + c));
      std::memcpy(out, &bits, t.element_size);
      out += t.element_size;
    }
  }
}

size_t BoxBytes(const TensorSpec& t, const std::vector<int64_t>& length) {
  return std::accumulate(length.begin(), length.end(), t.element_size,
                         [](size_t a, int64_t b) { return a * static_cast<size_t>(b); });
}

int Fail(const std::string& what, const absl::Status& s) {
  std::cerr << "demo-trainer: " << what << ": " << s << std::endl;
  return 1;
}

// The global model: rows scale with --model-mib; 1024-wide rows.
std::vector<TensorSpec> ModelSpecs(int trainers, int64_t scale_mib) {
  const int64_t unit = std::max<int64_t>(trainers, scale_mib * 32 / trainers * trainers);
  return {
      {"embedding", ckptd::kDtFloat, 4, {unit * 4, 1024}},        // 1/2 of the bytes, row-sharded
      {"dense/kernel", ckptd::kDtBfloat16, 2, {unit * 4, 1024}},  // 1/4, column-sharded
      {"optimizer/m", ckptd::kDtFloat, 4, {unit * 2, 1024}},      // 1/4, halves replicated on 2 trainers
      {"dense/bias", ckptd::kDtFloat, 4, {1024}},                 // fully replicated
      {"global_step", ckptd::kDtInt64, 8, {}},                    // replicated scalar
  };
}

// A box: (start, length).
using BoxOf = std::pair<std::vector<int64_t>, std::vector<int64_t>>;

// The box of tensor `i` that `trainer` saves.
BoxOf SaveBox(const TensorSpec& t, size_t i, int trainer, int trainers) {
  switch (i) {
    case 0: {
      const int64_t rows = t.shape[0] / trainers;
      return {{trainer * rows, 0}, {rows, t.shape[1]}};
    }
    case 1: {
      const int64_t cols = t.shape[1] / trainers;
      return {{0, trainer * cols}, {t.shape[0], cols}};
    }
    case 2: {
      const int64_t rows = t.shape[0] / 2;
      return {{(trainer % 2) * rows, 0}, {rows, t.shape[1]}};
    }
    case 3:
      return {{0}, {t.shape[0]}};
    default:
      return {{}, {}};
  }
}

// The box of tensor `i` that `trainer` restores, in another partition: the
// embedding by column quarters (each box spans every saved row slab), the kernel by
// row blocks, the rest whole.
BoxOf RestoreBox(const TensorSpec& t, size_t i, int trainer, int trainers) {
  if (i == 0) {
    const int64_t cols = t.shape[1] / trainers;
    return {{0, ((trainer + 1) % trainers) * cols}, {t.shape[0], cols}};
  }
  if (i == 1) {
    const int64_t rows = t.shape[0] / trainers;
    return {{((trainer + 1) % trainers) * rows, 0}, {rows, t.shape[1]}};
  }
  return {std::vector<int64_t>(t.shape.size(), 0), t.shape};
}

struct SaveTotals {
  double max_stall = 0, total_wait = 0, save_seconds = 0;
  int64_t bytes_sent = 0;
};

// Saves steps 1..steps of this trainer's boxes, waiting for each to commit; on an
// error *failed_at says which call failed.
absl::StatusOr<SaveTotals> SaveSteps(ckptd::Client& client, const std::string& run, int steps,
                                     const std::vector<TensorSpec>& specs, int trainer, int trainers,
                                     std::string* failed_at) {
  SaveTotals totals;
  std::vector<std::string> buffers(specs.size());
  for (int step = 1; step <= steps; ++step) {
    std::vector<ckptd::TensorShard> shards;
    for (size_t i = 0; i < specs.size(); ++i) {
      auto [start, length] = SaveBox(specs[i], i, trainer, trainers);
      buffers[i].resize(BoxBytes(specs[i], length));
      FillBox(specs[i], step, start, length, buffers[i].data());
      shards.push_back({specs[i].name, specs[i].dtype, specs[i].shape, start, length, buffers[i].data(),
                        buffers[i].size()});
      totals.bytes_sent += static_cast<int64_t>(buffers[i].size());
    }
    const absl::Time t0 = absl::Now();
    auto saved = client.Save(run, step, trainer, trainers, shards);
    if (!saved.ok()) {
      *failed_at = absl::StrCat("save step ", step);
      return saved.status();
    }
    totals.max_stall = std::max(totals.max_stall, absl::ToDoubleSeconds(absl::Now() - t0));
    const absl::Time t1 = absl::Now();
    if (absl::Status s = client.Wait(run, step); !s.ok()) {
      *failed_at = absl::StrCat("wait step ", step);
      return s;
    }
    totals.total_wait += absl::ToDoubleSeconds(absl::Now() - t1);
    totals.save_seconds += absl::ToDoubleSeconds(absl::Now() - t0);  // Save + Wait, not data generation
  }
  return totals;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ckptd demo trainer"};
  std::string address, run = "demo";
  int trainer = 0, trainers = 4, steps = 3;
  int64_t scale_mib = 256;
  app.add_option("--address", address, "daemon socket (default $CKPTD_ADDRESS)");
  app.add_option("--run", run, "run name");
  app.add_option("--trainer-id", trainer)->required();
  app.add_option("--trainer-count", trainers, "must be even: trainers pair up on replicated halves");
  app.add_option("--steps", steps);
  app.add_option("--model-mib", scale_mib, "approximate global model size in MiB");
  CLI11_PARSE(app, argc, argv);
  if (trainers < 2 || trainers % 2 != 0 || trainer < 0 || trainer >= trainers) {
    std::cerr << "demo-trainer: need an even --trainer-count >= 2 and 0 <= --trainer-id < count\n";
    return 2;
  }
  const std::vector<TensorSpec> specs = ModelSpecs(trainers, scale_mib);
  auto client = ckptd::Client::Connect(address, absl::Seconds(30));
  if (!client.ok()) return Fail("connect", client.status());
  std::string failed_at;
  absl::StatusOr<SaveTotals> saved = SaveSteps(**client, run, steps, specs, trainer, trainers, &failed_at);
  if (!saved.ok()) return Fail(failed_at, saved.status());
  if (absl::Status s = (*client)->Barrier(run, trainer, trainers); !s.ok()) return Fail("barrier", s);

  std::vector<ckptd::RestoreTarget> targets;
  std::vector<std::string> restored(specs.size());
  std::vector<BoxOf> want(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    const TensorSpec& t = specs[i];
    want[i] = RestoreBox(t, i, trainer, trainers);
    restored[i].resize(BoxBytes(t, want[i].second));
    targets.push_back(
        {t.name, t.dtype, t.shape, want[i].first, want[i].second, restored[i].data(), restored[i].size()});
  }
  const absl::Time r0 = absl::Now();
  auto step = (*client)->Restore(run, std::nullopt, targets);
  if (!step.ok()) return Fail("restore", step.status());
  const double restore_seconds = absl::ToDoubleSeconds(absl::Now() - r0);
  int64_t bytes_restored = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    std::string expected(restored[i].size(), '\0');
    FillBox(specs[i], *step, want[i].first, want[i].second, expected.data());
    if (expected != restored[i]) {
      std::cerr << "demo-trainer " << trainer << ": tensor '" << specs[i].name << "' restored bytes differ"
                << std::endl;
      return 1;
    }
    bytes_restored += static_cast<int64_t>(restored[i].size());
  }
  std::printf(
      "{\"trainer\": %d, \"steps\": %d, \"restored_step\": %lld, \"bytes_saved\": %lld, "
      "\"bytes_restored\": %lld, \"max_stall_s\": %.4f, \"wait_s\": %.4f, \"save_s\": %.4f, "
      "\"restore_s\": %.4f, \"bytes_equal\": true}\n",
      trainer, steps, static_cast<long long>(*step), static_cast<long long>(saved->bytes_sent),
      static_cast<long long>(bytes_restored), saved->max_stall, saved->total_wait, saved->save_seconds,
      restore_seconds);
  return 0;
}
