// The API as an outside client sees it: a plain gRPC client at gRPC's default settings
// (no ckptd client library), malformed and hostile requests, and the limits an
// error message must stay within. Real daemons under mpirun.
#include <fcntl.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "ckptd/v1/ckptd.grpc.pb.h"
#include "daemon/base/dtype.h"
#include "daemon/base/status.h"
#include "tests/common/temp_dir.h"
#include "tests/integration/cluster.h"

namespace ckptd::testing {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string WriteConfig(const TempDir& dir, const std::string& yaml) {
  const std::string path = dir.Sub("ckptd.yaml");
  std::ofstream(path) << yaml;
  return path;
}

// A stub on a channel with every gRPC default (4 MiB receive limit included).
std::unique_ptr<v1::Ckptd::Stub> DefaultStub(const Cluster& cluster, int rank) {
  return v1::Ckptd::NewStub(
      grpc::CreateChannel("unix:" + cluster.Address(rank), grpc::InsecureChannelCredentials()));
}

v1::SaveRequest Header(const std::string& run, int64_t step, int trainer, int trainer_count) {
  v1::SaveRequest message;
  v1::SaveHeader* h = message.mutable_header();
  h->set_run(run);
  h->set_step(step);
  h->set_trainer_id(trainer);
  h->set_trainer_count(trainer_count);
  return message;
}

v1::TensorDescriptor* AddTensor(v1::SaveRequest* header, const std::string& name, int dtype,
                                std::vector<int64_t> shape) {
  v1::TensorDescriptor* t = header->mutable_header()->add_tensors();
  t->set_name(name);
  t->set_dtype(dtype);
  for (int64_t d : shape) t->add_shape(d);
  return t;
}

// Sends a header and `data` in chunks of at most 4 MiB; returns the call's status.
grpc::Status SendSave(v1::Ckptd::Stub& stub, const v1::SaveRequest& header, const std::string& data,
                      int deadline_seconds = 60) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(deadline_seconds));
  v1::SaveResponse response;
  auto writer = stub.Save(&ctx, &response);
  bool open = writer->Write(header);
  for (size_t off = 0; open && off < data.size(); off += 4 << 20) {
    v1::SaveRequest chunk;
    chunk.set_data(data.substr(off, 4 << 20));
    open = writer->Write(chunk);
  }
  writer->WritesDone();
  return writer->Finish();
}

grpc::Status WaitFor(v1::Ckptd::Stub& stub, const std::string& run, int64_t step, int deadline_seconds = 30) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(deadline_seconds));
  v1::WaitRequest ref;
  ref.set_run(run);
  ref.set_step(step);
  v1::WaitResponse response;
  return stub.Wait(&ctx, ref, &response);
}

grpc::Status BarrierCall(v1::Ckptd::Stub& stub, const std::string& run, int64_t id, int trainer, int count) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  v1::BarrierRequest request;
  request.set_run(run);
  request.set_barrier_id(id);
  request.set_trainer_id(trainer);
  request.set_trainer_count(count);
  v1::BarrierResponse response;
  return stub.Barrier(&ctx, request, &response);
}

TEST(ContractTest, CleanSaveRestoreCycleLeavesNoWarningOrErrorInAnyLog) {
  Cluster cluster(2);
  ASSERT_TRUE(cluster.Start().ok());
  for (Transport transport : {Transport::kStream, Transport::kSharedMemory}) {
    const int64_t step = transport == Transport::kStream ? 1 : 2;
    auto results = RunTrainers(2, [&](int t) -> absl::Status {
      auto client = cluster.Connect(t);
      std::vector<float> rows(64, static_cast<float>(t + step));
      SaveOptions options;
      options.transport = transport;
      RETURN_IF_ERROR(client
                          ->Save("clean", step, t, 2,
                                 {{.name = "w",
                                   .dtype = kDtFloat,
                                   .shape = {16, 8},
                                   .box_start = {8 * t, 0},
                                   .box_length = {8, 8},
                                   .data = rows.data(),
                                   .size = 256}},
                                 options)
                          .status());
      RETURN_IF_ERROR(client->Wait("clean", step));
      std::vector<float> back(128);
      RestoreOptions restore;
      restore.transport = transport;
      return client
          ->Restore("clean", step,
                    {{.name = "w", .dtype = kDtFloat, .shape = {16, 8}, .data = back.data(), .size = 512}},
                    restore)
          .status();
    });
    for (const absl::Status& s : results) ASSERT_TRUE(s.ok()) << s;
  }
  ASSERT_EQ(cluster.Stop(), 0);
  const std::string log = ReadFile(cluster.log());
  for (const char* level : {"] [warning] ", "] [error] ", "] [critical] "}) {
    EXPECT_EQ(log.find(level), std::string::npos) << log;
  }
  EXPECT_NE(log.find("run 'clean' step 2 committed"), std::string::npos) << log;
}

TEST(ContractTest, ClientAtGrpcDefaultsRestoresTensorsLargerThanFourMiB) {
  Cluster cluster(1);
  ASSERT_TRUE(cluster.Start().ok());
  auto stub = DefaultStub(cluster, 0);
  const int64_t elements = (5 << 20) / 4 + 3;  // over 4 MiB, not a multiple of a chunk
  std::string bytes(static_cast<size_t>(elements * 4), '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 7 + i / 4096);
  v1::SaveRequest header = Header("big", 1, 0, 1);
  AddTensor(&header, "w", kDtFloat, {elements});
  ASSERT_TRUE(SendSave(*stub, header, bytes).ok());
  ASSERT_TRUE(WaitFor(*stub, "big", 1).ok());

  grpc::ClientContext ctx;
  v1::RestoreRequest request;
  request.set_run("big");
  request.set_step(1);
  request.add_tensors()->set_name("w");
  auto reader = stub->Restore(&ctx, request);
  v1::RestoreResponse message;
  std::string back(bytes.size(), '\0');
  int chunks = 0;
  while (reader->Read(&message)) {
    if (!message.has_chunk()) continue;
    const v1::RestoreChunk& chunk = message.chunk();
    ASSERT_LE(chunk.offset() + chunk.data().size(), back.size());
    back.replace(static_cast<size_t>(chunk.offset()), chunk.data().size(), chunk.data());
    ++chunks;
  }
  const grpc::Status finished = reader->Finish();
  ASSERT_TRUE(finished.ok()) << finished.error_message();
  EXPECT_GE(chunks, 2);
  EXPECT_TRUE(back == bytes);
  EXPECT_EQ(cluster.Stop(), 0);
}

// A shared-memory restore without fallback sends its header first, then RestoreReady
// naming each tensor at most once and only once its bytes are in the segment, then
// the trailer with the counters; with fallback, the header alone, after every read.
TEST(ContractTest, ASharedMemoryRestoreNamesTensorsAsTheyLandAndFallbackSendsTheHeaderAlone) {
  Cluster cluster(1);
  ASSERT_TRUE(cluster.Start().ok());
  auto stub = DefaultStub(cluster, 0);
  constexpr int kTensors = 24;  // 24 MiB: more than one RestoreReady's worth
  constexpr size_t kBytes = size_t{1} << 20;
  std::string bytes(kTensors * kBytes, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 13 + i / 4093);
  v1::SaveRequest header = Header("ready", 1, 0, 1);
  for (int t = 0; t < kTensors; ++t) AddTensor(&header, absl::StrCat("t", t), kDtFloat, {kBytes / 4});
  ASSERT_TRUE(SendSave(*stub, header, bytes).ok());
  ASSERT_TRUE(WaitFor(*stub, "ready", 1).ok());

  const size_t segment_bytes = kTensors * kBytes;
  const int fd = ::memfd_create("reply", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(segment_bytes)), 0);
  ASSERT_EQ(::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
  char* segment =
      static_cast<char*>(::mmap(nullptr, segment_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  ASSERT_NE(segment, MAP_FAILED);
  auto tensor_in_place = [&](const v1::RestoreHeader& h, int t) {
    return std::memcmp(segment + h.shared_memory_offsets(t), bytes.data() + t * kBytes, kBytes) == 0;
  };
  for (const bool fallback : {false, true}) {
    SCOPED_TRACE(fallback ? "with fallback" : "without fallback");
    std::memset(segment, 0, segment_bytes);
    grpc::ClientContext ctx;
    v1::RestoreRequest request;
    request.set_run("ready");
    request.set_latest(true);
    request.set_fallback(fallback);
    for (int t = 0; t < kTensors; ++t) request.add_tensors()->set_name(absl::StrCat("t", t));
    request.mutable_shared_memory()->set_fd(fd);
    request.mutable_shared_memory()->set_size(static_cast<int64_t>(segment_bytes));
    auto reader = stub->Restore(&ctx, request);
    std::vector<v1::RestoreResponse::PayloadCase> kinds;
    v1::RestoreResponse message, first, last;
    std::vector<int> named(kTensors, 0);
    bool each_in_place_when_named = true;
    while (reader->Read(&message)) {
      if (kinds.empty()) first = message;
      kinds.push_back(message.payload_case());
      last = message;
      if (!message.has_ready() || !first.has_header()) continue;
      for (const int32_t t : message.ready().tensor_indices()) {
        ASSERT_TRUE(t >= 0 && t < kTensors) << t;
        ++named[t];
        each_in_place_when_named = each_in_place_when_named && tensor_in_place(first.header(), t);
      }
    }
    const grpc::Status finished = reader->Finish();
    ASSERT_TRUE(finished.ok()) << finished.error_message();
    ASSERT_TRUE(first.has_header());
    for (int t = 0; t < kTensors; ++t) EXPECT_TRUE(tensor_in_place(first.header(), t)) << "tensor " << t;
    if (fallback) {
      EXPECT_EQ(kinds, std::vector<v1::RestoreResponse::PayloadCase>{v1::RestoreResponse::kHeader});
      EXPECT_GT(first.header().storage_bytes_read(), 0);
      continue;
    }
    ASSERT_GE(kinds.size(), 3u);
    EXPECT_EQ(first.header().storage_bytes_read(), 0);  // not known yet when the header went
    ASSERT_TRUE(last.has_trailer());
    EXPECT_GT(last.trailer().storage_bytes_read(), 0);
    for (size_t i = 1; i + 1 < kinds.size(); ++i) EXPECT_EQ(kinds[i], v1::RestoreResponse::kReady) << i;
    EXPECT_TRUE(each_in_place_when_named);
    EXPECT_EQ(*std::max_element(named.begin(), named.end()), 1);
    EXPECT_GE(std::count(named.begin(), named.end(), 1), 16);  // 16 MiB read: named before the end
  }
  ::munmap(segment, segment_bytes);
  ::close(fd);
  EXPECT_EQ(cluster.Stop(), 0);
}

TEST(ContractTest, MalformedAndEdgeRequestsGetTheDocumentedAnswers) {
  TempDir config_dir;
  Cluster cluster(1, "", {"--config", WriteConfig(config_dir, "limits:\n  max_tensors_per_request: 2\n")});
  ASSERT_TRUE(cluster.Start().ok());
  auto stub = DefaultStub(cluster, 0);

  // A Box that is set but empty means the whole tensor, as the proto says.
  v1::SaveRequest header = Header("edge", 1, 0, 1);
  AddTensor(&header, "whole", kDtFloat, {4})->mutable_box();
  AddTensor(&header, "c", kComplex64, {2});  // complex64 is a documented dtype
  grpc::Status saved = SendSave(*stub, header, std::string(16 + 16, '\x01'));
  ASSERT_TRUE(saved.ok()) << saved.error_message();
  ASSERT_TRUE(WaitFor(*stub, "edge", 1).ok());

  // Restore honours the per-request tensor limit that Save enforces.
  {
    grpc::ClientContext ctx;
    v1::RestoreRequest request;
    request.set_run("edge");
    request.set_latest(true);
    for (const char* name : {"whole", "c", "whole"}) request.add_tensors()->set_name(name);
    auto reader = stub->Restore(&ctx, request);
    v1::RestoreResponse ignored;
    while (reader->Read(&ignored)) {
    }
    const grpc::Status s = reader->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
    EXPECT_NE(s.error_message().find("max_tensors_per_request"), std::string::npos) << s.error_message();
  }
  // Wait on a negative step answers at once.
  const grpc::Status negative = WaitFor(*stub, "edge", -1, 600);
  EXPECT_EQ(negative.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << negative.error_message();
  // Fallback on a run that does not exist is NOT_FOUND, not DATA_LOSS.
  {
    grpc::ClientContext ctx;
    v1::RestoreRequest request;
    request.set_run("no-such-run");
    request.set_latest(true);
    request.set_fallback(true);
    request.add_tensors()->set_name("w");
    auto reader = stub->Restore(&ctx, request);
    v1::RestoreResponse ignored;
    while (reader->Read(&ignored)) {
    }
    const grpc::Status s = reader->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
  }
  // A run name that is not UTF-8 does not parse; the answer says why.
  {
    v1::SaveRequest bad = Header(std::string("r\xff\xfe", 3), 1, 0, 1);
    AddTensor(&bad, "w", kDtFloat, {1});
    const grpc::Status s = SendSave(*stub, bad, std::string(4, '\0'));
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
    EXPECT_NE(s.error_message().find("UTF-8"), std::string::npos) << s.error_message();
  }
  // The same for Restore, whose request its handler reads itself (restore_reply.h).
  {
    grpc::ClientContext ctx;
    v1::RestoreRequest request;
    request.set_run(std::string("r\xff\xfe", 3));
    request.set_latest(true);
    request.add_tensors()->set_name("w");
    auto reader = stub->Restore(&ctx, request);
    v1::RestoreResponse ignored;
    EXPECT_FALSE(reader->Read(&ignored));
    const grpc::Status s = reader->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
    EXPECT_NE(s.error_message().find("/ckptd.v1.Ckptd/Restore"), std::string::npos) << s.error_message();
    EXPECT_NE(s.error_message().find("UTF-8"), std::string::npos) << s.error_message();
  }
  // Garbage bytes to a unary method: INVALID_ARGUMENT with a message, not an empty INTERNAL.
  {
    grpc::GenericStub generic(
        grpc::CreateChannel("unix:" + cluster.Address(0), grpc::InsecureChannelCredentials()));
    const std::string garbage = "\xff\xff\xff\xff\x0f not a protobuf";
    grpc::Slice slice(garbage);
    grpc::ByteBuffer request(&slice, 1), response;
    grpc::ClientContext ctx;
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    grpc::Status status;
    generic.UnaryCall(&ctx, "/ckptd.v1.Ckptd/Status", grpc::StubOptions(), &request, &response,
                      [&](grpc::Status s) {
                        std::lock_guard<std::mutex> lock(mu);
                        status = std::move(s);
                        done = true;
                        cv.notify_one();
                      });
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done; });
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
    EXPECT_NE(status.error_message().find("/ckptd.v1.Ckptd/Status"), std::string::npos)
        << status.error_message();
  }
  // A mesh whose dimension sizes overflow 64 bits when multiplied is refused.
  {
    v1::SaveRequest overflow = Header("edge", 2, 0, 1);
    overflow.mutable_header()->set_mesh(
        "|x=4294967296,y=4294967296|0|0|/job:localhost/replica:0/task:0/device:CPU:0");
    overflow.mutable_header()->add_device_ids(0);
    const grpc::Status s = SendSave(*stub, overflow, "");
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
    EXPECT_NE(s.error_message().find("more than 2^24 devices"), std::string::npos) << s.error_message();
  }
  EXPECT_EQ(cluster.Stop(), 0);
}

grpc::Status ListTensorsCall(v1::Ckptd::Stub& stub, const v1::ListTensorsRequest& request,
                             v1::ListTensorsResponse* response) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  return stub.ListTensors(&ctx, request, response);
}

TEST(ContractTest, ListTensorsPagesThroughAStepInNameOrder) {
  Cluster cluster(1);
  ASSERT_TRUE(cluster.Start().ok());
  auto stub = DefaultStub(cluster, 0);
  // Step 1 holds five tensors; step 2, the newest, only one.
  v1::SaveRequest header = Header("pages", 1, 0, 1);
  for (const char* name : {"e", "b", "a/x", "d", "c"}) AddTensor(&header, name, kDtFloat, {2, 3});
  ASSERT_TRUE(SendSave(*stub, header, std::string(5 * 24, '\x02')).ok());
  ASSERT_TRUE(WaitFor(*stub, "pages", 1).ok());
  v1::SaveRequest newer = Header("pages", 2, 0, 1);
  AddTensor(&newer, "only", kInt64, {});
  ASSERT_TRUE(SendSave(*stub, newer, std::string(8, '\x03')).ok());
  ASSERT_TRUE(WaitFor(*stub, "pages", 2).ok());

  v1::ListTensorsRequest request;
  request.set_run("pages");
  request.set_step(1);
  request.set_page_size(2);
  std::vector<std::vector<std::string>> pages;
  for (int guard = 0; guard < 10; ++guard) {
    v1::ListTensorsResponse page;
    const grpc::Status s = ListTensorsCall(*stub, request, &page);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(page.step(), 1);
    pages.emplace_back();
    for (const v1::TensorDescriptor& t : page.tensors()) {
      pages.back().push_back(t.name());
      EXPECT_EQ(t.dtype(), kDtFloat);
      EXPECT_EQ(std::vector<int64_t>(t.shape().begin(), t.shape().end()), (std::vector<int64_t>{2, 3}));
    }
    if (page.next_page_token().empty()) break;
    request.set_page_token(page.next_page_token());
  }
  EXPECT_EQ(pages, (std::vector<std::vector<std::string>>{{"a/x", "b"}, {"c", "d"}, {"e"}}));

  v1::ListTensorsRequest latest;
  latest.set_run("pages");
  latest.set_latest(true);
  v1::ListTensorsResponse newest;
  ASSERT_TRUE(ListTensorsCall(*stub, latest, &newest).ok());
  EXPECT_EQ(newest.step(), 2);
  ASSERT_EQ(newest.tensors_size(), 1);
  EXPECT_EQ(newest.tensors(0).name(), "only");
  EXPECT_EQ(newest.tensors(0).shape_size(), 0);
  EXPECT_TRUE(newest.next_page_token().empty());

  v1::ListTensorsResponse ignored;
  v1::ListTensorsRequest bad = latest;
  bad.set_page_size(10001);
  grpc::Status s = ListTensorsCall(*stub, bad, &ignored);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_NE(s.error_message().find("page_size"), std::string::npos) << s.error_message();
  bad = latest;
  bad.set_run("../escape");
  EXPECT_EQ(ListTensorsCall(*stub, bad, &ignored).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  bad = request;
  bad.set_step(7);
  s = ListTensorsCall(*stub, bad, &ignored);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
  bad.set_run("never-saved");
  bad.set_latest(true);
  EXPECT_EQ(ListTensorsCall(*stub, bad, &ignored).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(cluster.Stop(), 0);
}

TEST(ContractTest, BarrierCompletesOnlyWhenEachTrainerIdArrivedOnce) {
  Cluster cluster(2, "", {"--commit-timeout", "2s"});
  ASSERT_TRUE(cluster.Start().ok());
  auto stub0 = DefaultStub(cluster, 0), stub1 = DefaultStub(cluster, 1);
  // Two calls as trainer 0 of a 2-trainer barrier: trainer 1 never came.
  std::vector<grpc::Status> dup(2);
  {
    std::thread a([&] { dup[0] = BarrierCall(*stub0, "b", 1, 0, 2); });
    std::thread b([&] { dup[1] = BarrierCall(*stub1, "b", 1, 0, 2); });
    a.join();
    b.join();
  }
  for (const grpc::Status& s : dup) {
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
    EXPECT_NE(s.error_message().find("trainer id(s) 0 arrived more than once"), std::string::npos)
        << s.error_message();
  }
  // Trainers that disagree on the count fail together, at once.
  std::vector<grpc::Status> disagree(2);
  {
    std::thread a([&] { disagree[0] = BarrierCall(*stub0, "b", 2, 0, 2); });
    std::thread b([&] { disagree[1] = BarrierCall(*stub1, "b", 2, 1, 3); });
    a.join();
    b.join();
  }
  for (const grpc::Status& s : disagree) {
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
    EXPECT_NE(s.error_message().find("disagree on trainer_count (2 vs 3)"), std::string::npos)
        << s.error_message();
  }
  // A missing trainer: the server's deadline ends the barrier and names it.
  const grpc::Status alone = BarrierCall(*stub0, "b", 3, 1, 3);
  EXPECT_EQ(alone.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << alone.error_message();
  EXPECT_NE(alone.error_message().find("missing trainer(s) 0,2"), std::string::npos) << alone.error_message();
  // And the real thing completes.
  std::vector<grpc::Status> ok(2);
  {
    std::thread a([&] { ok[0] = BarrierCall(*stub0, "b", 4, 0, 2); });
    std::thread b([&] { ok[1] = BarrierCall(*stub1, "b", 4, 1, 2); });
    a.join();
    b.join();
  }
  for (const grpc::Status& s : ok) EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(cluster.Stop(), 0);
}

TEST(ContractTest, ErrorsStayDeliverableAtTheTrainerLimit) {
  TempDir config_dir;
  Cluster cluster(
      1, "",
      {"--config", WriteConfig(config_dir, "limits:\n  max_trainers: 2048\n"), "--commit-timeout", "1s"});
  ASSERT_TRUE(cluster.Start().ok());
  auto stub = DefaultStub(cluster, 0);
  // 2047 of 2048 trainers never come: the message names a few and counts the rest.
  v1::SaveRequest header = Header("many", 1, 0, 2048);
  AddTensor(&header, "w", kDtFloat, {2048})->mutable_box()->add_start(0);
  header.mutable_header()->mutable_tensors(0)->mutable_box()->add_length(1);
  ASSERT_TRUE(SendSave(*stub, header, std::string(4, '\0')).ok());
  const grpc::Status waited = WaitFor(*stub, "many", 1);
  EXPECT_EQ(waited.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << waited.error_message();
  EXPECT_NE(waited.error_message().find("missing trainer(s) 1,2,3,4,5,6,7,8 and 2039 more"),
            std::string::npos)
      << waited.error_message();
  EXPECT_LT(waited.error_message().size(), 1024u);
  // The same at a barrier.
  const grpc::Status barrier = BarrierCall(*stub, "many", 1, 0, 2048);
  EXPECT_EQ(barrier.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << barrier.error_message();
  EXPECT_LT(barrier.error_message().size(), 1024u);
  // The connection still serves other calls.
  {
    grpc::ClientContext ctx;
    v1::StatusResponse status;
    EXPECT_TRUE(stub->Status(&ctx, v1::StatusRequest(), &status).ok());
  }
  // One past the limit is refused up front, for Save and Barrier alike.
  v1::SaveRequest over = Header("many", 2, 0, 2049);
  AddTensor(&over, "w", kDtFloat, {1});
  const grpc::Status refused = SendSave(*stub, over, std::string(4, '\0'));
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << refused.error_message();
  EXPECT_NE(refused.error_message().find("limits.max_trainers (2048)"), std::string::npos)
      << refused.error_message();
  EXPECT_EQ(BarrierCall(*stub, "many", 2, 0, 2049).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(cluster.Stop(), 0);
}

}  // namespace
}  // namespace ckptd::testing
