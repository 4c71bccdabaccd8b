// The shared-memory data path: same-host trainers hand their bytes over in memfd
// segments. Checks that it gives the same checkpoint as streaming, that Save is
// asynchronous on both paths (the trainer may overwrite its buffers once Save
// returns), and that the daemon refuses segments it must not map.
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "daemon/base/status.h"
#include "daemon/bundle/bundle.h"
#include "daemon/store/checkpoint_store.h"
#include "tests/common/temp_dir.h"
#include "tests/integration/cluster.h"

namespace ckptd::testing {
namespace {

std::string FileBytes(const std::string& path) {
  auto size = PosixFileSystem()->FileSize(path);
  if (!size.ok()) return "<missing " + path + ">";
  return *PosixFileSystem()->ReadFileToString(path, *size + 1);
}

// Trainer t of 4 holds rows [4t, 4t+4) of a 16x1000 float tensor and a replicated
// int64 vector; values depend on the step.
struct TrainerData {
  std::vector<float> rows;
  std::vector<int64_t> bias;
  std::vector<TensorShard> Shards(int t) {
    return {{.name = "w",
             .dtype = kDtFloat,
             .shape = {16, 1000},
             .box_start = {4 * t, 0},
             .box_length = {4, 1000},
             .data = rows.data(),
             .size = rows.size() * sizeof(float)},
            {.name = "bias",
             .dtype = kDtInt64,
             .shape = {5},
             .data = bias.data(),
             .size = bias.size() * sizeof(int64_t)}};
  }
};

TrainerData MakeData(int t, int64_t step) {
  TrainerData d;
  for (int i = 0; i < 4000; ++i) d.rows.push_back(static_cast<float>(step * 100000 + (4 * t) * 1000 + i));
  for (int i = 0; i < 5; ++i) d.bias.push_back(step * 10 + i);
  return d;
}

class SharedMemoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cluster_ = std::make_unique<Cluster>(2);
    absl::Status s = cluster_->Start();
    ASSERT_TRUE(s.ok()) << s;
  }
  void TearDown() override { EXPECT_EQ(cluster_->Stop(), 0) << "see " << cluster_->log(); }
  std::string Prefix(const std::string& run, int64_t step) const {
    return CheckpointStore::Prefix(CheckpointStore(PosixFileSystem(), cluster_->root()).StepDir(run, step));
  }
  // Saves step `step` from 4 trainers over `transport`; each trainer overwrites its
  // buffers as soon as Save returns, before the step is durable.
  void SaveAll(const std::string& run, int64_t step, Transport transport, bool expect_shared) {
    auto results = RunTrainers(4, [&](int t) -> absl::Status {
      auto client = cluster_->Connect(t / 2);
      TrainerData data = MakeData(t, step);
      SaveOptions options;
      options.transport = transport;
      ASSIGN_OR_RETURN(SaveResult result, client->Save(run, step, t, 4, data.Shards(t), options));
      if (result.shared_memory != expect_shared) return absl::InternalError("wrong transport taken");
      std::fill(data.rows.begin(), data.rows.end(), -1.0f);
      std::fill(data.bias.begin(), data.bias.end(), -1);
      return client->Wait(run, step);
    });
    for (int t = 0; t < 4; ++t) ASSERT_TRUE(results[t].ok()) << "trainer " << t << ": " << results[t];
  }
  // Restores step `step` into plain memory over `transport`; returns whether the
  // daemon wrote it into that memory itself.
  bool ExpectRestores(const std::string& run, int64_t step, Transport transport) {
    auto client = cluster_->Connect(1);
    std::vector<float> w(16 * 1000);
    std::vector<int64_t> bias(5);
    RestoreOptions options;
    options.transport = transport;
    RestoreStats stats;
    options.stats = &stats;
    auto restored = client->Restore(
        run, step,
        {{.name = "w", .dtype = 0, .data = w.data(), .size = w.size() * sizeof(float)},
         {.name = "bias", .dtype = 0, .data = bias.data(), .size = bias.size() * sizeof(int64_t)}},
        options);
    EXPECT_TRUE(restored.ok()) << restored.status();
    std::vector<float> want;
    for (int t = 0; t < 4; ++t) {
      const TrainerData d = MakeData(t, step);
      want.insert(want.end(), d.rows.begin(), d.rows.end());
    }
    EXPECT_EQ(w, want);
    EXPECT_EQ(bias, MakeData(0, step).bias);
    return stats.into_trainer_memory;
  }
  std::unique_ptr<Cluster> cluster_;
};

TEST_F(SharedMemoryTest, BothPathsWriteIdenticalCheckpointsAndRestoreBitExact) {
  SaveAll("stream", 1, Transport::kStream, false);
  SaveAll("shm", 1, Transport::kAuto, true);  // a unix socket: auto picks shared memory
  for (const std::string& file : {std::string("ckpt.index"), std::string("ckpt.data-00000-of-00002"),
                                  std::string("ckpt.data-00001-of-00002")}) {
    const std::string stream = FileBytes(DirName(Prefix("stream", 1)) + "/" + file);
    EXPECT_FALSE(stream.empty()) << file;
    EXPECT_TRUE(stream == FileBytes(DirName(Prefix("shm", 1)) + "/" + file)) << file << " differs";
  }
  ExpectRestores("shm", 1, Transport::kSharedMemory);
  ExpectRestores("shm", 1, Transport::kStream);
  ExpectRestores("stream", 1, Transport::kSharedMemory);
}

TEST_F(SharedMemoryTest, SegmentsAreReusedAcrossStepsAndStatusReportsTheCommit) {
  for (int64_t step = 1; step <= 3; ++step) SaveAll("reuse", step, Transport::kSharedMemory, true);
  for (int64_t step = 1; step <= 3; ++step) ExpectRestores("reuse", step, Transport::kAuto);
  auto client = cluster_->Connect(0);
  auto status = client->Status();
  ASSERT_TRUE(status.ok()) << status.status();
  ASSERT_EQ(status->runs_size(), 1);
  EXPECT_EQ(status->runs(0).last_committed_step(), 3);
  EXPECT_GT(status->runs(0).last_commit_unix_seconds(), 1.7e9);
  EXPECT_GT(status->runs(0).last_commit_seconds(), 0.0);
  EXPECT_EQ(status->bytes_in_flight(), 0);
  EXPECT_EQ(status->bytes_staged(), 0);
}

TEST_F(SharedMemoryTest, RestoreIntoATooSmallTargetIsInvalidArgument) {
  SaveAll("small", 1, Transport::kSharedMemory, true);
  auto client = cluster_->Connect(0);
  std::vector<float> w(16 * 999);
  RestoreOptions options;
  options.transport = Transport::kSharedMemory;
  auto restored = client->Restore(
      "small", 1, {{.name = "w", .dtype = 0, .data = w.data(), .size = w.size() * sizeof(float)}}, options);
  EXPECT_EQ(restored.status().code(), absl::StatusCode::kInvalidArgument) << restored.status();
}

TEST_F(SharedMemoryTest, RestoresIntoHostBuffersAreBitExactOnEveryTransport) {
  SaveAll("host", 1, Transport::kSharedMemory, true);
  auto client = cluster_->Connect(0);
  std::vector<float> want;
  for (int t = 0; t < 4; ++t) {
    const TrainerData d = MakeData(t, 1);
    want.insert(want.end(), d.rows.begin(), d.rows.end());
  }
  const size_t w_bytes = want.size() * sizeof(float), bias_bytes = 5 * sizeof(int64_t);
  // Both tensors in one buffer, the bias at an offset that is not page-aligned.
  auto buffer = HostBuffer::Allocate(w_bytes + 64 + bias_bytes);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  char* w = (*buffer)->data();
  char* bias = w + w_bytes + 64;
  for (Transport transport : {Transport::kSharedMemory, Transport::kStream, Transport::kAuto}) {
    std::memset((*buffer)->data(), 0xff, (*buffer)->size());
    RestoreOptions options;
    options.transport = transport;
    RestoreStats stats;
    options.stats = &stats;
    auto restored = client->Restore(
        "host", 1,
        {{.name = "w", .dtype = 0, .data = w, .size = w_bytes, .host_buffer = buffer->get()},
         {.name = "bias", .dtype = 0, .data = bias, .size = bias_bytes, .host_buffer = buffer->get()}},
        options);
    ASSERT_TRUE(restored.ok()) << restored.status();
    EXPECT_EQ(std::memcmp(w, want.data(), w_bytes), 0) << static_cast<int>(transport);
    EXPECT_EQ(std::memcmp(bias, MakeData(0, 1).bias.data(), bias_bytes), 0) << static_cast<int>(transport);
    EXPECT_EQ(stats.bytes_delivered, static_cast<int64_t>(w_bytes + bias_bytes));
  }
  // A target that claims a buffer it does not lie in is refused before anything is sent.
  std::vector<float> elsewhere(want.size());
  auto wrong = client->Restore(
      "host", 1,
      {{.name = "w", .dtype = 0, .data = elsewhere.data(), .size = w_bytes, .host_buffer = buffer->get()}});
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument) << wrong.status();
  // A target smaller than the tensor: the daemon names the field.
  auto small = client->Restore(
      "host", 1, {{.name = "w", .dtype = 0, .data = w, .size = w_bytes - 4, .host_buffer = buffer->get()}});
  EXPECT_EQ(small.status().code(), absl::StatusCode::kInvalidArgument) << small.status();
  EXPECT_NE(small.status().message().find("host_memory.size"), std::string::npos) << small.status();
}

// Raises vm.nr_hugepages so that at least `pages` huge pages are free, and puts the
// setting back after (root only; ok() says whether they are there).
class HugePageReservation {
 public:
  explicit HugePageReservation(int pages) {
    std::ifstream in("/proc/sys/vm/nr_hugepages");
    if (!(in >> before_)) return;
    if (Free() >= pages) return;
    std::ofstream out("/proc/sys/vm/nr_hugepages");
    if (!(out << before_ + pages << std::endl)) return;
    raised_ = true;
  }
  ~HugePageReservation() {
    if (raised_) std::ofstream("/proc/sys/vm/nr_hugepages") << before_ << std::endl;
  }
  static int Free() {
    std::ifstream meminfo("/proc/meminfo");
    for (std::string line; std::getline(meminfo, line);) {
      if (absl::StartsWith(line, "HugePages_Free:")) return std::atoi(line.c_str() + 15);
    }
    return 0;
  }

 private:
  int before_ = 0;
  bool raised_ = false;
};

// Segments in huge pages: the client makes its save and reply segments (4 MiB and
// up) in them where huge pages are free, and the daemon writes from them and reads
// into them with O_DIRECT in place. Row blocks from 4 trainers restore bit-exact from
// disk into ordinary memory (through a reply segment), into a HostBuffer in huge
// pages, and as a box that cuts them mid-block.
TEST_F(SharedMemoryTest, SegmentsInHugePagesSaveAndRestoreBitExact) {
  HugePageReservation reservation(256);
  if (HugePageReservation::Free() < 64) {
    GTEST_SKIP() << "no free huge pages (vm.nr_hugepages), and this process may not reserve them";
  }
  // 16 rows per trainer: 6 MiB and 64 KiB, whole disk blocks, so that every row block
  // is read in place into a huge-page target.
  constexpr int64_t kRows = 64, kCols = (6 << 20) / 4 / 16 + 1024;
  auto value = [](int64_t row, int64_t col) { return static_cast<float>(row * kCols + col) * 0.5f; };
  auto results = RunTrainers(4, [&](int t) -> absl::Status {
    auto client = cluster_->Connect(t / 2);
    std::vector<float> rows(16 * kCols);
    for (int64_t r = 0; r < 16; ++r)
      for (int64_t c = 0; c < kCols; ++c) rows[r * kCols + c] = value(16 * t + r, c);
    SaveOptions options;
    options.transport = Transport::kSharedMemory;
    ASSIGN_OR_RETURN(SaveResult result, client->Save("huge", 1, t, 4,
                                                     {{.name = "big",
                                                       .dtype = kDtFloat,
                                                       .shape = {kRows, kCols},
                                                       .box_start = {16 * t, 0},
                                                       .box_length = {16, kCols},
                                                       .data = rows.data(),
                                                       .size = rows.size() * sizeof(float)}},
                                                     options));
    if (!result.shared_memory) return absl::InternalError("saved without shared memory");
    return client->Wait("huge", 1);
  });
  for (int t = 0; t < 4; ++t) ASSERT_TRUE(results[t].ok()) << "trainer " << t << ": " << results[t];
  std::vector<float> want(kRows * kCols);
  for (int64_t r = 0; r < kRows; ++r)
    for (int64_t c = 0; c < kCols; ++c) want[r * kCols + c] = value(r, c);
  const size_t bytes = want.size() * sizeof(float);
  // Fresh daemons, so that the restores read the data files from disk, not the
  // saved bytes the daemons still hold in memory.
  ASSERT_EQ(cluster_->Stop(), 0) << "see " << cluster_->log();
  ASSERT_TRUE(cluster_->Start().ok());

  auto client = cluster_->Connect(1);
  std::vector<float> plain(want.size(), -1.0f);
  RestoreOptions options;
  options.transport = Transport::kSharedMemory;
  auto restored =
      client->Restore("huge", 1, {{.name = "big", .dtype = 0, .data = plain.data(), .size = bytes}}, options);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_TRUE(plain == want);

  auto buffer = HostBuffer::Allocate(bytes);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  EXPECT_TRUE((*buffer)->huge_pages()) << "a " << bytes << "-byte buffer with huge pages free";
  std::memset((*buffer)->data(), 0xff, (*buffer)->size());
  restored = client->Restore(
      "huge", 1,
      {{.name = "big", .dtype = 0, .data = (*buffer)->data(), .size = bytes, .host_buffer = buffer->get()}},
      options);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(std::memcmp((*buffer)->data(), want.data(), bytes), 0);
  // Rows [8, 40) into ordinary memory: pieces that start mid-block land through the
  // daemon's own slots, beside row blocks read in place.
  std::vector<float> middle(32 * kCols, -1.0f);
  restored = client->Restore("huge", 1,
                             {{.name = "big",
                               .dtype = 0,
                               .box_start = {8, 0},
                               .box_length = {32, kCols},
                               .data = middle.data(),
                               .size = middle.size() * sizeof(float)}},
                             options);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_TRUE(std::equal(middle.begin(), middle.end(), want.begin() + 8 * kCols));
  // A small buffer stays in ordinary pages: most of a huge page would be waste.
  auto small = HostBuffer::Allocate(64 << 10);
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_FALSE((*small)->huge_pages());
}

// Sends `request` as a raw Restore: *header gets the reply's header (when there is
// one), *chunks counts the chunks of tensor data it carried.
grpc::Status SendRawRestore(const std::string& address, const v1::RestoreRequest& request,
                            v1::RestoreHeader* header, int* chunks) {
  auto channel = grpc::CreateChannel("unix:" + address, grpc::InsecureChannelCredentials());
  auto stub = v1::Ckptd::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  auto reader = stub->Restore(&ctx, request);
  v1::RestoreResponse response;
  *chunks = 0;
  while (reader->Read(&response)) {
    if (response.has_header()) *header = response.header();
    *chunks += response.has_chunk() ? 1 : 0;
  }
  return reader->Finish();
}

// Restores "bias" of run "host" step 1 with host_memory naming `fd` of this process,
// returning the chunks of tensor data the reply carried.
grpc::Status RawRestoreIntoHostMemory(const std::string& address, int fd, int64_t offset, int64_t size,
                                      int* chunks) {
  v1::RestoreRequest request;
  request.set_run("host");
  request.set_step(1);
  v1::TensorRequest* t = request.add_tensors();
  t->set_name("bias");
  t->mutable_host_memory()->set_fd(fd);
  t->mutable_host_memory()->set_offset(offset);
  t->mutable_host_memory()->set_size(size);
  v1::RestoreHeader header;
  return SendRawRestore(address, request, &header, chunks);
}

TEST_F(SharedMemoryTest, HostMemoryIsWrittenByTheDaemonAndNoChunkCarriesIt) {
  SaveAll("host", 1, Transport::kSharedMemory, true);
  auto buffer = HostBuffer::Allocate(4096);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  int chunks = -1;
  grpc::Status s = RawRestoreIntoHostMemory(cluster_->Address(0), (*buffer)->fd(), 100, 40, &chunks);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(chunks, 0);
  EXPECT_EQ(std::memcmp((*buffer)->data() + 100, MakeData(0, 1).bias.data(), 40), 0);
  // A range past the segment's end, and an fd that is no memfd, are refused.
  s = RawRestoreIntoHostMemory(cluster_->Address(0), (*buffer)->fd(), 4080, 40, &chunks);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  const int file = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  s = RawRestoreIntoHostMemory(cluster_->Address(0), file, 0, 40, &chunks);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_NE(s.error_message().find("tensors[0].host_memory"), std::string::npos) << s.error_message();
  ::close(file);
}

TEST_F(SharedMemoryTest, OnThisHostTheDaemonWritesRestoresIntoTheTrainersOwnMemory) {
  SaveAll("direct", 1, Transport::kSharedMemory, true);
  // As root the kernel lets the daemon write into the test's memory: every plain
  // target is written there, over auto and shared memory alike; a streamed reply
  // stays a stream.
  EXPECT_TRUE(ExpectRestores("direct", 1, Transport::kAuto));
  EXPECT_TRUE(ExpectRestores("direct", 1, Transport::kSharedMemory));
  EXPECT_FALSE(ExpectRestores("direct", 1, Transport::kStream));
  // A target split over several buffers (a layout's boxes, one per device) is
  // written piece by piece: two devices, each holding rows 8d..8d+8 of w.
  auto client = cluster_->Connect(0);
  std::vector<float> device0(8 * 1000, -1), device1(8 * 1000, -1);
  NamedTensors named = {{"w",
                         {.dtype = kDtFloat,
                          .shape = {16, 1000},
                          .sharding_specs = {"x", "unsharded"},
                          .device_data = {{device0.data(), device0.size() * sizeof(float)},
                                          {device1.data(), device1.size() * sizeof(float)}}}}};
  RestoreOptions options;
  options.mesh =
      "|x=2|0,1|0,1|/job:localhost/replica:0/task:0/device:CPU:0,/job:localhost/replica:0/task:0/"
      "device:CPU:1";
  options.device_ids = {0, 1};
  RestoreStats stats;
  options.stats = &stats;
  auto restored = client->RestoreByName("direct", 1, named, options);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_TRUE(stats.into_trainer_memory);
  for (int t = 0; t < 4; ++t) {
    const std::vector<float>& device = t < 2 ? device0 : device1;
    const TrainerData d = MakeData(t, 1);
    EXPECT_TRUE(std::equal(d.rows.begin(), d.rows.end(), device.begin() + (t % 2) * 4000)) << "trainer " << t;
  }
}

// A raw Restore of w (64,000 bytes) into `ranges` of this process, with `segment`
// as its shared-memory reply; *header gets the reply's header, *chunks counts chunks.
grpc::Status RawRestoreIntoProcessMemory(const std::string& address, const HostBuffer& segment,
                                         const std::vector<std::pair<void*, int64_t>>& ranges,
                                         v1::RestoreHeader* header, int* chunks,
                                         bool host_memory_too = false) {
  v1::RestoreRequest request;
  request.set_run("direct");
  request.set_step(1);
  v1::TensorRequest* t = request.add_tensors();
  t->set_name("w");
  for (const auto& [data, size] : ranges) {
    v1::MemoryRange* range = t->add_process_memory();
    range->set_address(reinterpret_cast<uintptr_t>(data));
    range->set_size(size);
  }
  if (host_memory_too) {
    t->mutable_host_memory()->set_fd(segment.fd());
    t->mutable_host_memory()->set_size(64000);
  }
  request.mutable_shared_memory()->set_fd(segment.fd());
  request.mutable_shared_memory()->set_size(static_cast<int64_t>(segment.size()));
  return SendRawRestore(address, request, header, chunks);
}

TEST_F(SharedMemoryTest, ProcessMemoryRangesThatDoNotFitTheTensorAreRefusedWithTheirField) {
  SaveAll("direct", 1, Transport::kSharedMemory, true);
  std::vector<float> want;
  for (int t = 0; t < 4; ++t) {
    const TrainerData d = MakeData(t, 1);
    want.insert(want.end(), d.rows.begin(), d.rows.end());
  }
  auto segment = HostBuffer::Allocate(64000);
  ASSERT_TRUE(segment.ok()) << segment.status();
  std::memset((*segment)->data(), 0, (*segment)->size());
  // Two ranges laid end to end: the bytes land in them, none in the segment, no chunk.
  std::vector<float> w(16 * 1000, -1);
  v1::RestoreHeader header;
  int chunks = -1;
  grpc::Status s = RawRestoreIntoProcessMemory(
      cluster_->Address(0), **segment, {{w.data(), 24000}, {w.data() + 6000, 40000}}, &header, &chunks);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(header.process_memory());
  EXPECT_EQ(chunks, 0);
  EXPECT_EQ(w, want);
  EXPECT_EQ(std::string((*segment)->data(), 64000), std::string(64000, '\0')) << "the segment was written";

  // Ranges that add up to less than the tensor.
  s = RawRestoreIntoProcessMemory(cluster_->Address(0), **segment, {{w.data(), 63996}}, &header, &chunks);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_NE(s.error_message().find("tensors[0].process_memory: ranges of 63996 bytes"), std::string::npos)
      << s.error_message();
  // Memory the daemon may not write, at the start or part-way: the call fails. A
  // page with no access rather than an unmapped one: the hole of an munmap may be
  // mapped again at once by another thread of this process (seen under
  // AddressSanitizer), and the daemon would then write into that.
  const long page = ::sysconf(_SC_PAGESIZE);
  char* region = static_cast<char*>(
      ::mmap(nullptr, 32 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(region, MAP_FAILED);
  ASSERT_EQ(::mprotect(region + 8 * page, page, PROT_NONE), 0);
  s = RawRestoreIntoProcessMemory(cluster_->Address(0), **segment, {{region + 8 * page, 64000}}, &header,
                                  &chunks);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_NE(s.error_message().find("not mapped in the trainer"), std::string::npos) << s.error_message();
  s = RawRestoreIntoProcessMemory(cluster_->Address(0), **segment, {{region, 64000}}, &header, &chunks);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_NE(s.error_message().find("not writable in the trainer"), std::string::npos) << s.error_message();
  ::munmap(region, 32 * page);
  // Two destinations for one tensor.
  s = RawRestoreIntoProcessMemory(cluster_->Address(0), **segment, {{w.data(), 64000}}, &header, &chunks,
                                  /*host_memory_too=*/true);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_NE(s.error_message().find("process_memory with device_memory or host_memory"), std::string::npos)
      << s.error_message();
}

TEST(TrainerMemoryOffTest, WithRestoreIntoTrainerMemoryOffRestoresGoThroughTheSegment) {
  TempDir dir;
  const std::string config = dir.path() + "/ckptd.yaml";
  ASSERT_TRUE(PosixFileSystem()->WriteFileAtomically(config, "restore_into_trainer_memory: false\n").ok());
  Cluster cluster(1, "", {"--config", config});
  ASSERT_TRUE(cluster.Start().ok());
  auto client = cluster.Connect(0);
  std::vector<int64_t> v = {1, 2, 3, 4, 5, 6, 7, 8};
  ASSERT_TRUE(
      client
          ->Save("off", 1, 0, 1,
                 {{.name = "v", .dtype = kDtInt64, .shape = {8}, .data = v.data(), .size = v.size() * 8}})
          .ok());
  ASSERT_TRUE(client->Wait("off", 1).ok());
  std::vector<int64_t> back(8);
  RestoreOptions options;
  options.transport = Transport::kSharedMemory;
  RestoreStats stats;
  options.stats = &stats;
  auto restored = client->Restore(
      "off", 1, {{.name = "v", .dtype = 0, .data = back.data(), .size = back.size() * 8}}, options);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_FALSE(stats.into_trainer_memory);
  EXPECT_EQ(back, v);
  EXPECT_EQ(cluster.Stop(), 0) << "see " << cluster.log();
}

// Sends a raw Save whose header points at `fd` of this process.
grpc::Status RawSave(const std::string& address, int fd, int64_t size) {
  auto channel = grpc::CreateChannel("unix:" + address, grpc::InsecureChannelCredentials());
  auto stub = v1::Ckptd::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::SaveResponse response;
  auto writer = stub->Save(&ctx, &response);
  v1::SaveRequest message;
  v1::SaveHeader* h = message.mutable_header();
  h->set_run("raw");
  h->set_step(1);
  h->set_trainer_id(0);
  h->set_trainer_count(1);
  v1::TensorDescriptor* d = h->add_tensors();
  d->set_name("v");
  d->set_dtype(kDtInt64);
  d->add_shape(8);
  h->mutable_shared_memory()->set_fd(fd);
  h->mutable_shared_memory()->set_size(size);
  writer->Write(message);
  writer->WritesDone();
  return writer->Finish();
}

TEST_F(SharedMemoryTest, DaemonRefusesSegmentsItMustNotMapAndTheStepSurvives) {
  const std::string address = cluster_->Address(0);
  // Not a memfd.
  const int file = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  grpc::Status s = RawSave(address, file, 64);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("not a memfd"), std::string::npos) << s.error_message();
  ::close(file);
  // A memfd that could shrink under the daemon's mapping.
  const int unsealed = ::memfd_create("test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_EQ(::ftruncate(unsealed, 64), 0);
  s = RawSave(address, unsealed, 64);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("F_SEAL_SHRINK"), std::string::npos) << s.error_message();
  // Sealed, but smaller than the 64 bytes it claims to hold.
  ASSERT_EQ(::ftruncate(unsealed, 32), 0);
  ASSERT_EQ(::fcntl(unsealed, F_ADD_SEALS, F_SEAL_SHRINK), 0);
  ASSERT_EQ(::ftruncate(unsealed, 16), -1);
  s = RawSave(address, unsealed, 64);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("fewer than"), std::string::npos) << s.error_message();
  // A declared size that disagrees with the descriptors (8 int64 elements).
  ASSERT_EQ(::ftruncate(unsealed, 128), 0);
  s = RawSave(address, unsealed, 128);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("shared_memory.size"), std::string::npos) << s.error_message();
  // An fd number this process does not have.
  s = RawSave(address, 1 << 20, 64);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
  ::close(unsealed);

  // None of that doomed the step: a proper save of it still commits (one trainer,
  // but the job has two daemons, so the second rank saves nothing and the plan needs
  // only trainer 0).
  auto client = cluster_->Connect(0);
  std::vector<int64_t> v = {1, 2, 3, 4, 5, 6, 7, 8};
  SaveOptions options;
  options.transport = Transport::kSharedMemory;
  auto saved = client->Save(
      "raw", 1, 0, 1,
      {{.name = "v", .dtype = kDtInt64, .shape = {8}, .data = v.data(), .size = v.size() * 8}}, options);
  ASSERT_TRUE(saved.ok()) << saved.status();
  ASSERT_TRUE(client->Wait("raw", 1).ok());
  std::vector<int64_t> back(8);
  ASSERT_TRUE(
      client->Restore("raw", 1, {{.name = "v", .dtype = 0, .data = back.data(), .size = back.size() * 8}})
          .ok());
  EXPECT_EQ(back, v);
}

}  // namespace
}  // namespace ckptd::testing
