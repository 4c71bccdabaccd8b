// CUDA device memory lent to the daemon by IPC handle. Everywhere: a daemon that
// cannot take device memory (built without CUDA: UNIMPLEMENTED; no usable device:
// FAILED_PRECONDITION) refuses before the step counts, so the same step still commits
// from host memory, and malformed handles are INVALID_ARGUMENT. With a GPU: bytes
// saved from device memory restore bit-exact into device and host memory, resharded,
// and the daemons report the D2H and H2D rates (scripts/gpu-check.sh prints them).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/base/status.h"
#include "tests/integration/cluster.h"
#include "tests/integration/cluster_fixture.h"
#if CKPTD_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "ckptd/cuda.h"
#endif

namespace ckptd::testing {
namespace {

using DeviceMemoryTest = ClusterFixture;

// Zero UUID: no real device has it, so a CUDA daemon with devices refuses it too.
DeviceMemory NowhereMemory() { return {std::string(64, '\0'), 0, std::string(16, '\0')}; }

TEST_F(DeviceMemoryTest, RefusedBeforeTheStepCountsWhenTheDaemonCannotTakeIt) {
  StartCluster(1);
  auto client = cluster_->Connect(0);
  std::vector<float> host(1000, 1.5f);
  TensorShard on_device{.name = "w", .dtype = kDtFloat, .shape = {1000}, .data = nullptr, .size = 0};
  on_device.device_memory = NowhereMemory();
  TensorShard on_host{.name = "b",
                      .dtype = kDtFloat,
                      .shape = {1000},
                      .data = host.data(),
                      .size = host.size() * sizeof(float)};
  auto refused = client->Save("dev", 1, 0, 1, {on_host, on_device});
  // Without CUDA in the build: UNIMPLEMENTED. With it: no device here, or no device
  // with that UUID: FAILED_PRECONDITION either way.
  EXPECT_EQ(refused.status().code(),
            CKPTD_HAVE_CUDA ? absl::StatusCode::kFailedPrecondition : absl::StatusCode::kUnimplemented)
      << refused.status();
  EXPECT_NE(refused.status().message().find("device_memory"), absl::string_view::npos) << refused.status();

  // Malformed: a short handle, a short UUID, a negative offset, with a layout.
  for (DeviceMemory bad :
       {DeviceMemory{"short", 0, std::string(16, '\0')}, DeviceMemory{std::string(64, '\0'), 0, "uuid"},
        DeviceMemory{std::string(64, '\0'), -8, std::string(16, '\0')}}) {
    TensorShard t = on_device;
    t.device_memory = bad;
    EXPECT_EQ(client->Save("dev", 1, 0, 1, {t}).status().code(), absl::StatusCode::kInvalidArgument);
  }
  TensorShard layout{.name = "l",
                     .dtype = kDtFloat,
                     .shape = {4},
                     .data = nullptr,
                     .size = 0,
                     .use_layout = true,
                     .sharding_specs = {"unsharded"},
                     .device_data = {}};
  layout.device_memory = NowhereMemory();
  SaveOptions mesh;
  mesh.mesh = "|x=1|0|0|/job:localhost/task:0/device:CPU:0";
  mesh.device_ids = {0};
  EXPECT_EQ(client->Save("dev", 1, 0, 1, {layout}, mesh).status().code(), absl::StatusCode::kInvalidArgument);

  // Nothing of that counted: step 1 commits from host memory alone.
  on_device.data = host.data();
  on_device.size = host.size() * sizeof(float);
  on_device.device_memory.reset();
  ASSERT_TRUE(client->Save("dev", 1, 0, 1, {on_host, on_device}).ok());
  ASSERT_TRUE(client->Wait("dev", 1).ok());

  // Restore into device memory is refused the same way, and nothing is half-done.
  std::vector<float> back(1000);
  RestoreTarget to_device{.name = "w", .dtype = 0, .data = nullptr, .size = 0};
  to_device.device_memory = NowhereMemory();
  auto restored = client->Restore(
      "dev", 1,
      {{.name = "b", .dtype = 0, .data = back.data(), .size = back.size() * sizeof(float)}, to_device});
  EXPECT_EQ(restored.status().code(),
            CKPTD_HAVE_CUDA ? absl::StatusCode::kFailedPrecondition : absl::StatusCode::kUnimplemented)
      << restored.status();
  auto host_only = client->Restore(
      "dev", 1, {{.name = "w", .dtype = 0, .data = back.data(), .size = back.size() * sizeof(float)}});
  ASSERT_TRUE(host_only.ok()) << host_only.status();
  EXPECT_EQ(back, host);
  auto status = client->Status();
  ASSERT_TRUE(status.ok());
  EXPECT_FALSE(status->device_memory().empty());
  EXPECT_EQ(status->device_to_host_bytes(), 0);
}

#if CKPTD_HAVE_CUDA

#define ASSERT_CUDA(expr)                                                                    \
  do {                                                                                       \
    const cudaError_t cuda_error_ = (expr);                                                  \
    ASSERT_EQ(cuda_error_, cudaSuccess) << #expr << ": " << cudaGetErrorString(cuda_error_); \
  } while (0)

// Bytes of the GPU test: CKPTD_GPU_CHECK_BYTES (scripts/gpu-check.sh sets 4 GiB), else 64 MiB.
int64_t CheckBytes() {
  const char* env = std::getenv("CKPTD_GPU_CHECK_BYTES");
  const int64_t bytes = env != nullptr ? std::atoll(env) : int64_t{64} << 20;
  return std::max<int64_t>(bytes / (1 << 15) * (1 << 15), 1 << 15);  // whole rows of 4 KiB, even count
}

TEST_F(DeviceMemoryTest, SavedFromDeviceMemoryRestoresBitExactIntoDeviceAndHost) {
  std::string why;
  if (CudaDeviceCount(&why) == 0) {
    // scripts/gpu-check.sh sets CKPTD_REQUIRE_GPU: there, a missing GPU is a failure.
    if (std::getenv("CKPTD_REQUIRE_GPU") != nullptr) FAIL() << "no CUDA device: " << why;
    GTEST_SKIP() << "no CUDA device: " << why;
  }
  StartCluster(2);
  const int64_t bytes = CheckBytes();
  const int64_t cols = 1024, rows = bytes / (cols * 4), half = rows / 2;
  const size_t half_bytes = static_cast<size_t>(half * cols * 4);
  // The pattern: element i holds i (as uint32), so any misplaced byte shows.
  std::vector<uint32_t> pattern(static_cast<size_t>(rows * cols));
  std::iota(pattern.begin(), pattern.end(), 0u);
  // Trainer t's half lies at offset 4 KiB of its own allocation (not at the base).
  constexpr int64_t kOffset = 4096;
  char* device[2] = {nullptr, nullptr};
  for (int t = 0; t < 2; ++t) {
    ASSERT_CUDA(cudaMalloc(reinterpret_cast<void**>(&device[t]), half_bytes + kOffset));
    ASSERT_CUDA(cudaMemcpy(device[t] + kOffset, pattern.data() + t * half * cols, half_bytes,
                           cudaMemcpyHostToDevice));
  }
  std::vector<double> stall(2);
  auto results = RunTrainers(2, [&](int t) -> absl::Status {
    auto client = cluster_->Connect(t);
    ASSIGN_OR_RETURN(DeviceMemory lent, ExportDeviceMemory(device[t], kOffset));
    TensorShard shard{.name = "w",
                      .dtype = kDtUint32,
                      .shape = {rows, cols},
                      .box_start = {t * half, 0},
                      .box_length = {half, cols},
                      .data = nullptr,
                      .size = 0};
    shard.device_memory = lent;
    std::vector<uint32_t> small{7, 8, 9};
    TensorShard host{
        .name = "b", .dtype = kDtUint32, .shape = {3}, .data = small.data(), .size = small.size() * 4};
    const absl::Time start = absl::Now();
    RETURN_IF_ERROR(client->Save("gpu", 1, t, 2, {shard, host}).status());
    stall[t] = absl::ToDoubleSeconds(absl::Now() - start);
    if (cudaMemset(device[t] + kOffset, 0xff, half_bytes) != cudaSuccess)
      return absl::InternalError("memset");
    return client->Wait("gpu", 1);
  });
  for (int t = 0; t < 2; ++t) ASSERT_TRUE(results[t].ok()) << "trainer " << t << ": " << results[t];

  // Whole tensor into one device allocation (H2D), and row halves swapped across
  // daemons into host memory (resharded: each daemon serves the other's rows).
  char* whole = nullptr;
  ASSERT_CUDA(cudaMalloc(reinterpret_cast<void**>(&whole), static_cast<size_t>(bytes)));
  auto client = cluster_->Connect(1);
  RestoreTarget to_device{.name = "w", .dtype = kDtUint32, .shape = {rows, cols}, .data = nullptr, .size = 0};
  auto lent = ExportDeviceMemory(whole, 0);
  ASSERT_TRUE(lent.ok()) << lent.status();
  to_device.device_memory = *lent;
  std::vector<uint32_t> b(3);
  auto restored =
      client->Restore("gpu", 1, {to_device, {.name = "b", .dtype = 0, .data = b.data(), .size = 12}});
  ASSERT_TRUE(restored.ok()) << restored.status();
  std::vector<uint32_t> back(pattern.size());
  ASSERT_CUDA(cudaMemcpy(back.data(), whole, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost));
  EXPECT_TRUE(back == pattern) << "device restore differs";
  EXPECT_EQ(b, (std::vector<uint32_t>{7, 8, 9}));
  for (int t = 0; t < 2; ++t) {
    std::vector<uint32_t> rows_back(static_cast<size_t>(half * cols));
    auto r = cluster_->Connect(t)->Restore("gpu", 1,
                                           {{.name = "w",
                                             .dtype = 0,
                                             .box_start = {(1 - t) * half, 0},
                                             .box_length = {half, cols},
                                             .data = rows_back.data(),
                                             .size = half_bytes}});
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(std::memcmp(rows_back.data(), pattern.data() + (1 - t) * half * cols, half_bytes), 0);
  }
  // Rates as the daemons measured their copies.
  int64_t d2h_bytes = 0, h2d_bytes = 0;
  double d2h_s = 0, h2d_s = 0;
  for (int r = 0; r < 2; ++r) {
    auto status = cluster_->Connect(r)->Status();
    ASSERT_TRUE(status.ok());
    d2h_bytes += status->device_to_host_bytes();
    d2h_s = std::max(d2h_s, status->device_to_host_seconds());
    h2d_bytes += status->host_to_device_bytes();
    h2d_s = std::max(h2d_s, status->host_to_device_seconds());
  }
  EXPECT_EQ(d2h_bytes, bytes);
  EXPECT_EQ(h2d_bytes, bytes);
  std::printf("gpu-check: %.2f GiB  D2H %.1f GB/s  H2D %.1f GB/s  trainer stall %.3f s\n",
              static_cast<double>(bytes) / (1 << 30), static_cast<double>(d2h_bytes) / d2h_s / 1e9,
              static_cast<double>(h2d_bytes) / h2d_s / 1e9, std::max(stall[0], stall[1]));
  cudaFree(whole);
  for (char* p : device) cudaFree(p);
}

#endif  // CKPTD_HAVE_CUDA

}  // namespace
}  // namespace ckptd::testing
