// Many hosts: daemons on simulated hosts (tests/multihost/hosts.sh: network, UTS and
// mount namespaces, Open MPI over TCP between them), with one shared root or each
// host's own disk. Needs root; skipped with the reason otherwise.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "ckptd/v1/ckptd.grpc.pb.h"
#include "daemon/base/status.h"
#include "daemon/bundle/crc32c.h"
#include "daemon/io/file_system.h"
#include "tests/integration/cluster.h"

namespace ckptd::testing {
namespace {

struct Mode {
  int hosts;
  bool local;
};

std::string ModeName(const ::testing::TestParamInfo<Mode>& info) {
  return absl::StrCat(info.param.hosts, "Hosts", info.param.local ? "Local" : "Shared");
}

// Rows [8t, 8t+8) of an {8n, 16} float tensor: trainer t's shard; values name their
// (row, column) so any misplaced byte shows.
std::vector<float> Rows(int trainer, int64_t step) {
  std::vector<float> rows(8 * 16);
  for (int r = 0; r < 8; ++r) {
    for (int c = 0; c < 16; ++c)
      rows[r * 16 + c] = static_cast<float>(step * 100000 + (8 * trainer + r) * 16 + c);
  }
  return rows;
}

// Starts the cluster: "" when it is up, else why, with the end of the daemons' log
// (their temp directory is gone by the time anyone reads the test's output).
std::string StartProblem(Cluster& cluster) {
  const absl::Status s = cluster.Start();
  if (s.ok()) return "";
  const std::string log = PosixFileSystem()->ReadFileToString(cluster.log(), 1 << 24).value_or("");
  return absl::StrCat(s.ToString(), "\n...", log.substr(log.size() > 4096 ? log.size() - 4096 : 0));
}

absl::Status SaveStep(const Cluster& cluster, int trainers, int64_t step, const std::string& run = "mh") {
  auto results = RunTrainers(trainers, [&](int t) -> absl::Status {
    auto client = cluster.Connect(t);
    if (client == nullptr) return absl::UnavailableError(absl::StrCat("no daemon for trainer ", t));
    const std::vector<float> rows = Rows(t, step);
    const int64_t count = step;
    RETURN_IF_ERROR(client
                        ->Save(run, step, t, trainers,
                               {{.name = "w",
                                 .dtype = kDtFloat,
                                 .shape = {8 * trainers, 16},
                                 .box_start = {8 * t, 0},
                                 .box_length = {8, 16},
                                 .data = rows.data(),
                                 .size = rows.size() * 4},
                                {.name = "count", .dtype = kDtInt64, .data = &count, .size = 8}})
                        .status());
    return client->Wait(run, step);
  });
  for (const absl::Status& s : results) {
    RETURN_IF_ERROR(s);
  }
  return absl::OkStatus();
}

// Every daemon of the job restores the whole of "w" of `step` (saved by one trainer per
// host), bit-exact.
void ExpectEveryDaemonRestoresEveryRow(const Cluster& cluster, int hosts, int64_t step) {
  for (int rank = 0; rank < hosts; ++rank) {
    std::vector<float> all(static_cast<size_t>(8 * hosts * 16));
    auto restored = cluster.Connect(rank)->Restore(
        "mh", step, {{.name = "w", .dtype = kDtFloat, .data = all.data(), .size = all.size() * 4}});
    ASSERT_TRUE(restored.ok()) << "rank " << rank << ": " << restored.status();
    for (int t = 0; t < hosts; ++t) {
      EXPECT_EQ(std::vector<float>(all.begin() + t * 128, all.begin() + (t + 1) * 128), Rows(t, step))
          << "rank " << rank << ", trainer " << t;
    }
  }
}

class MultiHostTest : public ::testing::TestWithParam<Mode> {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "simulated hosts need root (network and mount namespaces)";
  }
};

TEST_P(MultiHostTest, StepCommitsOnEveryHostWithEachHostsShardWhereItBelongs) {
  const Mode mode = GetParam();
  Cluster cluster(mode.hosts, SimulatedHosts{.hosts = mode.hosts, .local_storage = mode.local});
  ASSERT_EQ(StartProblem(cluster), "");
  ASSERT_TRUE(SaveStep(cluster, mode.hosts, 1).ok());
  FileSystem* fs = PosixFileSystem();
  for (int host = 0; host < mode.hosts; ++host) {
    const std::string step_dir = JoinPath(cluster.HostRoot(host), "mh/step-00000001");
    EXPECT_TRUE(fs->Exists(JoinPath(step_dir, "ckpt.index"))) << step_dir;
    EXPECT_TRUE(fs->Exists(JoinPath(step_dir, "ckptd.json"))) << step_dir;
    EXPECT_TRUE(fs->Exists(JoinPath(cluster.HostRoot(host), "mh/checkpoint"))) << host;
    for (int rank = 0; rank < mode.hosts; ++rank) {
      const std::string data =
          JoinPath(step_dir, absl::StrFormat("ckpt.data-%05d-of-%05d", rank, mode.hosts));
      // A host's disk holds its own shard only; a shared root holds every shard.
      EXPECT_EQ(fs->Exists(data), !mode.local || rank == host) << data;
    }
    // Every daemon lists the step as committed.
    auto listed = cluster.Connect(host)->ListCheckpoints("mh");
    ASSERT_TRUE(listed.ok()) << listed.status();
    ASSERT_EQ(listed->checkpoints_size(), 1);
    EXPECT_EQ(listed->checkpoints(0).step(), 1);
  }
  // The merged index on every host is the same file.
  const std::string index0 =
      fs->ReadFileToString(JoinPath(cluster.HostRoot(0), "mh/step-00000001/ckpt.index"), 1 << 20)
          .value_or("");
  for (int host = 1; host < mode.hosts; ++host) {
    EXPECT_EQ(fs->ReadFileToString(JoinPath(cluster.HostRoot(host), "mh/step-00000001/ckpt.index"), 1 << 20)
                  .value_or("?"),
              index0);
  }
  // ckptctl on one host's directory: checks what is there and says who holds the rest.
  const std::string host1_step = JoinPath(cluster.HostRoot(1), "mh/step-00000001");
  std::string out;
  ASSERT_EQ(RunCommand(absl::StrCat(CKPTCTL_BINARY, " verify --json ", host1_step), &out), 0) << out;
  const nlohmann::json verified = nlohmann::json::parse(out.substr(out.find('{')));
  EXPECT_EQ(verified["ok"], true);
  EXPECT_EQ(verified["complete"], !mode.local);
  EXPECT_GT(verified["entries"].get<int>(), 0);
  if (mode.local) {
    std::vector<std::string> elsewhere = {"rank 0 (host0)"};
    if (mode.hosts == 3) elsewhere.push_back("rank 2 (host2)");
    EXPECT_EQ(verified["shards_elsewhere"], elsewhere);
    TempDir exported;
    EXPECT_EQ(
        RunCommand(absl::StrCat(CKPTCTL_BINARY, " export ", host1_step, " --out ", exported.Sub("x")), &out),
        2);
    EXPECT_NE(out.find("holds the shard of rank 1 of this checkpoint only (saved with storage: local)"),
              std::string::npos)
        << out;
  }
  // Every daemon restores the whole tensor: on local disks the other hosts' shards
  // come through their daemons (the job's own peer channel: nothing but --storage
  // local is configured).
  ExpectEveryDaemonRestoresEveryRow(cluster, mode.hosts, 1);
  if (mode.local) {
    // A job of host 0 alone has no daemon to read the other hosts' shards through:
    // refused by name rather than passed off as data loss; its own rows still restore.
    ASSERT_EQ(cluster.Stop(), 0) << cluster.log();
    cluster.Resize(1);
    ASSERT_EQ(StartProblem(cluster), "");
    std::vector<float> all(static_cast<size_t>(8 * mode.hosts * 16));
    auto restored = cluster.Connect(0)->Restore(
        "mh", std::nullopt, {{.name = "w", .dtype = kDtFloat, .data = all.data(), .size = all.size() * 4}});
    EXPECT_EQ(restored.status().code(), absl::StatusCode::kFailedPrecondition) << restored.status();
    EXPECT_NE(restored.status().message().find("rank(s) 1 (host1)"), absl::string_view::npos)
        << restored.status();
    std::vector<float> mine(8 * 16);
    restored = cluster.Connect(0)->Restore("mh", 1,
                                           {{.name = "w",
                                             .dtype = kDtFloat,
                                             .box_start = {0, 0},
                                             .box_length = {8, 16},
                                             .data = mine.data(),
                                             .size = mine.size() * 4}});
    ASSERT_TRUE(restored.ok()) << restored.status();
    EXPECT_EQ(mine, Rows(0, 1));
  }
  EXPECT_EQ(cluster.Stop(), 0) << cluster.log();
}

TEST_P(MultiHostTest, KilledRankFailsThePendingStepAndTheCommittedOneSurvivesARestart) {
  const Mode mode = GetParam();
  Cluster cluster(mode.hosts, SimulatedHosts{.hosts = mode.hosts, .local_storage = mode.local});
  ASSERT_EQ(StartProblem(cluster), "");
  ASSERT_TRUE(SaveStep(cluster, mode.hosts, 1).ok());
  // Trainer 0 stages step 2; the daemon on the last host dies before its trainer saves.
  auto client = cluster.Connect(0);
  const std::vector<float> rows = Rows(0, 2);
  ASSERT_TRUE(client
                  ->Save("mh", 2, 0, mode.hosts,
                         {{.name = "w",
                           .dtype = kDtFloat,
                           .shape = {8 * mode.hosts, 16},
                           .box_start = {0, 0},
                           .box_length = {8, 16},
                           .data = rows.data(),
                           .size = rows.size() * 4}})
                  .ok());
  const pid_t victim = cluster.Pid(mode.hosts - 1);
  ASSERT_GT(victim, 0);
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  EXPECT_NE(cluster.WaitForExit(), 0);
  client.reset();

  ASSERT_EQ(StartProblem(cluster), "");
  FileSystem* fs = PosixFileSystem();
  for (int host = 0; host < mode.hosts; ++host) {
    EXPECT_TRUE(fs->Exists(JoinPath(cluster.HostRoot(host), "mh/step-00000001/ckpt.index"))) << host;
    EXPECT_FALSE(fs->Exists(JoinPath(cluster.HostRoot(host), "mh/step-00000002"))) << host;
    auto listed = cluster.Connect(host)->ListCheckpoints("mh");
    ASSERT_TRUE(listed.ok()) << listed.status();
    ASSERT_EQ(listed->checkpoints_size(), 1);
  }
  // The restarted job commits again.
  ASSERT_TRUE(SaveStep(cluster, mode.hosts, 3).ok());
  EXPECT_EQ(cluster.Stop(), 0) << cluster.log();
}

INSTANTIATE_TEST_SUITE_P(Hosts, MultiHostTest,
                         ::testing::Values(Mode{2, false}, Mode{2, true}, Mode{3, false}, Mode{3, true}),
                         ModeName);

// A throwaway CA and one daemon certificate valid for every simulated host name (also
// presented as the client certificate when daemons read each other's shards), and a
// config with a TCP listener on every host.
std::string WriteTlsConfig(const TempDir& dir, int hosts) {
  std::string names;
  for (int h = 0; h < hosts; ++h) absl::StrAppend(&names, h == 0 ? "" : ",", "DNS:host", h);
  const std::string script = absl::StrCat(
      "set -e; cd ", dir.path(), "\n",
      "openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=ca -keyout ca.key -out ca.crt "
      "2>/dev/null\n",
      "printf 'subjectAltName=", names, "\\n' > san.ext\n",
      "openssl req -newkey rsa:2048 -nodes -subj /CN=ckptd -keyout d.key -out d.csr 2>/dev/null\n",
      "openssl x509 -req -in d.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -extfile san.ext -out "
      "d.crt "
      "2>/dev/null\n");
  std::string out;
  EXPECT_EQ(RunCommand(absl::StrCat("bash -c \"", script, "\""), &out), 0) << out;
  const std::string config = dir.Sub("peers.yaml");
  EXPECT_TRUE(PosixFileSystem()
                  ->WriteFileAtomically(
                      config, absl::StrCat("tcp:\n  address: 0.0.0.0:0\n  tls_cert: ", dir.Sub("d.crt"),
                                           "\n  tls_key: ", dir.Sub("d.key"),
                                           "\n  tls_ca: ", dir.Sub("ca.crt"), "\n"))
                  .ok());
  return config;
}

// Restores that need every host's shard: on a shared root each daemon reads them all
// itself; on local disks through its peers (with a TCP listener and mutual TLS).
class RestoreAcrossHostsTest : public ::testing::TestWithParam<Mode> {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "simulated hosts need root (network and mount namespaces)";
  }
  TempDir tls_;
};

class PeerRestoreTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "simulated hosts need root (network and mount namespaces)";
  }
  TempDir tls_;
};

TEST_P(RestoreAcrossHostsTest, EveryDaemonRestoresEveryShard) {
  const int hosts = GetParam().hosts;
  Cluster cluster(hosts, SimulatedHosts{.hosts = hosts, .local_storage = GetParam().local},
                  {"--config", WriteTlsConfig(tls_, hosts)});
  ASSERT_EQ(StartProblem(cluster), "");
  ASSERT_TRUE(SaveStep(cluster, hosts, 1).ok());
  for (int rank = 0; rank < hosts; ++rank) {
    // The whole tensor, and a box that cuts across every host's rows, as bfloat16.
    std::vector<float> all(static_cast<size_t>(8 * hosts * 16));
    std::vector<uint16_t> columns(static_cast<size_t>(8 * hosts * 4));
    int64_t count = 0;
    auto restored = cluster.Connect(rank)->Restore(
        "mh", std::nullopt,
        {{.name = "w", .dtype = kDtFloat, .data = all.data(), .size = all.size() * 4},
         {.name = "w",
          .dtype = kDtBfloat16,
          .box_start = {0, 6},
          .box_length = {8 * hosts, 4},
          .data = columns.data(),
          .size = columns.size() * 2},
         {.name = "count", .dtype = kDtInt64, .data = &count, .size = 8}});
    ASSERT_TRUE(restored.ok()) << "rank " << rank << ": " << restored.status();
    for (int t = 0; t < hosts; ++t) {
      EXPECT_EQ(std::vector<float>(all.begin() + t * 128, all.begin() + (t + 1) * 128), Rows(t, 1)) << t;
    }
    for (int row = 0; row < 8 * hosts; ++row) {
      for (int c = 0; c < 4; ++c) {
        const float want = all[static_cast<size_t>(row * 16 + 6 + c)];
        uint32_t bits = 0;
        std::memcpy(&bits, &want, 4);
        // Round to nearest even, as the daemon converts.
        const uint16_t narrowed = static_cast<uint16_t>((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);
        EXPECT_EQ(columns[static_cast<size_t>(row * 4 + c)], narrowed) << row << "," << c;
      }
    }
    EXPECT_EQ(count, 1);
  }
  // ckptctl reads the whole checkpoint through one daemon (which, on local disks, reads
  // the rest through its peers): verify checks every entry of every host, export
  // assembles every row.
  std::string out;
  const std::string address = absl::StrCat(" --address ", cluster.Address(0), " mh");
  ASSERT_EQ(RunCommand(absl::StrCat(CKPTCTL_BINARY, " verify --json", address), &out), 0) << out;
  const nlohmann::json verified = nlohmann::json::parse(out.substr(out.find('{')));
  EXPECT_EQ(verified["ok"], true);
  EXPECT_EQ(verified["complete"], true);
  EXPECT_EQ(verified["bytes"], 8 * hosts * 16 * 4 + 8);
  TempDir exported;
  ASSERT_EQ(
      RunCommand(absl::StrCat(CKPTCTL_BINARY, " export --step 1 --out ", exported.Sub("x"), address), &out),
      0)
      << out;
  const std::string npy = PosixFileSystem()->ReadFileToString(exported.Sub("x/w.npy"), 1 << 20).value_or("");
  std::vector<float> want;
  for (int t = 0; t < hosts; ++t) {
    const std::vector<float> rows = Rows(t, 1);
    want.insert(want.end(), rows.begin(), rows.end());
  }
  ASSERT_GT(npy.size(), want.size() * 4);
  EXPECT_EQ(npy.substr(npy.size() - want.size() * 4),
            std::string(reinterpret_cast<const char*>(want.data()), want.size() * 4));
  ASSERT_EQ(RunCommand(absl::StrCat(CKPTCTL_BINARY, " ls --json", address), &out), 0) << out;
  const nlohmann::json listed = nlohmann::json::parse(out.substr(out.find('[')));
  ASSERT_EQ(listed.size(), 1u) << out;
  EXPECT_EQ(listed[0]["step"], 1);
  EXPECT_EQ(listed[0]["latest"], true);
  EXPECT_GT(listed[0]["created_unix"].get<double>(), 0);
  // Every host's data counts, however the bytes are stored: the answering daemon's
  // step directory, plus the other hosts' data files on local disks.
  FileSystem* fs = PosixFileSystem();
  int64_t want_bytes = 0;
  const std::string step_dir = JoinPath(cluster.HostRoot(0), "mh/step-00000001");
  const absl::StatusOr<std::vector<std::string>> names = fs->ListDir(step_dir);
  ASSERT_TRUE(names.ok()) << names.status();
  for (const std::string& name : *names) want_bytes += fs->FileSize(JoinPath(step_dir, name)).value_or(0);
  for (int host = 1; host < hosts && GetParam().local; ++host) {
    want_bytes +=
        fs->FileSize(JoinPath(cluster.HostRoot(host),
                              absl::StrFormat("mh/step-00000001/ckpt.data-%05d-of-%05d", host, hosts)))
            .value_or(0);
  }
  EXPECT_EQ(listed[0]["bytes"].get<int64_t>(), want_bytes) << out;
  EXPECT_EQ(RunCommand(absl::StrCat(CKPTCTL_BINARY, " inspect --step 7", address), &out), 2) << out;
  EXPECT_NE(out.find("no committed step 7"), std::string::npos) << out;
  EXPECT_EQ(cluster.Stop(), 0) << cluster.log();
}

// A restore of the latest step with fallback, through a plain stub: the step it got
// and the note, or the status.
absl::StatusOr<std::pair<int64_t, std::string>> RestoreLatestWithFallback(const Cluster& cluster, int rank,
                                                                          std::vector<float>* out) {
  auto stub = v1::Ckptd::NewStub(
      grpc::CreateChannel("unix:" + cluster.Address(rank), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  v1::RestoreRequest request;
  request.set_run("mh");
  request.set_latest(true);
  request.set_fallback(true);
  request.add_tensors()->set_name("w");
  auto reader = stub->Restore(&ctx, request);
  v1::RestoreResponse message;
  std::pair<int64_t, std::string> got;
  while (reader->Read(&message)) {
    if (message.has_header()) got = {message.header().step(), message.header().note()};
    if (message.has_chunk()) {
      std::memcpy(reinterpret_cast<char*>(out->data()) + message.chunk().offset(),
                  message.chunk().data().data(), message.chunk().data().size());
    }
  }
  const grpc::Status s = reader->Finish();
  if (!s.ok()) return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
  return got;
}

TEST_P(RestoreAcrossHostsTest, DamageOnAnotherHostIsFoundAsItIsReadAndFallbackSkipsIt) {
  const int hosts = GetParam().hosts;
  Cluster cluster(hosts, SimulatedHosts{.hosts = hosts, .local_storage = GetParam().local},
                  {"--config", WriteTlsConfig(tls_, hosts)});
  ASSERT_EQ(StartProblem(cluster), "");
  ASSERT_TRUE(SaveStep(cluster, hosts, 1).ok());
  ASSERT_TRUE(SaveStep(cluster, hosts, 2).ok());
  // Flip one byte of the last host's shard of step 2 (its rows of "w").
  const std::string data =
      JoinPath(cluster.HostRoot(hosts - 1),
               absl::StrFormat("mh/step-00000002/ckpt.data-%05d-of-%05d", hosts - 1, hosts));
  std::string bytes = PosixFileSystem()->ReadFileToString(data, 1 << 20).value_or("");
  ASSERT_GT(bytes.size(), 100u);
  bytes[40] ^= 0x10;
  ASSERT_TRUE(PosixFileSystem()->WriteFileAtomically(data, bytes).ok());

  std::vector<float> all(static_cast<size_t>(8 * hosts * 16));
  auto plain = cluster.Connect(0)->Restore(
      "mh", 2, {{.name = "w", .dtype = kDtFloat, .data = all.data(), .size = all.size() * 4}});
  EXPECT_EQ(plain.status().code(), absl::StatusCode::kDataLoss) << plain.status();
  auto fallback = RestoreLatestWithFallback(cluster, 0, &all);
  ASSERT_TRUE(fallback.ok()) << fallback.status();
  EXPECT_EQ(fallback->first, 1);
  EXPECT_NE(fallback->second.find("skipped step 2"), std::string::npos) << fallback->second;
  for (int t = 0; t < hosts; ++t) {
    EXPECT_EQ(std::vector<float>(all.begin() + t * 128, all.begin() + (t + 1) * 128), Rows(t, 1)) << t;
  }
  EXPECT_EQ(cluster.Stop(), 0) << cluster.log();
}

TEST_P(PeerRestoreTest, APeerThatDoesNotAnswerIsUnavailableByNameNotAHang) {
  const int hosts = GetParam();
  // Peer reads end within the commit timeout when the trainer sets no deadline.
  Cluster cluster(hosts, SimulatedHosts{.hosts = hosts, .local_storage = true},
                  {"--config", WriteTlsConfig(tls_, hosts), "--commit-timeout", "3s"});
  ASSERT_EQ(StartProblem(cluster), "");
  ASSERT_TRUE(SaveStep(cluster, hosts, 1).ok());
  const pid_t stopped = cluster.Pid(hosts - 1);
  ASSERT_GT(stopped, 0);
  ASSERT_EQ(::kill(stopped, SIGSTOP), 0);
  std::vector<float> all(static_cast<size_t>(8 * hosts * 16));
  auto restored = cluster.Connect(0)->Restore(
      "mh", 1, {{.name = "w", .dtype = kDtFloat, .data = all.data(), .size = all.size() * 4}});
  ::kill(stopped, SIGCONT);
  EXPECT_EQ(restored.status().code(), absl::StatusCode::kUnavailable) << restored.status();
  EXPECT_NE(restored.status().message().find(absl::StrCat("rank ", hosts - 1, " (host", hosts - 1)),
            absl::string_view::npos)
      << restored.status();
  // Once it answers again, the same restore succeeds.
  restored = cluster.Connect(0)->Restore(
      "mh", 1, {{.name = "w", .dtype = kDtFloat, .data = all.data(), .size = all.size() * 4}});
  EXPECT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(cluster.Stop(), 0) << cluster.log();
}

INSTANTIATE_TEST_SUITE_P(Hosts, RestoreAcrossHostsTest,
                         ::testing::Values(Mode{2, false}, Mode{2, true}, Mode{3, false}, Mode{3, true}),
                         ModeName);

INSTANTIATE_TEST_SUITE_P(Hosts, PeerRestoreTest, ::testing::Values(2, 3),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat(info.param, "Hosts");
                         });

// With --storage local and nothing else (no tcp, no certificates), the daemons make
// their own peer channel: every host restores every shard, ckptctl reads the whole
// checkpoint through one daemon, and a process outside the job that dials a daemon's
// peer port is refused in the TLS handshake, with no certificate or with one of
// another CA (the probe's ACCEPTED for a job member is checked in unit_tests'
// JobListenerTest). Nothing of the job's keys is written to disk.
class ZeroConfigPeerTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "simulated hosts need root (network and mount namespaces)";
  }
};

// Every "peer channel on ADDRESS:PORT" the daemons logged.
std::vector<std::pair<std::string, int>> PeerChannels(const std::string& log) {
  std::vector<std::pair<std::string, int>> found;
  const std::string kSaid = "peer channel on ";
  for (size_t at = log.find(kSaid); at != std::string::npos; at = log.find(kSaid, at + 1)) {
    const size_t start = at + kSaid.size();
    const size_t colon = log.find(':', start);
    const size_t end = log.find(',', colon);
    int port = 0;
    if (colon == std::string::npos || end == std::string::npos ||
        !absl::SimpleAtoi(log.substr(colon + 1, end - colon - 1), &port))
      continue;
    found.emplace_back(log.substr(start, colon - start), port);
  }
  return found;
}

TEST_P(ZeroConfigPeerTest, LocalStorageAloneRestoresEveryShardEverywhereAndStrangersAreRefused) {
  const int hosts = GetParam();
  Cluster cluster(hosts, SimulatedHosts{.hosts = hosts, .local_storage = true});
  ASSERT_EQ(StartProblem(cluster), "");
  ASSERT_TRUE(SaveStep(cluster, hosts, 1).ok());
  ExpectEveryDaemonRestoresEveryRow(cluster, hosts, 1);
  std::string out;
  ASSERT_EQ(
      RunCommand(absl::StrCat(CKPTCTL_BINARY, " verify --json --address ", cluster.Address(hosts - 1), " mh"),
                 &out),
      0)
      << out;
  const nlohmann::json verified = nlohmann::json::parse(out.substr(out.find('{')));
  EXPECT_EQ(verified["ok"], true);
  EXPECT_EQ(verified["complete"], true);
  EXPECT_EQ(verified["bytes"], 8 * hosts * 16 * 4 + 8);

  const std::string log = PosixFileSystem()->ReadFileToString(cluster.log(), 1 << 24).value_or("");
  const std::vector<std::pair<std::string, int>> channels = PeerChannels(log);
  ASSERT_EQ(channels.size(), static_cast<size_t>(hosts)) << log;
  for (const auto& [address, port] : channels) {
    EXPECT_EQ(address.rfind("10.213.77.", 0), 0u) << address;  // the hosts' network, not loopback
  }
  // From host 0 (outside the job, inside its network) to the last host's peer port.
  TempDir stranger;
  WriteTlsConfig(stranger, hosts);  // a certificate for every host name, from another CA
  const auto& [address, port] = channels.back();
  const std::string probe =
      absl::StrCat(absl::StrJoin(cluster.EnterHost(0), " "), " /usr/bin/python3 ", CKPTD_SOURCE_DIR,
                   "/tests/multihost/tls_probe.py ", address, " ", port);
  ASSERT_EQ(RunCommand(probe, &out), 0) << out;
  EXPECT_EQ(out.rfind("REFUSED", 0), 0u) << out;
  ASSERT_EQ(RunCommand(absl::StrCat(probe, " ", stranger.Sub("d.crt"), " ", stranger.Sub("d.key")), &out), 0)
      << out;
  EXPECT_EQ(out.rfind("REFUSED", 0), 0u) << out;
  // The job's keys live in the daemons' memory only.
  ASSERT_EQ(RunCommand(absl::StrCat("grep -rl --devices=skip 'PRIVATE KEY' ", cluster.dir()), &out), 1)
      << out;
  EXPECT_EQ(cluster.Stop(), 0) << cluster.log();
}

// tcp.address on one host and not the other: neither the operator's channel nor the
// job's own would reach every daemon, so the job stops at start naming both sides.
TEST(ZeroConfigPeerStartTest, TcpOnSomeHostsOnlyStopsTheJobAtStartNamingThem) {
  if (::geteuid() != 0) GTEST_SKIP() << "simulated hosts need root (network and mount namespaces)";
  TempDir tls;
  const std::string with_tcp =
      PosixFileSystem()->ReadFileToString(WriteTlsConfig(tls, 2), 1 << 20).value_or("");
  ASSERT_FALSE(with_tcp.empty());
  Cluster cluster(2, SimulatedHosts{.hosts = 2, .local_storage = true});
  // DIR/disk is each host's own DIR/hostI: one config path, a different file per host.
  FileSystem* fs = PosixFileSystem();
  ASSERT_TRUE(fs->CreateDirs(JoinPath(cluster.dir(), "host0"), 0700).ok());
  ASSERT_TRUE(fs->CreateDirs(JoinPath(cluster.dir(), "host1"), 0700).ok());
  ASSERT_TRUE(fs->WriteFileAtomically(JoinPath(cluster.dir(), "host0/peers.yaml"), with_tcp).ok());
  ASSERT_TRUE(fs->WriteFileAtomically(JoinPath(cluster.dir(), "host1/peers.yaml"), "log_level: info\n").ok());
  cluster.AddArgs({"--config", JoinPath(cluster.dir(), "disk/peers.yaml")});
  EXPECT_FALSE(cluster.Start().ok());
  EXPECT_EQ(cluster.exit_code(), 2);
  const std::string log = PosixFileSystem()->ReadFileToString(cluster.log(), 1 << 24).value_or("");
  EXPECT_NE(log.find("tcp.address is set on host0 but not on host1"), std::string::npos) << log;
}

INSTANTIATE_TEST_SUITE_P(Hosts, ZeroConfigPeerTest, ::testing::Values(2, 3),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat(info.param, "Hosts");
                         });

// read_once: in a data-parallel restore every trainer wants the whole model; each
// data file is read from storage by one daemon and sent to the others.
class ReadOnceTest : public ::testing::TestWithParam<Mode> {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "simulated hosts need root (network and mount namespaces)";
  }
  // The TLS config plus `extra` keys, as a file of its own.
  std::string Config(const std::string& name, const std::string& extra) {
    if (tls_config_.empty()) tls_config_ = WriteTlsConfig(tls_, GetParam().hosts);
    const std::string path = tls_.Sub(name);
    const std::string text = PosixFileSystem()->ReadFileToString(tls_config_, 1 << 20).value_or("");
    EXPECT_TRUE(PosixFileSystem()->WriteFileAtomically(path, text + extra).ok());
    return path;
  }
  TempDir tls_;
  std::string tls_config_;
};

// Bytes of step 1's data files, each counted once wherever it is kept.
int64_t DataFileBytes(const Cluster& cluster) {
  std::map<std::string, int64_t> sizes;
  for (int host = 0; host < cluster.hosts(); ++host) {
    const std::string dir = JoinPath(cluster.HostRoot(host), "mh/step-00000001");
    for (const std::string& name : PosixFileSystem()->ListDir(dir).value_or(std::vector<std::string>{})) {
      if (name.rfind("ckpt.data-", 0) == 0) sizes[name] = *PosixFileSystem()->FileSize(JoinPath(dir, name));
    }
  }
  int64_t total = 0;
  for (const auto& [name, bytes] : sizes) total += bytes;
  return total;
}

// Every trainer restores the whole model at once; returns the bytes the daemons read
// from storage for it (the sum of their counters' growth).
int64_t DataParallelRestore(const Cluster& cluster, int trainers) {
  auto storage_read = [&] {
    int64_t sum = 0;
    for (int rank = 0; rank < cluster.hosts(); ++rank) {
      auto status = cluster.Connect(rank)->Status();
      EXPECT_TRUE(status.ok()) << status.status();
      if (status.ok()) sum += status->restore_storage_bytes_read();
    }
    return sum;
  };
  const int64_t before = storage_read();
  const int hosts = cluster.hosts();
  std::vector<RestoreStats> stats(static_cast<size_t>(trainers));
  auto results = RunTrainers(trainers, [&](int t) -> absl::Status {
    std::vector<float> all(static_cast<size_t>(8 * hosts * 16));
    int64_t count = 0;
    RETURN_IF_ERROR(
        cluster.Connect(t % hosts)
            ->Restore("mh", 1,
                      {{.name = "w", .dtype = kDtFloat, .data = all.data(), .size = all.size() * 4},
                       {.name = "count", .dtype = kDtInt64, .data = &count, .size = 8}},
                      {.stats = &stats[static_cast<size_t>(t)]})
            .status());
    for (int s = 0; s < hosts; ++s) {
      if (std::vector<float>(all.begin() + s * 128, all.begin() + (s + 1) * 128) != Rows(s, 1)) {
        return absl::DataLossError(absl::StrCat("trainer ", t, ": rows of shard ", s, " differ"));
      }
    }
    return count == 1 ? absl::OkStatus() : absl::DataLossError("count");
  });
  for (int t = 0; t < trainers; ++t) {
    EXPECT_TRUE(results[t].ok()) << results[t];
    EXPECT_EQ(stats[t].bytes_delivered, 8 * hosts * 16 * 4 + 8) << t;
  }
  return storage_read() - before;
}

TEST_P(ReadOnceTest, ADataParallelRestoreReadsEachStoredByteOnceAcrossTheJob) {
  const int hosts = GetParam().hosts;
  // A linger longer than the test, so that trainers need not overlap in time to share.
  Cluster cluster(hosts, SimulatedHosts{.hosts = hosts, .local_storage = GetParam().local},
                  {"--config", Config("once.yaml", "read_cache_linger: 10m\n")});
  ASSERT_EQ(StartProblem(cluster), "");
  ASSERT_TRUE(SaveStep(cluster, hosts, 1).ok());
  const int64_t stored = DataFileBytes(cluster);
  ASSERT_GT(stored, 8 * hosts * 16 * 4);
  // Two trainers per host, all wanting everything: read amplification 1.
  EXPECT_EQ(DataParallelRestore(cluster, 2 * hosts), stored);
  // Read again within the linger: nothing more from storage.
  EXPECT_EQ(DataParallelRestore(cluster, 2 * hosts), 0);
  ASSERT_EQ(cluster.Stop(), 0) << cluster.log();

  // Without read_once and the cache, every host pays for every byte it needs: each
  // host's trainers read each data file (own and peers') once per trainer.
  cluster.AddArgs({"--config", Config("each.yaml", "read_once: false\nread_cache: 0\n")});
  ASSERT_EQ(StartProblem(cluster), "");
  EXPECT_EQ(DataParallelRestore(cluster, 2 * hosts), 2 * hosts * stored);
  EXPECT_EQ(cluster.Stop(), 0) << cluster.log();
}

TEST(ReadOnceSharedRootTest, AReaderThatDoesNotAnswerIsReadAroundFromTheSharedRoot) {
  if (::geteuid() != 0) GTEST_SKIP() << "simulated hosts need root (network and mount namespaces)";
  TempDir tls;
  // Peer reads end within the commit timeout when the trainer sets no deadline.
  Cluster cluster(2, SimulatedHosts{.hosts = 2, .local_storage = false},
                  {"--config", WriteTlsConfig(tls, 2), "--commit-timeout", "3s"});
  ASSERT_EQ(StartProblem(cluster), "");
  ASSERT_TRUE(SaveStep(cluster, 2, 1).ok());
  const pid_t stopped = cluster.Pid(1);
  ASSERT_GT(stopped, 0);
  ASSERT_EQ(::kill(stopped, SIGSTOP), 0);
  std::vector<float> all(static_cast<size_t>(8 * 2 * 16));
  RestoreStats stats;
  auto restored = cluster.Connect(0)->Restore(
      "mh", 1, {{.name = "w", .dtype = kDtFloat, .data = all.data(), .size = all.size() * 4}},
      {.stats = &stats});
  ::kill(stopped, SIGCONT);
  ASSERT_TRUE(restored.ok()) << restored.status();
  for (int t = 0; t < 2; ++t) {
    EXPECT_EQ(std::vector<float>(all.begin() + t * 128, all.begin() + (t + 1) * 128), Rows(t, 1)) << t;
  }
  // Both data files came from storage here, none from the stopped daemon.
  EXPECT_EQ(stats.peer_bytes_received, 0);
  EXPECT_EQ(stats.storage_bytes_read, DataFileBytes(cluster));
  const std::string log = PosixFileSystem()->ReadFileToString(cluster.log(), 1 << 24).value_or("");
  EXPECT_NE(log.find("cannot serve rank 1's data file, reading it here"), std::string::npos) << log;
  EXPECT_EQ(cluster.Stop(), 0) << cluster.log();
}

INSTANTIATE_TEST_SUITE_P(Hosts, ReadOnceTest, ::testing::Values(Mode{2, false}, Mode{2, true}), ModeName);

// Replicas (local storage): each host's data file is also kept on the next host.
class ReplicaTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "simulated hosts need root (network and mount namespaces)";
  }
  // Daemon flags: peers over TLS, one copy of each data file.
  std::vector<std::string> OneReplica(int hosts) {
    return {"--config", WriteTlsConfig(tls_, hosts), "--replicas", "1"};
  }
  TempDir tls_;
};

std::string DataFileOf(const Cluster& cluster, int host, int shard, int64_t step = 1) {
  return JoinPath(cluster.HostRoot(host),
                  absl::StrFormat("mh/step-%08d/ckpt.data-%05d-of-%05d", step, shard, cluster.hosts()));
}

TEST_P(ReplicaTest, EachDataFileIsAlsoOnTheNextHostAndRestoresReadTheCopyWhenTheOriginalIsGone) {
  const int hosts = GetParam();
  Cluster cluster(hosts, SimulatedHosts{.hosts = hosts, .local_storage = true}, OneReplica(hosts));
  ASSERT_EQ(StartProblem(cluster), "");
  ASSERT_TRUE(SaveStep(cluster, hosts, 1).ok());
  FileSystem* fs = PosixFileSystem();
  for (int rank = 0; rank < hosts; ++rank) {
    const int partner = (rank + 1) % hosts;
    const absl::StatusOr<std::string> original =
        fs->ReadFileToString(DataFileOf(cluster, rank, rank), 1 << 20);
    ASSERT_TRUE(original.ok()) << original.status();
    EXPECT_EQ(fs->ReadFileToString(DataFileOf(cluster, partner, rank), 1 << 20).value_or("missing"),
              *original)
        << "rank " << rank << "'s copy on host " << partner;
    // No other host keeps it.
    for (int other = 0; other < hosts; ++other) {
      if (other != rank && other != partner) {
        EXPECT_FALSE(fs->Exists(DataFileOf(cluster, other, rank))) << "host " << other;
      }
    }
  }
  const nlohmann::json meta = nlohmann::json::parse(
      fs->ReadFileToString(JoinPath(cluster.HostRoot(0), "mh/step-00000001/ckptd.json"), 1 << 20)
          .value_or("{}"));
  for (int rank = 0; rank < hosts; ++rank) {
    EXPECT_EQ(meta["hosts"][rank]["copies"], nlohmann::json::array({(rank + 1) % hosts})) << meta.dump();
  }

  // Host 1 loses its own data file: every daemon still restores every row, host 1's
  // rows from the copy (on host 2, or on host 0 when there are only 2).
  ASSERT_TRUE(fs->DeleteFile(DataFileOf(cluster, 1, 1)).ok());
  ExpectEveryDaemonRestoresEveryRow(cluster, hosts, 1);
  std::string out;
  ASSERT_EQ(
      RunCommand(absl::StrCat(CKPTCTL_BINARY, " verify --json --address ", cluster.Address(0), " mh"), &out),
      0)
      << out;
  EXPECT_NE(out.find("\"ok\": true"), std::string::npos) << out;
  EXPECT_EQ(cluster.Stop(), 0) << cluster.log();
  // The daemons said which copy they read.
  const std::string log = fs->ReadFileToString(cluster.log(), 1 << 24).value_or("");
  EXPECT_NE(log.find(absl::StrCat("reading rank 1's data file from the copy on rank ", 2 % hosts)),
            std::string::npos)
      << log;
}

TEST_P(ReplicaTest, AWipedHostIsRepairedFromItsPeersAtRestartAndEveryRestoreIsBitExact) {
  const int hosts = GetParam();
  Cluster cluster(hosts, SimulatedHosts{.hosts = hosts, .local_storage = true}, OneReplica(hosts));
  ASSERT_EQ(StartProblem(cluster), "");
  ASSERT_TRUE(SaveStep(cluster, hosts, 1).ok());
  ASSERT_TRUE(SaveStep(cluster, hosts, 2).ok());
  ASSERT_EQ(cluster.Stop(), 0) << cluster.log();
  FileSystem* fs = PosixFileSystem();
  std::map<std::string, std::string> before;  // host 1's step files
  for (int64_t step : {1, 2}) {
    const std::string dir = JoinPath(cluster.HostRoot(1), absl::StrFormat("mh/step-%08d", step));
    for (const std::string& name : fs->ListDir(dir).value_or(std::vector<std::string>())) {
      before[JoinPath(dir, name)] = fs->ReadFileToString(JoinPath(dir, name), 1 << 20).value_or("");
    }
  }
  ASSERT_EQ(before.size(), 8u);  // index, ckptd.json, its own data file and rank 0's copy, twice
  // Host 1 comes back with an empty disk.
  ASSERT_TRUE(fs->DeleteRecursively(cluster.HostRoot(1)).ok());
  ASSERT_EQ(StartProblem(cluster), "");
  for (const auto& [path, contents] : before) {
    EXPECT_EQ(fs->ReadFileToString(path, 1 << 20).value_or("missing"), contents) << path;
  }
  for (int64_t step : {1, 2}) {
    SCOPED_TRACE(absl::StrCat("step ", step));
    ExpectEveryDaemonRestoresEveryRow(cluster, hosts, step);
  }
  // The next step is kept twice again, on the repaired host too.
  ASSERT_TRUE(SaveStep(cluster, hosts, 3).ok());
  EXPECT_TRUE(fs->Exists(DataFileOf(cluster, 1, 0, 3)));
  EXPECT_TRUE(fs->Exists(DataFileOf(cluster, (2 % hosts), 1, 3)));
  EXPECT_EQ(cluster.Stop(), 0) << cluster.log();
  const std::string log = fs->ReadFileToString(cluster.log(), 1 << 24).value_or("");
  EXPECT_NE(log.find("run 'mh' step 2: repaired on this host from its peers (ckpt.index, ckptd.json, "
                     "ckpt.data-00000-of-0000"),
            std::string::npos)
      << log;
}

// Starts the job, commits step 1 on every host and stops: "" or what went wrong.
std::string SaveStepOneAndStop(Cluster& cluster) {
  if (std::string problem = StartProblem(cluster); !problem.empty()) return problem;
  if (absl::Status s = SaveStep(cluster, cluster.hosts(), 1); !s.ok()) return s.ToString();
  return cluster.Stop() == 0 ? "" : absl::StrCat("the job did not stop cleanly; see ", cluster.log());
}

TEST(ReplicaLossTest, LosingMoreHostsThanReplicasIsDataLossNamingTheLostRankOnEveryHost) {
  if (::geteuid() != 0) GTEST_SKIP() << "simulated hosts need root (network and mount namespaces)";
  TempDir tls;
  Cluster cluster(3, SimulatedHosts{.hosts = 3, .local_storage = true},
                  {"--config", WriteTlsConfig(tls, 3), "--replicas", "1"});
  ASSERT_EQ(SaveStepOneAndStop(cluster), "");
  // Rank 1's data file lived on hosts 1 and 2 only.
  ASSERT_TRUE(PosixFileSystem()->DeleteRecursively(cluster.HostRoot(1)).ok());
  ASSERT_TRUE(PosixFileSystem()->DeleteRecursively(cluster.HostRoot(2)).ok());
  ASSERT_EQ(StartProblem(cluster), "");
  std::vector<float> all(8 * 3 * 16);
  // DATA_LOSS naming what is gone, from any daemon, never NOT_FOUND or wrong bytes.
  for (int rank = 0; rank < 3; ++rank) {
    for (const std::optional<int64_t> step : {std::optional<int64_t>(1), std::optional<int64_t>()}) {
      auto restored = cluster.Connect(rank)->Restore(
          "mh", step, {{.name = "w", .dtype = kDtFloat, .data = all.data(), .size = all.size() * 4}});
      EXPECT_EQ(restored.status().code(), absl::StatusCode::kDataLoss) << restored.status();
      EXPECT_NE(restored.status().message().find("run 'mh' step 1 was lost: no host holds the data files of "
                                                 "rank(s) 1 (ckpt.data-00001-of-00003) any more"),
                std::string::npos)
          << restored.status();
    }
  }
  EXPECT_FALSE(PosixFileSystem()->Exists(JoinPath(cluster.HostRoot(0), "mh/step-00000001")));
  // Saving the step again (training resumed from scratch) clears the record.
  ASSERT_TRUE(SaveStep(cluster, 3, 1).ok());
  ASSERT_TRUE(
      cluster.Connect(2)
          ->Restore("mh", 1, {{.name = "w", .dtype = kDtFloat, .data = all.data(), .size = all.size() * 4}})
          .ok());
  EXPECT_EQ(cluster.Stop(), 0) << cluster.log();
  const std::string log = PosixFileSystem()->ReadFileToString(cluster.log(), 1 << 24).value_or("");
  EXPECT_NE(log.find("run 'mh' step 1 is committed on 1 of 3 hosts"), std::string::npos) << log;
  EXPECT_NE(log.find("no host holds the data files of rank(s) 1"), std::string::npos) << log;
}

TEST_P(ReplicaTest, AFailedCopyFailsTheStepOnEveryHostAndPublishesNothing) {
  const int hosts = GetParam();
  // Host 1 keeps rank 0's copy on a disk with room for its own file only.
  Cluster cluster(hosts, SimulatedHosts{.hosts = hosts, .local_storage = true}, OneReplica(hosts));
  ASSERT_EQ(StartProblem(cluster), "");
  const std::string run_dir = JoinPath(cluster.HostRoot(1), "small");
  ASSERT_TRUE(PosixFileSystem()->CreateDir(run_dir, 0700).ok());
  std::string out;
  const std::string pid =
      PosixFileSystem()->ReadFileToString(JoinPath(cluster.dir(), "pid1"), 64).value_or("");
  ASSERT_EQ(RunCommand(absl::StrCat("nsenter -t ", pid.substr(0, pid.find_first_of(" \n")),
                                    " -m -- mount -t tmpfs -o size=1536k,mode=0700 ckptd-small ",
                                    JoinPath(cluster.dir(), "disk/root/small")),
                       &out),
            0)
      << out;
  // Each trainer's rows are 1 MiB: host 1's own file fits, the copy does not.
  constexpr int64_t kRows = 256, kCols = 1024;
  auto results = RunTrainers(hosts, [&](int t) -> absl::Status {
    auto client = cluster.Connect(t);
    std::vector<float> rows(static_cast<size_t>(kRows * kCols), static_cast<float>(t));
    RETURN_IF_ERROR(client
                        ->Save("small", 1, t, hosts,
                               {{.name = "big",
                                 .dtype = kDtFloat,
                                 .shape = {kRows * hosts, kCols},
                                 .box_start = {kRows * t, 0},
                                 .box_length = {kRows, kCols},
                                 .data = rows.data(),
                                 .size = rows.size() * 4}})
                        .status());
    return client->Wait("small", 1);
  });
  for (int t = 0; t < hosts; ++t) {
    EXPECT_EQ(results[t].code(), absl::StatusCode::kResourceExhausted)
        << "trainer " << t << ": " << results[t];
    EXPECT_NE(results[t].message().find("replica of rank 0's data file"), std::string::npos) << results[t];
    EXPECT_NE(results[t].message().find("host1"), std::string::npos) << results[t];
  }
  for (int host = 0; host < hosts; ++host) {
    auto names = PosixFileSystem()->ListDir(JoinPath(cluster.HostRoot(host), "small"));
    // Host 1's directory is seen from outside its namespace: the tmpfs is not there.
    if (host == 1) continue;
    ASSERT_TRUE(names.ok() || absl::IsNotFound(names.status())) << names.status();
    for (const std::string& name : names.value_or(std::vector<std::string>())) {
      ADD_FAILURE() << "host " << host << " kept " << name;
    }
  }
  ASSERT_EQ(RunCommand(absl::StrCat("nsenter -t ", pid.substr(0, pid.find_first_of(" \n")), " -m -- ls -A ",
                                    JoinPath(cluster.dir(), "disk/root/small")),
                       &out),
            0)
      << out;
  EXPECT_EQ(out, "") << "host 1 kept files";
  EXPECT_EQ(cluster.Stop(), 0) << cluster.log();
}

// Replicas across a change of host count: a step saved on 3 hosts restores on 2 of
// them (the third host's data file read from its copy), and with a fresh third host
// added back, every step restores on all 3 (the new host gets each step's index and
// the files ckptd.json says it keeps, and reads the rest through its peers).
// Also the replicas' copies and repairs over the peer channel the daemons make
// themselves (no tcp configured), made afresh at each start.
TEST(ReplicaResizeTest, StepsRestoreBitExactOnFewerAndThenOnMoreHosts) {
  if (::geteuid() != 0) GTEST_SKIP() << "simulated hosts need root (network and mount namespaces)";
  Cluster cluster(3, SimulatedHosts{.hosts = 3, .local_storage = true}, {"--replicas", "1"});
  ASSERT_EQ(SaveStepOneAndStop(cluster), "");
  auto restores_everywhere = [&](int hosts, int64_t step, int saving_trainers) {
    for (int rank = 0; rank < hosts; ++rank) {
      std::vector<float> all(static_cast<size_t>(8 * saving_trainers * 16));
      auto restored = cluster.Connect(rank)->Restore(
          "mh", step, {{.name = "w", .dtype = kDtFloat, .data = all.data(), .size = all.size() * 4}});
      ASSERT_TRUE(restored.ok()) << hosts << " hosts, rank " << rank << ", step " << step << ": "
                                 << restored.status();
      for (int t = 0; t < saving_trainers; ++t) {
        EXPECT_EQ(std::vector<float>(all.begin() + t * 128, all.begin() + (t + 1) * 128), Rows(t, step))
            << hosts << " hosts, rank " << rank << ", step " << step << ", trainer " << t;
      }
    }
  };

  // Host 2 is gone for good.
  cluster.Resize(2);
  ASSERT_EQ(StartProblem(cluster), "");
  restores_everywhere(2, 1, 3);
  ASSERT_TRUE(SaveStep(cluster, 2, 2).ok());
  ASSERT_EQ(cluster.Stop(), 0) << cluster.log();

  // A fresh host joins as host 2.
  ASSERT_TRUE(PosixFileSystem()->DeleteRecursively(cluster.HostRoot(2)).ok());
  cluster.Resize(3);
  ASSERT_EQ(StartProblem(cluster), "");
  restores_everywhere(3, 1, 3);
  restores_everywhere(3, 2, 2);
  // Host 2 keeps what ckptd.json gives it of step 1 (its own file, from the copy on
  // host 0, and its copy of rank 1's); of step 2, saved without it, the index only.
  EXPECT_TRUE(PosixFileSystem()->Exists(DataFileOf(cluster, 2, 2, 1)));
  EXPECT_TRUE(PosixFileSystem()->Exists(DataFileOf(cluster, 2, 1, 1)));
  EXPECT_TRUE(PosixFileSystem()->Exists(JoinPath(cluster.HostRoot(2), "mh/step-00000002/ckpt.index")));
  EXPECT_EQ(cluster.Stop(), 0) << cluster.log();
}

TEST(ReplicaPlacementTest, TooFewHostsForTheReplicasStopsTheJobAtStartNamingThem) {
  if (::geteuid() != 0) GTEST_SKIP() << "simulated hosts need root (network and mount namespaces)";
  TempDir tls;
  Cluster cluster(2, SimulatedHosts{.hosts = 2, .local_storage = true},
                  {"--config", WriteTlsConfig(tls, 2), "--replicas", "2"});
  EXPECT_FALSE(cluster.Start().ok());
  EXPECT_EQ(cluster.exit_code(), 2);
  const std::string log = PosixFileSystem()->ReadFileToString(cluster.log(), 1 << 24).value_or("");
  EXPECT_NE(log.find("replicas: 2 copies of each data file need 3 hosts"), std::string::npos) << log;
  EXPECT_NE(log.find("(host0, host1)"), std::string::npos) << log;
}

INSTANTIATE_TEST_SUITE_P(Hosts, ReplicaTest, ::testing::Values(2, 3),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat(info.param, "Hosts");
                         });

// Drain: each host copies its own data file of every committed step into one
// directory all hosts see; a job whose hosts all lost their disks restores from it.
TEST(DrainHostsTest, EveryHostDrainsItsShareAndAJobThatLostEveryDiskRestoresFromTheDrain) {
  if (::geteuid() != 0) GTEST_SKIP() << "simulated hosts need root (network and mount namespaces)";
  TempDir tls, drain;
  Cluster cluster(2, SimulatedHosts{.hosts = 2, .local_storage = true},
                  {"--config", WriteTlsConfig(tls, 2), "--drain-to", drain.Sub("drained")});
  ASSERT_EQ(StartProblem(cluster), "");
  ASSERT_TRUE(SaveStep(cluster, 2, 1).ok());
  ASSERT_TRUE(SaveStep(cluster, 2, 2).ok());
  FileSystem* fs = PosixFileSystem();
  const std::string drained_index = drain.Sub("drained/mh/step-00000002/ckpt.index");
  // The drain runs in the background: poll for its result.
  for (const absl::Time end = absl::Now() + absl::Minutes(1);
       absl::Now() < end && !fs->Exists(drained_index);) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_TRUE(fs->Exists(drained_index)) << cluster.log();
  // A complete checkpoint where it lies: offline ckptctl verifies every byte of it.
  std::string out;
  ASSERT_EQ(RunCommand(absl::StrCat(CKPTCTL_BINARY, " verify --json ", drain.Sub("drained/mh")), &out), 0)
      << out;
  EXPECT_NE(out.find("\"ok\": true"), std::string::npos) << out;
  for (int host = 0; host < 2; ++host) {
    EXPECT_EQ(
        fs->ReadFileToString(
              drain.Sub(absl::StrFormat("drained/mh/step-00000002/ckpt.data-%05d-of-00002", host)), 1 << 20)
            .value_or("missing"),
        fs->ReadFileToString(DataFileOf(cluster, host, host, 2), 1 << 20).value_or(""))
        << "host " << host;
  }
  ASSERT_EQ(cluster.Stop(), 0) << cluster.log();

  // Every host comes back with an empty disk.
  for (int host = 0; host < 2; ++host) ASSERT_TRUE(fs->DeleteRecursively(cluster.HostRoot(host)).ok());
  ASSERT_EQ(StartProblem(cluster), "");
  for (int rank = 0; rank < 2; ++rank) {
    std::vector<float> all(2 * 8 * 16);
    auto restored = cluster.Connect(rank)->Restore(
        "mh", std::nullopt, {{.name = "w", .dtype = kDtFloat, .data = all.data(), .size = all.size() * 4}});
    ASSERT_TRUE(restored.ok()) << "rank " << rank << ": " << restored.status();
    EXPECT_EQ(*restored, 2);
    for (int t = 0; t < 2; ++t) {
      EXPECT_EQ(std::vector<float>(all.begin() + t * 128, all.begin() + (t + 1) * 128), Rows(t, 2))
          << "rank " << rank << ", trainer " << t;
    }
  }
  EXPECT_EQ(cluster.Stop(), 0) << cluster.log();
  const std::string log = fs->ReadFileToString(cluster.log(), 1 << 24).value_or("");
  EXPECT_NE(log.find(absl::StrCat("restored step 2 from the drained copy in ", drain.Sub("drained"))),
            std::string::npos)
      << log;
}

TEST(DrainHostsTest, ADrainDirectoryThatIsNotSharedIsRefusedAtStartNamingTheHost) {
  if (::geteuid() != 0) GTEST_SKIP() << "simulated hosts need root (network and mount namespaces)";
  Cluster refused(2, SimulatedHosts{.hosts = 2, .local_storage = true});
  // Where each host mounts its own disk: every host sees a different directory there.
  refused.AddArgs({"--drain-to", JoinPath(refused.dir(), "disk/drain")});
  EXPECT_TRUE(absl::IsFailedPrecondition(refused.Start()));
  const std::string log = PosixFileSystem()->ReadFileToString(refused.log(), 1 << 24).value_or("");
  EXPECT_NE(log.find("does not see the drain root"), std::string::npos) << log;
}

class StorageModeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "simulated hosts need root (network and mount namespaces)";
  }
};

TEST_F(StorageModeTest, WipedDiskFailsTheStepNamingTheHostAndPublishesItNowhere) {
  Cluster cluster(2, SimulatedHosts{.hosts = 2, .local_storage = true});
  ASSERT_EQ(StartProblem(cluster), "");
  ASSERT_TRUE(SaveStep(cluster, 2, 1).ok());
  ASSERT_TRUE(PosixFileSystem()->DeleteRecursively(cluster.HostRoot(1)).ok());
  const absl::Status s = SaveStep(cluster, 2, 2);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("host1"), absl::string_view::npos) << s;
  EXPECT_FALSE(PosixFileSystem()->Exists(JoinPath(cluster.HostRoot(0), "mh/step-00000002")));
  EXPECT_FALSE(PosixFileSystem()->Exists(JoinPath(cluster.HostRoot(1), "mh/step-00000002")));
  EXPECT_EQ(cluster.Stop(), 0) << cluster.log();
}

TEST_F(StorageModeTest, AStepPublishedOnSomeHostsOnlyIsTakenBackAtStart) {
  Cluster cluster(2, SimulatedHosts{.hosts = 2, .local_storage = true});
  FileSystem* fs = PosixFileSystem();
  ASSERT_EQ(StartProblem(cluster), "");
  ASSERT_TRUE(SaveStep(cluster, 2, 1).ok());
  const std::string host1_state = JoinPath(cluster.HostRoot(1), "mh/checkpoint");
  const std::string state_at_step1 = fs->ReadFileToString(host1_state, 1 << 16).value_or("");
  ASSERT_TRUE(SaveStep(cluster, 2, 2).ok());
  ASSERT_EQ(cluster.Stop(), 0) << cluster.log();
  // As if host1 crashed before renaming its step 2 into place: the temp directory is
  // still there and its state file names step 1.
  ASSERT_TRUE(fs->Rename(JoinPath(cluster.HostRoot(1), "mh/step-00000002"),
                         JoinPath(cluster.HostRoot(1), "mh/.tmp-step-00000002"))
                  .ok());
  ASSERT_TRUE(fs->WriteFileAtomically(host1_state, state_at_step1).ok());

  ASSERT_EQ(StartProblem(cluster), "");
  for (int host = 0; host < 2; ++host) {
    auto listed = cluster.Connect(host)->ListCheckpoints("mh");
    ASSERT_TRUE(listed.ok()) << listed.status();
    ASSERT_EQ(listed->checkpoints_size(), 1) << host;
    EXPECT_EQ(listed->checkpoints(0).step(), 1);
  }
  EXPECT_FALSE(fs->Exists(JoinPath(cluster.HostRoot(0), "mh/step-00000002")));
  EXPECT_EQ(fs->ReadFileToString(JoinPath(cluster.HostRoot(0), "mh/checkpoint"), 1 << 16).value_or("?"),
            state_at_step1);
  const std::string log = fs->ReadFileToString(cluster.log(), 1 << 22).value_or("");
  EXPECT_NE(log.find("run 'mh' step 2 is committed on 1 of 2 hosts"), std::string::npos) << log;
  // Step 2 can be saved again.
  ASSERT_TRUE(SaveStep(cluster, 2, 2).ok());
  EXPECT_EQ(cluster.Stop(), 0) << cluster.log();
}

TEST_F(StorageModeTest, SharedStorageOnNodeLocalDisksIsRefusedAtStartNamingTheHost) {
  Cluster cluster(2, SimulatedHosts{.hosts = 2, .local_storage = false, .root_on_host_disks = true});
  EXPECT_FALSE(cluster.Start().ok());
  EXPECT_EQ(cluster.exit_code(), 2);
  const std::string log = PosixFileSystem()->ReadFileToString(cluster.log(), 1 << 20).value_or("");
  EXPECT_NE(log.find("rank 0 on host host0 does not see the checkpoint root"), std::string::npos) << log;
  EXPECT_NE(log.find("that rank(s) 1 (on host1) wrote to"), std::string::npos) << log;
  EXPECT_NE(log.find("storage: local"), std::string::npos) << log;
}

TEST_F(StorageModeTest, LocalStorageNeedsARootPerDaemon) {
  Cluster shared_root(2, "", {"--storage", "local"});
  EXPECT_FALSE(shared_root.Start().ok());
  EXPECT_EQ(shared_root.exit_code(), 2);
  std::string log = PosixFileSystem()->ReadFileToString(shared_root.log(), 1 << 20).value_or("");
  EXPECT_NE(log.find("shares its checkpoint root"), std::string::npos) << log;

  TempDir roots;
  Cluster per_rank(2, roots.Sub("root-{rank}"), {"--storage", "local"});
  ASSERT_TRUE(per_rank.Start().ok()) << per_rank.log();
  ASSERT_TRUE(SaveStep(per_rank, 2, 1).ok());
  EXPECT_TRUE(PosixFileSystem()->Exists(roots.Sub("root-0/mh/step-00000001/ckpt.data-00000-of-00002")));
  EXPECT_TRUE(PosixFileSystem()->Exists(roots.Sub("root-1/mh/step-00000001/ckpt.data-00001-of-00002")));
  EXPECT_FALSE(PosixFileSystem()->Exists(roots.Sub("root-0/mh/step-00000001/ckpt.data-00001-of-00002")));
  EXPECT_EQ(per_rank.Stop(), 0) << per_rank.log();
}

// Parity (redundancy: parity): groups of hosts keep Reed-Solomon parity of their data
// files, so a step survives up to P lost hosts per group at P/(G-P) of the space.
struct ParityMode {
  int hosts;
  int group;
  int parity;
};

std::string ParityModeName(const ::testing::TestParamInfo<ParityMode>& info) {
  return absl::StrCat(info.param.hosts, "HostsG", info.param.group, "P", info.param.parity);
}

// Trainer t's part of a parity step: rows [64t, 64t+64) of "big" ({64n, 1024} floats)
// and its own "extra<t>" of (t + 1) * 20000 floats, so that the hosts' data files
// differ in size and span several segments. Values are exact in float and name the
// step, the trainer and the place.
std::vector<float> BigRows(int trainer, int64_t step) {
  std::vector<float> rows(64 * 1024);
  for (size_t i = 0; i < rows.size(); ++i)
    rows[i] = static_cast<float>((step * 7919 + trainer * 104729 + i) % 16777213);
  return rows;
}
std::vector<float> Extra(int trainer, int64_t step) {
  std::vector<float> values(static_cast<size_t>((trainer + 1) * 20000));
  for (size_t i = 0; i < values.size(); ++i)
    values[i] = static_cast<float>((i * 31 + trainer * 7 + step) % 65521);
  return values;
}

absl::Status SaveParityStep(const Cluster& cluster, int trainers, int64_t step) {
  auto results = RunTrainers(trainers, [&](int t) -> absl::Status {
    auto client = cluster.Connect(t);
    if (client == nullptr) return absl::UnavailableError(absl::StrCat("no daemon for trainer ", t));
    const std::vector<float> rows = BigRows(t, step), extra = Extra(t, step);
    RETURN_IF_ERROR(client
                        ->Save("mh", step, t, trainers,
                               {{.name = "big",
                                 .dtype = kDtFloat,
                                 .shape = {64 * trainers, 1024},
                                 .box_start = {64 * t, 0},
                                 .box_length = {64, 1024},
                                 .data = rows.data(),
                                 .size = rows.size() * 4},
                                {.name = absl::StrCat("extra", t),
                                 .dtype = kDtFloat,
                                 .shape = {static_cast<int64_t>(extra.size())},
                                 .data = extra.data(),
                                 .size = extra.size() * 4}})
                        .status());
    return client->Wait("mh", step);
  });
  for (const absl::Status& s : results) RETURN_IF_ERROR(s);
  return absl::OkStatus();
}

// Restores the whole parity step (saved by `trainers`) through daemon `rank`.
absl::Status RestoreParityStep(const Cluster& cluster, int rank, int trainers, int64_t step) {
  std::vector<float> big(static_cast<size_t>(64 * trainers * 1024));
  std::vector<std::vector<float>> extras;
  std::vector<RestoreTarget> targets = {
      {.name = "big", .dtype = kDtFloat, .data = big.data(), .size = big.size() * 4}};
  for (int t = 0; t < trainers; ++t) extras.emplace_back(Extra(t, step).size());
  for (int t = 0; t < trainers; ++t) {
    targets.push_back({.name = absl::StrCat("extra", t),
                       .dtype = kDtFloat,
                       .data = extras[t].data(),
                       .size = extras[t].size() * 4});
  }
  RETURN_IF_ERROR(cluster.Connect(rank)->Restore("mh", step, targets).status());
  for (int t = 0; t < trainers; ++t) {
    if (std::vector<float>(big.begin() + t * 65536, big.begin() + (t + 1) * 65536) != BigRows(t, step)) {
      return absl::InternalError(
          absl::StrCat("rank ", rank, ": wrong bytes in trainer ", t, "'s rows of big"));
    }
    if (extras[t] != Extra(t, step)) {
      return absl::InternalError(absl::StrCat("rank ", rank, ": wrong bytes in extra", t));
    }
  }
  return absl::OkStatus();
}

std::string StepFile(const Cluster& cluster, int host, const std::string& name, int64_t step = 1) {
  return JoinPath(cluster.HostRoot(host), absl::StrFormat("mh/step-%08d/%s", step, name));
}
std::string ParityFileName(int rank, int ranks) {
  return absl::StrFormat("ckpt.parity-%05d-of-%05d", rank, ranks);
}
std::string DataFileName(int rank, int ranks) {
  return absl::StrFormat("ckpt.data-%05d-of-%05d", rank, ranks);
}

class ParityTest : public ::testing::TestWithParam<ParityMode> {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "simulated hosts need root (network and mount namespaces)";
  }
  std::vector<std::string> Flags() const {
    return {"--redundancy",   "parity",
            "--parity-group", absl::StrCat(GetParam().group),
            "--parity",       absl::StrCat(GetParam().parity)};
  }
};

TEST_P(ParityTest, LosingAnyParityHostsRestoresBitExactEverywhereAndOneMoreIsDataLossNamingThem) {
  const ParityMode mode = GetParam();
  const int n = mode.hosts;
  Cluster cluster(n, SimulatedHosts{.hosts = n, .local_storage = true}, Flags());
  ASSERT_EQ(StartProblem(cluster), "");
  ASSERT_EQ(SaveParityStep(cluster, n, 1), absl::OkStatus());
  FileSystem* fs = PosixFileSystem();
  const nlohmann::json meta =
      nlohmann::json::parse(fs->ReadFileToString(StepFile(cluster, 0, "ckptd.json"), 1 << 22).value_or("{}"));
  ASSERT_EQ(meta["parity"]["parity"], mode.parity) << meta.dump();
  ASSERT_EQ(meta["parity"]["groups"].size(), 1u) << meta.dump();
  const int64_t segment = meta["parity"]["groups"][0]["segment_bytes"].get<int64_t>();
  std::vector<std::string> data(n), parity(n);
  for (int r = 0; r < n; ++r) {
    // Each host holds its data file and its parity file: P segments, checksummed.
    data[r] = fs->ReadFileToString(StepFile(cluster, r, DataFileName(r, n)), 1 << 24).value_or("missing");
    parity[r] = fs->ReadFileToString(StepFile(cluster, r, ParityFileName(r, n)), 1 << 24).value_or("missing");
    EXPECT_EQ(static_cast<int64_t>(parity[r].size()), mode.parity * segment) << "host " << r;
    EXPECT_EQ(meta["hosts"][r]["parity_bytes"], static_cast<int64_t>(parity[r].size()));
    EXPECT_EQ(meta["hosts"][r]["parity_crc32c"], crc32c::Value(parity[r].data(), parity[r].size()))
        << "host " << r;
    EXPECT_EQ(meta["hosts"][r]["bytes"], static_cast<int64_t>(data[r].size()));
    // Segments are at least a third of the largest file: every file spans K of them.
    EXPECT_GE(segment * (mode.group - mode.parity), static_cast<int64_t>(data[r].size()));
    for (int other = 0; other < n; ++other) {
      if (other != r) {
        EXPECT_FALSE(fs->Exists(StepFile(cluster, other, DataFileName(r, n))));
      }
    }
  }
  // A host's loss, as far as the step goes: its data and parity files gone.
  auto lose = [&](int host) {
    ASSERT_TRUE(fs->DeleteFile(StepFile(cluster, host, DataFileName(host, n))).ok());
    ASSERT_TRUE(fs->DeleteFile(StepFile(cluster, host, ParityFileName(host, n))).ok());
  };
  // Every window of P hosts in turn is lost: every daemon restores every byte, the
  // lost files rebuilt from the others' data and parity.
  for (int first = 0; first < n; ++first) {
    SCOPED_TRACE(absl::StrCat("hosts ", first, "..", first + mode.parity - 1, " (mod ", n, ") lost"));
    for (int i = 0; i < mode.parity; ++i) lose((first + i) % n);
    for (int rank = 0; rank < n; ++rank) {
      const absl::Status restored = RestoreParityStep(cluster, rank, n, 1);
      EXPECT_TRUE(restored.ok()) << restored;
    }
    // Through any daemon verify passes, and names the parity files it could not read.
    std::string out;
    EXPECT_EQ(
        RunCommand(absl::StrCat(CKPTCTL_BINARY, " verify --json --address ", cluster.Address(first), " mh"),
                   &out),
        0)
        << out;
    const nlohmann::json verified = nlohmann::json::parse(out, nullptr, false);
    EXPECT_EQ(verified.value("parity_files_checked", 0), n - mode.parity) << out;
    EXPECT_EQ(verified.value("parity_files_missing", nlohmann::json::array()).size(),
              static_cast<size_t>(mode.parity))
        << out;
    for (int i = 0; i < mode.parity; ++i) {
      const int lost = (first + i) % n;
      ASSERT_TRUE(fs->WriteFileAtomically(StepFile(cluster, lost, DataFileName(lost, n)), data[lost]).ok());
      ASSERT_TRUE(
          fs->WriteFileAtomically(StepFile(cluster, lost, ParityFileName(lost, n)), parity[lost]).ok());
    }
  }
  // One more than P: DATA_LOSS naming the group, the hosts and the tensors; never bytes.
  for (int lost = 0; lost <= mode.parity; ++lost) lose(lost);
  for (int rank = 0; rank < n; ++rank) {
    const absl::Status restored = RestoreParityStep(cluster, rank, n, 1);
    EXPECT_EQ(restored.code(), absl::StatusCode::kDataLoss) << restored;
    EXPECT_NE(restored.message().find("cannot be rebuilt: parity group 0"), std::string::npos) << restored;
    EXPECT_NE(restored.message().find(absl::StrCat("more than its parity ", mode.parity)), std::string::npos)
        << restored;
    EXPECT_NE(restored.message().find("(host0)"), std::string::npos) << restored;
    EXPECT_NE(restored.message().find("(host1)"), std::string::npos) << restored;
    EXPECT_NE(restored.message().find("tensors in it: big,extra"), std::string::npos) << restored;
  }
  EXPECT_EQ(cluster.Stop(), 0) << cluster.log();
  const std::string log = fs->ReadFileToString(cluster.log(), 1 << 24).value_or("");
  EXPECT_NE(log.find("rebuilding it from its parity group"), std::string::npos) << log;
}

TEST_P(ParityTest, WipedHostsAreRebuiltAtRestartAndRestoreOnFewerHostsAndTheNextStepIsProtected) {
  const ParityMode mode = GetParam();
  const int n = mode.hosts;
  Cluster cluster(n, SimulatedHosts{.hosts = n, .local_storage = true}, Flags());
  ASSERT_EQ(StartProblem(cluster), "");
  ASSERT_EQ(SaveParityStep(cluster, n, 1), absl::OkStatus());
  ASSERT_EQ(cluster.Stop(), 0) << cluster.log();
  FileSystem* fs = PosixFileSystem();
  // The last P hosts come back with empty disks: at start each rebuilds its own data
  // file, byte for byte, from the group's survivors.
  std::map<int, std::string> before;
  for (int lost = n - mode.parity; lost < n; ++lost) {
    before[lost] = fs->ReadFileToString(StepFile(cluster, lost, DataFileName(lost, n)), 1 << 24).value_or("");
    ASSERT_TRUE(fs->DeleteRecursively(cluster.HostRoot(lost)).ok());
  }
  ASSERT_EQ(StartProblem(cluster), "");
  for (const auto& [lost, contents] : before) {
    EXPECT_EQ(
        fs->ReadFileToString(StepFile(cluster, lost, DataFileName(lost, n)), 1 << 24).value_or("missing"),
        contents)
        << "host " << lost;
    EXPECT_TRUE(fs->Exists(StepFile(cluster, lost, "ckpt.index"))) << "host " << lost;
  }
  for (int rank = 0; rank < n; ++rank) {
    const absl::Status restored = RestoreParityStep(cluster, rank, n, 1);
    EXPECT_TRUE(restored.ok()) << restored;
  }
  // The next step has every host's parity again, the wiped hosts' included.
  ASSERT_EQ(SaveParityStep(cluster, n, 2), absl::OkStatus());
  for (int r = 0; r < n; ++r) EXPECT_TRUE(fs->Exists(StepFile(cluster, r, ParityFileName(r, n), 2))) << r;
  ASSERT_EQ(cluster.Stop(), 0) << cluster.log();
  const std::string log = fs->ReadFileToString(cluster.log(), 1 << 24).value_or("");
  EXPECT_NE(
      log.find(absl::StrCat("run 'mh' step 1: repaired on this host from its peers (ckpt.index, ckptd.json, ",
                            DataFileName(n - 1, n))),
      std::string::npos)
      << log;

  // The last host is gone for good: the job runs on one host fewer, and every daemon
  // still restores both steps, the missing host's bytes rebuilt.
  cluster.Resize(n - 1);
  ASSERT_EQ(StartProblem(cluster), "");
  for (int rank = 0; rank < n - 1; ++rank) {
    for (int64_t step : {1, 2}) {
      const absl::Status restored = RestoreParityStep(cluster, rank, n, step);
      EXPECT_TRUE(restored.ok()) << "step " << step << ": " << restored;
    }
    // Into another layout: rows and columns that straddle the last two savers' boxes,
    // the last one's rebuilt.
    std::vector<float> box(96 * 100);
    ASSERT_TRUE(cluster.Connect(rank)
                    ->Restore("mh", 1,
                              {{.name = "big",
                                .dtype = kDtFloat,
                                .box_start = {64 * (n - 1) - 32, 500},
                                .box_length = {96, 100},
                                .data = box.data(),
                                .size = box.size() * 4}})
                    .ok());
    for (int row = 0; row < 96; ++row) {
      const int global = 64 * (n - 1) - 32 + row, saver = global / 64;
      const std::vector<float> rows = BigRows(saver, 1);
      for (int column = 0; column < 100; ++column) {
        ASSERT_EQ(box[row * 100 + column], rows[(global % 64) * 1024 + 500 + column])
            << "rank " << rank << " row " << global << " column " << 500 + column;
      }
    }
  }
  EXPECT_EQ(cluster.Stop(), 0) << cluster.log();
}

INSTANTIATE_TEST_SUITE_P(Hosts, ParityTest,
                         ::testing::Values(ParityMode{3, 3, 1}, ParityMode{4, 4, 1}, ParityMode{4, 4, 2}),
                         ParityModeName);

class ParityFaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "simulated hosts need root (network and mount namespaces)";
  }
  Cluster cluster_{3,
                   SimulatedHosts{.hosts = 3, .local_storage = true},
                   {"--redundancy", "parity", "--parity-group", "3", "--parity", "1"}};
};

TEST_F(ParityFaultTest, CorruptParityOrDataIsDataLossNeverWrongBytes) {
  ASSERT_EQ(StartProblem(cluster_), "");
  ASSERT_EQ(SaveParityStep(cluster_, 3, 1), absl::OkStatus());
  ASSERT_EQ(SaveParityStep(cluster_, 3, 2), absl::OkStatus());
  FileSystem* fs = PosixFileSystem();
  // Host 2 holds the parity of the stripe that host 1's second segment is in: with
  // that parity corrupt, host 1's file cannot come back right, and the index's
  // checksums say so.
  const std::string parity_path = StepFile(cluster_, 2, ParityFileName(2, 3));
  std::string parity = fs->ReadFileToString(parity_path, 1 << 24).value_or("");
  ASSERT_FALSE(parity.empty());
  for (char& c : parity) c = static_cast<char>(c ^ 0x5a);
  ASSERT_TRUE(fs->WriteFileAtomically(parity_path, parity).ok());
  // ckptctl verify finds it while every data file is whole, through any daemon and on
  // the host itself.
  for (const std::string& where : {absl::StrCat("--address ", cluster_.Address(0), " mh --step 1"),
                                   JoinPath(cluster_.HostRoot(2), "mh/step-00000001")}) {
    std::string out;
    EXPECT_EQ(RunCommand(absl::StrCat(CKPTCTL_BINARY, " verify --json ", where), &out), 1) << out;
    EXPECT_NE(out.find("ckpt.parity-00002-of-00003 (rank 2, host2)"), std::string::npos) << out;
    EXPECT_NE(out.find("the parity is corrupt"), std::string::npos) << out;
  }
  ASSERT_TRUE(fs->DeleteFile(StepFile(cluster_, 1, DataFileName(1, 3))).ok());
  for (int rank = 0; rank < 3; ++rank) {
    const absl::Status restored = RestoreParityStep(cluster_, rank, 3, 1);
    EXPECT_EQ(restored.code(), absl::StatusCode::kDataLoss) << restored;
  }
  // ckptctl verify finds it too, through any daemon.
  std::string out;
  EXPECT_NE(RunCommand(absl::StrCat(CKPTCTL_BINARY, " verify --json --address ", cluster_.Address(0),
                                    " mh --step 1"),
                       &out),
            0)
      << out;
  // A corrupt data file (no host lost) is DATA_LOSS as well: step 2's, which no read
  // has brought into the read cache.
  const std::string step2_data1 = StepFile(cluster_, 1, DataFileName(1, 3), 2);
  std::string flipped = fs->ReadFileToString(step2_data1, 1 << 24).value_or("");
  ASSERT_GT(flipped.size(), 4096u);
  flipped[4096] = static_cast<char>(flipped[4096] ^ 1);
  ASSERT_TRUE(fs->WriteFileAtomically(step2_data1, flipped).ok());
  for (int rank = 0; rank < 3; ++rank) {
    const absl::Status restored = RestoreParityStep(cluster_, rank, 3, 2);
    EXPECT_EQ(restored.code(), absl::StatusCode::kDataLoss) << restored;
  }
  EXPECT_EQ(cluster_.Stop(), 0) << cluster_.log();
}

TEST_F(ParityFaultTest, AParityFileThatCannotBeWrittenFailsTheStepEverywhereAndPublishesNothing) {
  ASSERT_EQ(StartProblem(cluster_), "");
  // Host 1's run directory has room for its data file (about 420 KiB) but not for its
  // parity file beside it.
  const std::string run_dir = JoinPath(cluster_.HostRoot(1), "mh");
  ASSERT_TRUE(PosixFileSystem()->CreateDir(run_dir, 0700).ok());
  std::string out;
  const std::string pid = absl::StrCat(cluster_.Pid(1));
  ASSERT_EQ(
      RunCommand(absl::StrCat("nsenter -t ", pid, " -m -- mount -t tmpfs -o size=512k,mode=0700 ckptd-small ",
                              JoinPath(cluster_.dir(), "disk/root/mh")),
                 &out),
      0)
      << out;
  const absl::Status saved = SaveParityStep(cluster_, 3, 1);
  EXPECT_EQ(saved.code(), absl::StatusCode::kResourceExhausted) << saved;
  EXPECT_NE(saved.message().find("parity"), std::string::npos) << saved;
  EXPECT_NE(saved.message().find("host1"), std::string::npos) << saved;
  for (int host : {0, 2}) {
    auto names = PosixFileSystem()->ListDir(JoinPath(cluster_.HostRoot(host), "mh"));
    for (const std::string& name : names.value_or(std::vector<std::string>())) {
      ADD_FAILURE() << "host " << host << " kept " << name;
    }
  }
  ASSERT_EQ(
      RunCommand(absl::StrCat("nsenter -t ", pid, " -m -- ls -A ", JoinPath(cluster_.dir(), "disk/root/mh")),
                 &out),
      0)
      << out;
  EXPECT_EQ(out, "") << "host 1 kept files";
  EXPECT_EQ(cluster_.Stop(), 0) << cluster_.log();
}

TEST_F(ParityFaultTest, AHostKilledDuringTheParityPhaseLeavesNothingPublishedAndTheLastStepRestores) {
  ASSERT_EQ(StartProblem(cluster_), "");
  ASSERT_EQ(SaveParityStep(cluster_, 3, 1), absl::OkStatus());
  // Step 2 is large, so that its parity phase lasts: host 0's parity file appears in
  // its temp directory when the phase starts there, and host 2 is killed then. No host
  // can publish before host 0 ends the phase and votes, and host 2 never votes.
  constexpr int64_t kFloats = int64_t{8} << 20;  // 32 MiB per trainer
  const std::string temp_parity =
      JoinPath(cluster_.HostRoot(0), absl::StrCat("mh/.tmp-step-00000002/", ParityFileName(0, 3)));
  std::vector<absl::Status> saved;
  std::thread trainers([&] {
    saved = RunTrainers(3, [&](int t) -> absl::Status {
      auto client = cluster_.Connect(t);
      std::vector<float> values(static_cast<size_t>(kFloats), static_cast<float>(t));
      RETURN_IF_ERROR(client
                          ->Save("mh", 2, t, 3,
                                 {{.name = "huge",
                                   .dtype = kDtFloat,
                                   .shape = {3 * kFloats},
                                   .box_start = {t * kFloats},
                                   .box_length = {kFloats},
                                   .data = values.data(),
                                   .size = values.size() * 4}})
                          .status());
      return client->Wait("mh", 2);
    });
  });
  const pid_t victim = cluster_.Pid(2);
  ASSERT_GT(victim, 0);
  bool seen = false;
  for (int i = 0; i < 60000 && !seen; ++i) {
    seen = PosixFileSystem()->Exists(temp_parity);
    if (!seen) ::usleep(1000);
  }
  ::kill(victim, SIGKILL);
  trainers.join();
  ASSERT_TRUE(seen) << "host 0 never started the parity phase: " << cluster_.log();
  for (int t = 0; t < 2; ++t) EXPECT_FALSE(saved[t].ok()) << "trainer " << t;
  EXPECT_NE(cluster_.WaitForExit(), 0);

  ASSERT_EQ(StartProblem(cluster_), "");
  for (int host = 0; host < 3; ++host) {
    EXPECT_FALSE(PosixFileSystem()->Exists(JoinPath(cluster_.HostRoot(host), "mh/step-00000002"))) << host;
    const absl::Status restored = RestoreParityStep(cluster_, host, 3, 1);
    EXPECT_TRUE(restored.ok()) << restored;
  }
  EXPECT_EQ(cluster_.Stop(), 0) << cluster_.log();
}

}  // namespace
}  // namespace ckptd::testing
