// The peer channel the daemons make without tcp.address: the job's in-memory CA, the
// certificates it issues, who a listener with them lets in, and where it listens.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "daemon/peer/credentials.h"
#include "daemon/peer/job_credentials.h"
#include "daemon/peer/peer.h"
#include "daemon/peer/peer_address.h"
#include "tests/common/temp_dir.h"
#include "tests/integration/cluster.h"

namespace ckptd {
namespace {

struct Member {
  PeerKey key;
  std::string certificate;
};

Member Certify(const JobCertificateAuthority& ca, int rank) {
  absl::StatusOr<PeerKey> key = NewPeerKey();
  EXPECT_TRUE(key.ok()) << key.status();
  absl::StatusOr<std::string> certificate = ca.Issue(key->public_pem, rank, "host" + std::to_string(rank));
  EXPECT_TRUE(certificate.ok()) << certificate.status();
  return {*key, *certificate};
}

TEST(JobCertificatesTest, TheCaCertifiesEachRanksOwnKeyAndNothingElse) {
  absl::StatusOr<JobCertificateAuthority> ca = JobCertificateAuthority::Create("test", absl::Hours(1));
  ASSERT_TRUE(ca.ok()) << ca.status();
  const Member rank1 = Certify(*ca, 1);
  EXPECT_EQ(rank1.key.private_pem.find("-----BEGIN PRIVATE KEY-----"), 0u);
  EXPECT_EQ(rank1.certificate.find("-----BEGIN CERTIFICATE-----"), 0u);
  // The certificate carries the public key only: the private key is not in it.
  EXPECT_EQ(rank1.certificate.find(rank1.key.private_pem), std::string::npos);
  EXPECT_TRUE(CheckJobCertificate(rank1.certificate, ca->certificate_pem()).ok());
  // Another job's CA (another start) does not accept it, nor its own CA a certificate of another job.
  absl::StatusOr<JobCertificateAuthority> other = JobCertificateAuthority::Create("other", absl::Hours(1));
  ASSERT_TRUE(other.ok()) << other.status();
  const absl::Status foreign = CheckJobCertificate(rank1.certificate, other->certificate_pem());
  EXPECT_EQ(foreign.code(), absl::StatusCode::kUnauthenticated) << foreign;
  EXPECT_EQ(CheckJobCertificate(Certify(*other, 0).certificate, ca->certificate_pem()).code(),
            absl::StatusCode::kUnauthenticated);
  // The CA's own certificate is not a member's.
  EXPECT_FALSE(CheckJobCertificate(ca->certificate_pem(), ca->certificate_pem()).ok());
  EXPECT_EQ(ca->Issue("not a key", 3, "h").status().code(), absl::StatusCode::kInvalidArgument);
}

// A listener with the job's certificates (as a daemon starts it) serving the peer
// service; calls presenting various client credentials.
class JobListenerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<JobCertificateAuthority> ca = JobCertificateAuthority::Create("test", absl::Hours(1));
    ASSERT_TRUE(ca.ok()) << ca.status();
    ca_pem_ = ca->certificate_pem();
    server_member_ = Certify(*ca, 0);
    client_member_ = Certify(*ca, 1);
    grpc::ServerBuilder builder;
    builder.AddListeningPort(
        "127.0.0.1:0",
        MutualTlsCredentials(TlsPem{server_member_.certificate, server_member_.key.private_pem, ca_pem_}),
        &port_);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_NE(port_, 0);
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
  }

  // ReadRange through a channel with `credentials`, checking the server as `name`.
  grpc::Status Call(const std::shared_ptr<grpc::ChannelCredentials>& credentials, const std::string& name) {
    grpc::ChannelArguments args;
    args.SetSslTargetNameOverride(name);
    auto stub = internal::Peer::NewStub(
        grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(port_), credentials, args));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    internal::ReadRangeRequest request;
    request.set_run("r");
    auto reader = stub->ReadRange(&ctx, request);
    internal::ReadRangeChunk chunk;
    while (reader->Read(&chunk)) {
    }
    return reader->Finish();
  }

  static std::shared_ptr<grpc::ChannelCredentials> Credentials(const std::string& ca, const Member* member) {
    grpc::SslCredentialsOptions options;
    options.pem_root_certs = ca;
    if (member != nullptr) {
      options.pem_private_key = member->key.private_pem;
      options.pem_cert_chain = member->certificate;
    }
    return grpc::SslCredentials(options);
  }

  std::string ca_pem_;
  Member server_member_, client_member_;
  PeerDirectory directory_;  // never Set: no token matches
  PeerService service_{&directory_, nullptr, nullptr};
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

TEST_F(JobListenerTest, AMemberOfTheJobGetsThroughTheHandshake) {
  // Past TLS, to the service's own check of the job token.
  const grpc::Status s = Call(Credentials(ca_pem_, &client_member_), kJobPeerName);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
}

TEST_F(JobListenerTest, AClientWithoutTheJobsCertificateIsRefusedInTheHandshake) {
  // No client certificate at all.
  grpc::Status s = Call(Credentials(ca_pem_, nullptr), kJobPeerName);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  // A certificate of another job's CA (with the right name).
  absl::StatusOr<JobCertificateAuthority> other = JobCertificateAuthority::Create("other", absl::Hours(1));
  ASSERT_TRUE(other.ok()) << other.status();
  const Member stranger = Certify(*other, 1);
  s = Call(Credentials(ca_pem_, &stranger), kJobPeerName);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
}

// tests/multihost/tls_probe.py, which the multi-host test sends at a daemon's peer port
// from outside the job: against this listener it must tell a member from a stranger.
TEST_F(JobListenerTest, TheTlsProbeIsAcceptedWithTheJobsCertificateOnly) {
  testing::TempDir dir;
  ASSERT_TRUE(PosixFileSystem()->WriteFileAtomically(dir.Sub("m.crt"), client_member_.certificate).ok());
  ASSERT_TRUE(PosixFileSystem()->WriteFileAtomically(dir.Sub("m.key"), client_member_.key.private_pem).ok());
  auto probe = [&](const std::string& args) {
    std::string out;
    testing::RunCommand(absl::StrCat("/usr/bin/python3 ", CKPTD_SOURCE_DIR,
                                     "/tests/multihost/tls_probe.py 127.0.0.1 ", port_, args),
                        &out);
    return out;
  };
  std::string out = probe(absl::StrCat(" ", dir.Sub("m.crt"), " ", dir.Sub("m.key")));
  EXPECT_EQ(out.rfind("ACCEPTED", 0), 0u) << out;
  out = probe("");
  EXPECT_EQ(out.rfind("REFUSED", 0), 0u) << out;
}

TEST_F(JobListenerTest, AMemberChecksTheServersNameAgainstTheJobName) {
  const grpc::Status s = Call(Credentials(ca_pem_, &client_member_), "host0");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
}

const std::vector<InterfaceAddress> kInterfaces = {
    {"lo", "127.0.0.1", true}, {"eth0", "192.0.2.2", false}, {"ib0", "10.1.4.7", false}};

TEST(ChoosePeerHostTest, PeerInterfaceByNameOrNetworkComesFirst) {
  auto by_name = ChoosePeerHost("ib0", false, kInterfaces, {{"OMPI_MCA_btl_tcp_if_include", "eth0"}}, {});
  ASSERT_TRUE(by_name.ok()) << by_name.status();
  EXPECT_EQ(by_name->address, "10.1.4.7");
  auto by_network = ChoosePeerHost("192.0.2.0/24", true, kInterfaces, {}, {});
  ASSERT_TRUE(by_network.ok()) << by_network.status();
  EXPECT_EQ(by_network->address, "192.0.2.2");
  auto missing = ChoosePeerHost("eth7", false, kInterfaces, {}, {});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(missing.status().message().find("eth0 192.0.2.2"), absl::string_view::npos) << missing.status();
}

TEST(ChoosePeerHostTest, OpenMpisInterfaceThenOneHostThenTheHostNameThenTheFirstInterface) {
  auto mpi = ChoosePeerHost("", true, kInterfaces, {{"OMPI_MCA_btl_tcp_if_include", "eth5,10.1.0.0/16"}}, {});
  ASSERT_TRUE(mpi.ok()) << mpi.status();
  EXPECT_EQ(mpi->address, "10.1.4.7");
  EXPECT_NE(mpi->reason.find("OMPI_MCA_btl_tcp_if_include"), std::string::npos) << mpi->reason;
  EXPECT_EQ(ChoosePeerHost("", true, kInterfaces, {}, {"10.1.4.7"})->address, "127.0.0.1");
  EXPECT_EQ(ChoosePeerHost("", false, kInterfaces, {}, {"127.0.1.1", "10.1.4.7"})->address, "10.1.4.7");
  // A name that resolves to loopback (Debian's 127.0.1.1) or elsewhere is passed over.
  EXPECT_EQ(ChoosePeerHost("", false, kInterfaces, {}, {"127.0.1.1", "203.0.113.9"})->address, "192.0.2.2");
  auto loopback_only = ChoosePeerHost("", false, {kInterfaces[0]}, {}, {});
  EXPECT_EQ(loopback_only.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(InterfaceMatches("10.1.0.0/33", kInterfaces[2]));
  EXPECT_TRUE(InterfaceMatches("0.0.0.0/0", kInterfaces[2]));
}

}  // namespace
}  // namespace ckptd
