// The client's fallback from shared memory to the gRPC stream (Transport::kAuto),
// against a stand-in daemon on a unix socket that refuses every shared-memory
// request the way a daemon that cannot map the trainer's segments does. The client
// sends one request object twice (no copy of a request of many tensors), so the
// second try must carry none of the first try's shared-memory fields.
#include <grpcpp/grpcpp.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ckptd/client.h"
#include "ckptd/v1/ckptd.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/common/temp_dir.h"

namespace ckptd {
namespace {

constexpr char kCannotMap[] = "shared_memory: only for trainers on the daemon's unix socket";

// Keeps what each Save and Restore asked for; answers a streamed Save with the bytes
// it received and a streamed Restore with `restore_bytes_` for every tensor.
class RefusesSharedMemory final : public v1::Ckptd::Service {
 public:
  explicit RefusesSharedMemory(std::string restore_bytes) : restore_bytes_(std::move(restore_bytes)) {}

  grpc::Status Save(grpc::ServerContext*, grpc::ServerReader<v1::SaveRequest>* reader,
                    v1::SaveResponse* response) override {
    v1::SaveRequest message;
    if (!reader->Read(&message) || !message.has_header()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no header");
    }
    std::lock_guard<std::mutex> lock(mu_);
    save_headers_.push_back(message.header());
    if (message.header().has_shared_memory())
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, kCannotMap);
    std::string data;
    while (reader->Read(&message)) data += message.data();
    saved_bytes_ = data;
    response->set_bytes_staged(static_cast<int64_t>(data.size()));
    return grpc::Status::OK;
  }

  grpc::Status Restore(grpc::ServerContext*, const v1::RestoreRequest* request,
                       grpc::ServerWriter<v1::RestoreResponse>* writer) override {
    std::lock_guard<std::mutex> lock(mu_);
    restore_requests_.push_back(*request);
    bool wants_shared_memory = request->has_shared_memory();
    for (const v1::TensorRequest& t : request->tensors()) wants_shared_memory |= t.has_host_memory();
    if (wants_shared_memory) return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, kCannotMap);
    v1::RestoreResponse header;
    header.mutable_header()->set_step(request->step());
    writer->Write(header);
    for (int i = 0; i < request->tensors_size(); ++i) {
      v1::RestoreResponse chunk;
      chunk.mutable_chunk()->set_tensor_index(i);
      chunk.mutable_chunk()->set_data(restore_bytes_);
      writer->Write(chunk);
    }
    return grpc::Status::OK;
  }

  std::mutex mu_;
  std::vector<v1::SaveHeader> save_headers_;
  std::string saved_bytes_;
  std::vector<v1::RestoreRequest> restore_requests_;

 private:
  const std::string restore_bytes_;
};

class ClientFallbackTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("unix:" + dir_.Sub("sock"), grpc::InsecureServerCredentials());
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    auto client = Client::Connect(dir_.Sub("sock"), absl::Seconds(10));
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = std::move(*client);
  }
  void TearDown() override {
    client_.reset();
    if (server_ != nullptr) server_->Shutdown();
  }

  testing::TempDir dir_;
  RefusesSharedMemory service_{"restored"};
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<Client> client_;
};

TEST_F(ClientFallbackTest, ASaveRefusedSharedMemoryIsStreamedWithoutItsSegment) {
  const std::string bytes = "eight by";
  auto saved = client_->Save(
      "run", 3, 0, 1, {{.name = "w", .dtype = kDtUint8, .shape = {8}, .data = bytes.data(), .size = 8}});
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_FALSE(saved->shared_memory);
  std::lock_guard<std::mutex> lock(service_.mu_);
  ASSERT_EQ(service_.save_headers_.size(), 2u);
  EXPECT_TRUE(service_.save_headers_[0].has_shared_memory());
  EXPECT_FALSE(service_.save_headers_[1].has_shared_memory());
  ASSERT_EQ(service_.save_headers_[1].tensors_size(), 1);
  EXPECT_EQ(service_.save_headers_[1].tensors(0).name(), "w");
  EXPECT_EQ(service_.saved_bytes_, bytes);
}

TEST_F(ClientFallbackTest, ARestoreRefusedSharedMemoryIsStreamedWithoutItsSegments) {
  auto buffer = HostBuffer::Allocate(4096);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  std::string into(8, '\0');
  // One plain target (a reply segment) and one inside a HostBuffer (host_memory).
  auto step = client_->Restore(
      "run", 3,
      {{.name = "w", .dtype = 0, .data = into.data(), .size = 8},
       {.name = "h", .dtype = 0, .data = (*buffer)->data(), .size = 8, .host_buffer = buffer->get()}});
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, 3);
  EXPECT_EQ(into, "restored");
  EXPECT_EQ(std::string((*buffer)->data(), 8), "restored");
  std::lock_guard<std::mutex> lock(service_.mu_);
  ASSERT_EQ(service_.restore_requests_.size(), 2u);
  const v1::RestoreRequest& first = service_.restore_requests_[0];
  EXPECT_TRUE(first.has_shared_memory());
  EXPECT_TRUE(first.tensors(1).has_host_memory());
  const v1::RestoreRequest& second = service_.restore_requests_[1];
  EXPECT_FALSE(second.has_shared_memory());
  ASSERT_EQ(second.tensors_size(), 2);
  EXPECT_FALSE(second.tensors(0).has_host_memory());
  EXPECT_FALSE(second.tensors(1).has_host_memory());
  EXPECT_EQ(second.tensors(1).name(), "h");
}

}  // namespace
}  // namespace ckptd
