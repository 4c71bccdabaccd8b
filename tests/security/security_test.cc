// Hostile tests: unprivileged peers, planted symlinks, TLS without the right
// certificate, and a crowd of clients against small limits.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "daemon/base/dtype.h"
#include "daemon/base/status.h"
#include "daemon/bundle/bundle.h"
#include "daemon/store/checkpoint_store.h"
#include "tests/common/temp_dir.h"
#include "tests/integration/cluster.h"

namespace ckptd::testing {
namespace {

std::string WriteConfig(const TempDir& dir, const std::string& name, const std::string& yaml) {
  const std::string path = dir.Sub(name);
  std::ofstream(path) << yaml;
  return path;
}

absl::Status SaveSmall(Client& client, const std::string& run, int64_t step, std::vector<float>* data) {
  RETURN_IF_ERROR(client
                      .Save(run, step, 0, 1,
                            {{.name = "w",
                              .dtype = kDtFloat,
                              .shape = {static_cast<int64_t>(data->size())},
                              .data = data->data(),
                              .size = data->size() * 4}})
                      .status());
  return client.Wait(run, step);
}

// Runs ckptctl status as uid/gid 65534 (nobody) and returns its output.
int StatusAsNobody(const Cluster& cluster, std::string* out) {
  return RunCommand(absl::StrCat("setpriv --reuid 65534 --regid 65534 --clear-groups ", CKPTCTL_BINARY,
                                 " status --address ", cluster.Address(0)),
                    out);
}

TEST(SecurityTest, PeersNotAllowedGetPermissionDenied) {
  if (::getuid() != 0) GTEST_SKIP() << "needs root to switch to an unprivileged uid with setpriv";
  TempDir configs;
  // The socket is opened to group 65534 so that nobody can connect at all; the
  // daemon must then refuse it by its credentials.
  const std::string config = WriteConfig(configs, "c.yaml", "security:\n  socket_group: '65534'\n");
  Cluster cluster(1, "", {"--config", config});
  ASSERT_TRUE(cluster.Start().ok());
  ASSERT_EQ(::chmod(cluster.dir().c_str(), 0711), 0);
  struct stat st;
  ASSERT_EQ(::stat(DirName(cluster.Address(0)).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0750u);
  EXPECT_EQ(st.st_gid, 65534u);
  std::string out;
  EXPECT_NE(StatusAsNobody(cluster, &out), 0) << out;
  EXPECT_NE(out.find("may not use this ckptd"), std::string::npos) << out;
  // Root (the daemon's own uid) is allowed.
  EXPECT_TRUE(cluster.Connect(0)->Status().ok());
  EXPECT_EQ(cluster.Stop(), 0);
  std::ifstream log(cluster.log());
  std::stringstream text;
  text << log.rdbuf();
  EXPECT_NE(text.str().find("uid 65534 gid 65534: not allowed"), std::string::npos);

  // Allowed by group: the same peer is served.
  const std::string allow =
      WriteConfig(configs, "allow.yaml", "security:\n  socket_group: '65534'\n  allowed_gids: [65534]\n");
  Cluster open(1, "", {"--config", allow});
  ASSERT_TRUE(open.Start().ok());
  ASSERT_EQ(::chmod(open.dir().c_str(), 0711), 0);
  EXPECT_EQ(StatusAsNobody(open, &out), 0) << out;
  EXPECT_EQ(open.Stop(), 0);
}

TEST(SecurityTest, DefaultSocketDirectoryAdmitsOnlyTheOwner) {
  if (::getuid() != 0) GTEST_SKIP() << "needs root to switch to an unprivileged uid with setpriv";
  Cluster cluster(1);
  ASSERT_TRUE(cluster.Start().ok());
  ASSERT_EQ(::chmod(cluster.dir().c_str(), 0711), 0);
  std::string out;
  EXPECT_NE(StatusAsNobody(cluster, &out), 0) << out;  // cannot even reach the 0700 directory
  EXPECT_EQ(cluster.Stop(), 0);
}

TEST(SecurityTest, PlantedSymlinksAreNotFollowed) {
  TempDir root, outside;
  ASSERT_EQ(::symlink(outside.path().c_str(), JoinPath(root.path(), "evil").c_str()), 0);
  Cluster cluster(1, root.path());
  ASSERT_TRUE(cluster.Start().ok());
  auto client = cluster.Connect(0);
  std::vector<float> data(16, 1.0f);
  absl::Status s = SaveSmall(*client, "evil", 1, &data);
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(PosixFileSystem()->ListDir(outside.path())->empty()) << "wrote through a symlink";

  // A committed step replaced by a symlink to another checkpoint is not served.
  ASSERT_TRUE(SaveSmall(*client, "good", 1, &data).ok());
  CheckpointStore store(PosixFileSystem(), root.path());
  ASSERT_TRUE(PosixFileSystem()->Rename(store.StepDir("good", 1), JoinPath(outside.path(), "moved")).ok());
  ASSERT_EQ(::symlink(JoinPath(outside.path(), "moved").c_str(), store.StepDir("good", 1).c_str()), 0);
  std::vector<float> out(16);
  absl::Status restored =
      client
          ->Restore("good", 1,
                    {RestoreTarget{.name = "w", .dtype = kDtFloat, .data = out.data(), .size = 64}})
          .status();
  EXPECT_EQ(restored.code(), absl::StatusCode::kNotFound) << restored;
  EXPECT_EQ(client->ListCheckpoints("good")->checkpoints_size(), 0);
  EXPECT_EQ(cluster.Stop(), 0);
}

// A throwaway CA, a server certificate for 127.0.0.1, a good client certificate, one
// from another CA and an expired one.
class TlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string d = dir_.path();
    const std::string script = absl::StrCat(
        "set -e; cd ", d, "\n",
        "for ca in ca other; do openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=$ca -keyout "
        "$ca.key -out $ca.crt; done\n",
        "printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' > san.ext\n",
        "openssl req -newkey rsa:2048 -nodes -subj /CN=server -keyout server.key -out server.csr\n",
        "openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -extfile san.ext "
        "-out server.crt\n",
        "for c in client stranger expired; do openssl req -newkey rsa:2048 -nodes -subj /CN=$c -keyout "
        "$c.key -out $c.csr; done\n",
        "openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -out client.crt\n",
        "openssl x509 -req -in stranger.csr -CA other.crt -CAkey other.key -CAcreateserial -days 2 -out "
        "stranger.crt\n",
        "mkdir -p db/new; touch db/index.txt; echo 01 > db/serial\n",
        "printf "
        "'[ca]\\ndefault_ca=c\\n[c]\\ndir=db\\ndatabase=db/index.txt\\nserial=db/serial\\nnew_certs_dir=db/"
        "new\\n"
        "default_md=sha256\\npolicy=p\\n[p]\\ncommonName=supplied\\n' > ca.cnf\n",
        "openssl ca -batch -config ca.cnf -cert ca.crt -keyfile ca.key -in expired.csr -out expired.crt "
        "-startdate 20200101000000Z -enddate 20200102000000Z\n");
    std::string out;
    ASSERT_EQ(RunCommand(absl::StrCat("bash -c '", absl::StrReplaceAll(script, {{"'", "'\\''"}}), "'"), &out),
              0)
        << out;
    const std::string config =
        absl::StrCat("tcp:\n  address: 127.0.0.1:0\n  tls_cert: ", d, "/server.crt\n  tls_key: ", d,
                     "/server.key\n  tls_ca: ", d, "/ca.crt\n");
    std::ofstream(dir_.Sub("tls.yaml")) << config;
    cluster_ = std::make_unique<Cluster>(1, "", std::vector<std::string>{"--config", dir_.Sub("tls.yaml")});
    ASSERT_TRUE(cluster_->Start().ok());
    address_ = cluster_->Connect(0)->Status()->tcp_address();
    ASSERT_FALSE(address_.empty());
  }
  void TearDown() override {
    if (cluster_ != nullptr) {
      EXPECT_EQ(cluster_->Stop(), 0);
    }
  }
  absl::Status StatusOver(const std::string& who) {
    TlsFiles tls{who.empty() ? "" : dir_.Sub(who + ".crt"), who.empty() ? "" : dir_.Sub(who + ".key"),
                 dir_.Sub("ca.crt")};
    auto client = Client::Connect(address_, absl::Seconds(3), &tls);
    if (!client.ok()) return client.status();
    return (*client)->Status().status();
  }
  TempDir dir_;
  std::unique_ptr<Cluster> cluster_;
  std::string address_;
};

TEST_F(TlsTest, OnlyClientsWithAValidCertificateFromTheCaAreServed) {
  EXPECT_TRUE(StatusOver("client").ok());
  EXPECT_FALSE(StatusOver("").ok()) << "no client certificate";
  EXPECT_FALSE(StatusOver("stranger").ok()) << "certificate from another CA";
  EXPECT_FALSE(StatusOver("expired").ok()) << "expired certificate";
  // Without TLS at all.
  EXPECT_FALSE(Client::Connect(address_, absl::Seconds(2)).ok() &&
               (*Client::Connect(address_, absl::Seconds(2)))->Status().ok());
  std::string out;
  EXPECT_EQ(RunCommand(absl::StrCat(CKPTCTL_BINARY, " status --address ", address_, " --tls-cert ",
                                    dir_.Sub("client.crt"), " --tls-key ", dir_.Sub("client.key"),
                                    " --tls-ca ", dir_.Sub("ca.crt")),
                       &out),
            0)
      << out;
}

TEST(SecurityTest, TcpWithoutTlsIsRefusedAtStartUp) {
  TempDir configs;
  const std::string config = WriteConfig(configs, "c.yaml", "tcp:\n  address: 127.0.0.1:0\n");
  std::string out;
  EXPECT_NE(RunCommand(absl::StrCat(CKPTD_BINARY, " --config ", config), &out), 0);
  EXPECT_NE(out.find("mutual TLS"), std::string::npos) << out;
}

// 100 clients at once against 2 daemons with a small staging budget and few handler
// threads: every request succeeds or is refused with a clear status; staged memory
// never exceeds the budget; nothing crashes.
TEST(SecurityTest, HundredConcurrentClientsStayWithinLimits) {
  TempDir configs;
  constexpr int64_t kBudget = 4 << 20;
  const std::string config = WriteConfig(
      configs, "c.yaml",
      absl::StrCat("staging:\n  memory_limit: ", kBudget, "\nlimits:\n  max_concurrent_rpcs: 16\n"));
  Cluster cluster(2, "", {"--config", config});
  ASSERT_TRUE(cluster.Start().ok());
  std::atomic<int> ok{0}, refused{0};
  std::mutex mu;
  std::vector<std::string> unexpected;
  auto results = RunTrainers(100, [&](int i) -> absl::Status {
    auto client = Client::Connect(cluster.Address(i % 2), absl::Seconds(30));
    if (!client.ok()) return client.status();
    std::vector<float> data(64 * 1024, static_cast<float>(i));  // 256 KiB
    const std::string run = absl::StrCat("load-", i);
    absl::Status s = SaveSmall(**client, run, 1, &data);
    std::vector<float> back(data.size());
    if (s.ok()) {
      s = (*client)
              ->Restore(run, 1,
                        {RestoreTarget{
                            .name = "w", .dtype = kDtFloat, .data = back.data(), .size = back.size() * 4}})
              .status();
      if (s.ok() && back != data) s = absl::DataLossError("restored bytes differ");
    }
    if (s.ok()) {
      ++ok;
    } else if (s.code() == absl::StatusCode::kResourceExhausted ||
               s.code() == absl::StatusCode::kUnavailable) {
      ++refused;
    } else {
      std::lock_guard<std::mutex> lock(mu);
      unexpected.push_back(s.ToString());
    }
    return s;
  });
  EXPECT_TRUE(unexpected.empty()) << unexpected.front();
  EXPECT_EQ(ok + refused, 100);
  EXPECT_GT(ok, 0);
  for (int rank = 0; rank < 2; ++rank) {
    auto status = cluster.Connect(rank)->Status();
    ASSERT_TRUE(status.ok()) << "daemon " << rank << " did not survive";
    EXPECT_LE(status->peak_bytes_staged(), kBudget);
    EXPECT_EQ(status->staging_memory_limit(), kBudget);
    EXPECT_EQ(status->bytes_staged(), 0);
  }
  std::printf("load test: 100 clients, %d served, %d refused with a clear status\n", ok.load(),
              refused.load());
  EXPECT_EQ(cluster.Stop(), 0);
}

// Starts daemons by hand (mpirun's MPMD form lets each rank have its own flags) and
// returns mpirun's exit status; the daemons' output goes to *out.
int RunDaemons(const std::vector<std::string>& per_rank_args, std::string* out) {
  std::string command = absl::StrCat("timeout 120 ", MPIEXEC, " --allow-run-as-root --oversubscribe");
  for (size_t i = 0; i < per_rank_args.size(); ++i) {
    absl::StrAppend(&command, i == 0 ? "" : " :", " -np 1 ", CKPTD_BINARY, " ", per_rank_args[i]);
  }
  return RunCommand(command, out);
}

std::string Mode(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return absl::StrCat(path, ": missing");
  char text[8];
  std::snprintf(text, sizeof(text), "%04o", static_cast<unsigned>(st.st_mode & 07777));
  return text;
}

TEST(SecurityTest, CheckpointsArePrivateToTheirOwner) {
  if (::getuid() != 0) GTEST_SKIP() << "needs root to switch to an unprivileged uid with setpriv";
  Cluster cluster(1);
  ASSERT_TRUE(cluster.Start().ok());
  std::vector<float> data(256, 1.5f);
  auto client = cluster.Connect(0);
  ASSERT_TRUE(SaveSmall(*client, "private", 1, &data).ok());
  EXPECT_EQ(cluster.Stop(), 0);
  const CheckpointStore store(PosixFileSystem(), cluster.root());
  const std::string step = store.StepDir("private", 1);
  for (const std::string& dir : {cluster.root(), store.RunDir("private"), step})
    EXPECT_EQ(Mode(dir), "0700") << dir;
  const std::vector<std::string> files = {
      IndexPath(CheckpointStore::Prefix(step)), DataPath(CheckpointStore::Prefix(step), 0, 1),
      JoinPath(step, "ckptd.json"), JoinPath(store.RunDir("private"), "checkpoint")};
  for (const std::string& file : files) EXPECT_EQ(Mode(file), "0600") << file;
  // Even with every directory on the way opened up, another user reads no file.
  for (const std::string& dir : {cluster.dir(), cluster.root(), store.RunDir("private"), step}) {
    ASSERT_EQ(::chmod(dir.c_str(), 0755), 0) << dir;
  }
  for (const std::string& file : files) {
    std::string out;
    EXPECT_NE(RunCommand(absl::StrCat("setpriv --reuid 65534 --regid 65534 --clear-groups cat ", file), &out),
              0)
        << file << " is readable by uid 65534";
  }
}

// Every directory and file beneath `dir` whose mode is not `dir_mode`/`file_mode`,
// as "path mode" lines (the root's own lock files included).
std::vector<std::string> ModesOtherThan(const std::string& dir, const std::string& dir_mode,
                                        const std::string& file_mode) {
  std::vector<std::string> wrong;
  for (const std::string& name : PosixFileSystem()->ListDir(dir).value_or(std::vector<std::string>{})) {
    const std::string path = JoinPath(dir, name);
    const bool is_dir = PosixFileSystem()->IsDirectory(path);
    if (Mode(path) != (is_dir ? dir_mode : file_mode)) wrong.push_back(absl::StrCat(path, " ", Mode(path)));
    if (is_dir) {
      std::vector<std::string> below = ModesOtherThan(path, dir_mode, file_mode);
      wrong.insert(wrong.end(), below.begin(), below.end());
    }
  }
  return wrong;
}

TEST(SecurityTest, EveryWriterKeepsTheRootPrivateImportExportGcAndDrain) {
  TempDir drain_parent;
  const std::string drain_root = drain_parent.Sub("drained");
  Cluster cluster(1, "", {"--drain-to", drain_root});
  ASSERT_TRUE(cluster.Start().ok());
  std::vector<float> data(64, 0.5f);
  auto client = cluster.Connect(0);
  for (int64_t step : {1, 2}) ASSERT_TRUE(SaveSmall(*client, "mine", step, &data).ok());
  const CheckpointStore drained(PosixFileSystem(), drain_root);
  // The drain runs in the background: poll its published result, up to a minute.
  for (const absl::Time end = absl::Now() + absl::Minutes(1);
       !drained.IsCommitted("mine", 2) && absl::Now() < end;) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_TRUE(drained.IsCommitted("mine", 2));
  const std::string root = cluster.root();
  std::string out;
  // A checkpoint TensorFlow wrote, imported as a run; exported as files into the
  // root; a gc that rewrites the state file.
  ASSERT_EQ(RunCommand(absl::StrCat(CKPTCTL_BINARY, " import ", CKPTD_TESTDATA_DIR, "/ocr/variables ", root,
                                    "/imported --step 7 -q"),
                       &out),
            0)
      << out;
  ASSERT_EQ(
      RunCommand(absl::StrCat(CKPTCTL_BINARY, " export ", root, "/mine --out ", root, "/exported/npy -q"),
                 &out),
      0)
      << out;
  ASSERT_EQ(RunCommand(absl::StrCat(CKPTCTL_BINARY, " gc ", root, "/mine --keep-last 1 -q"), &out), 0) << out;
  EXPECT_EQ(cluster.Stop(), 0);
  EXPECT_EQ(Mode(root), "0700");
  EXPECT_EQ(ModesOtherThan(root, "0700", "0600"), std::vector<std::string>{});
  EXPECT_EQ(ModesOtherThan(drain_root, "0700", "0600"), std::vector<std::string>{});
  // Outside any root, an export is as readable as its directory lets it be.
  TempDir elsewhere;
  ASSERT_EQ(::chmod(elsewhere.path().c_str(), 0755), 0);
  ASSERT_EQ(
      RunCommand(absl::StrCat(CKPTCTL_BINARY, " export ", root, "/mine --out ", elsewhere.Sub("npy"), " -q"),
                 &out),
      0)
      << out;
  EXPECT_EQ(ModesOtherThan(elsewhere.path(), "0755", "0644"), std::vector<std::string>{});
}

TEST(SecurityTest, ImportIntoAGroupRootGivesTheGroupModes) {
  TempDir dir;
  const std::string root = dir.Sub("root");
  ASSERT_EQ(::mkdir(root.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(root.c_str(), 02750), 0);  // as a daemon with checkpoint_group leaves it
  std::string out;
  ASSERT_EQ(RunCommand(absl::StrCat(CKPTCTL_BINARY, " import ", CKPTD_TESTDATA_DIR, "/ocr/variables ", root,
                                    "/imported --step 7 -q"),
                       &out),
            0)
      << out;
  EXPECT_EQ(ModesOtherThan(root, "2750", "0640"), std::vector<std::string>{});
}

TEST(SecurityTest, CheckpointGroupMakesThemReadableByThatGroupOnly) {
  TempDir configs;
  const std::string config = WriteConfig(configs, "g.yaml", "security:\n  checkpoint_group: '65534'\n");
  Cluster cluster(1, "", {"--config", config});
  ASSERT_TRUE(cluster.Start().ok());
  std::vector<float> data(16, 2.0f);
  ASSERT_TRUE(SaveSmall(*cluster.Connect(0), "shared", 1, &data).ok());
  EXPECT_EQ(cluster.Stop(), 0);
  const CheckpointStore store(PosixFileSystem(), cluster.root());
  const std::string step = store.StepDir("shared", 1);
  EXPECT_EQ(Mode(cluster.root()), "2750");
  struct stat st;
  for (const std::string& path : {step, IndexPath(CheckpointStore::Prefix(step))}) {
    ASSERT_EQ(::stat(path.c_str(), &st), 0) << path;
    EXPECT_EQ(st.st_gid, 65534u) << path;
    EXPECT_EQ(st.st_mode & 0777, S_ISDIR(st.st_mode) ? 0750u : 0640u) << path;
  }
}

TEST(SecurityTest, RootOrSocketDirectoryOfAnotherUserOrWritableByOthersIsRefused) {
  if (::getuid() != 0) GTEST_SKIP() << "needs root to create directories owned by another uid";
  TempDir dir;
  const std::string squatted = dir.Sub("squatted"), open = dir.Sub("open"), sockets = dir.Sub("sockets");
  ASSERT_EQ(::mkdir(squatted.c_str(), 0755), 0);
  ASSERT_EQ(::chown(squatted.c_str(), 65534, 65534), 0);
  ASSERT_EQ(::mkdir(open.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(open.c_str(), 0777), 0);
  ASSERT_EQ(::mkdir(sockets.c_str(), 0700), 0);
  ASSERT_EQ(::chown(sockets.c_str(), 65534, 65534), 0);
  struct Case {
    std::string args, expected;
  };
  const std::vector<Case> cases = {
      {absl::StrCat("--root ", squatted, " --socket ", dir.Sub("s1/ckptd.sock")), "is owned by uid 65534"},
      {absl::StrCat("--root ", open, " --socket ", dir.Sub("s2/ckptd.sock")), "is writable by every user"},
      {absl::StrCat("--root ", dir.Sub("root3"), " --socket ", sockets, "/ckptd.sock"),
       "is owned by uid 65534"},
  };
  for (const Case& c : cases) {
    std::string out;
    EXPECT_EQ(RunDaemons({c.args}, &out), 2) << c.args << "\n" << out;
    EXPECT_NE(out.find(c.expected), std::string::npos) << c.args << "\n" << out;
  }
  // Nothing was planted into the squatter's directories.
  EXPECT_TRUE(PosixFileSystem()->ListDir(squatted)->empty());
  EXPECT_TRUE(PosixFileSystem()->ListDir(sockets)->empty());
}

TEST(SecurityTest, SecondDaemonOnTheSameSocketOrRootRefusesNamingTheHolder) {
  Cluster first(1);
  ASSERT_TRUE(first.Start().ok());
  const pid_t holder = first.Pid(0);
  ASSERT_GT(holder, 0);
  TempDir other;
  std::string out;
  // Same socket, another root: the running daemon keeps its socket.
  EXPECT_EQ(RunDaemons({absl::StrCat("--root ", other.Sub("root"), " --socket ", first.Address(0))}, &out), 2)
      << out;
  EXPECT_NE(
      out.find(absl::StrCat("socket ", first.Address(0), " is in use by another ckptd (pid ", holder, ",")),
      std::string::npos)
      << out;
  // Same root and rank, another socket.
  EXPECT_EQ(
      RunDaemons({absl::StrCat("--root ", first.root(), " --socket ", other.Sub("sock/ckptd.sock"))}, &out),
      2)
      << out;
  EXPECT_NE(out.find(absl::StrCat("is in use by another ckptd (pid ", holder, ",")), std::string::npos)
      << out;
  // The first daemon still serves on its socket.
  std::vector<float> data(8, 3.0f);
  EXPECT_TRUE(SaveSmall(*first.Connect(0), "still", 1, &data).ok());
  EXPECT_EQ(first.Stop(), 0);
}

TEST(SecurityTest, RanksThatDoNotShareTheRootRefuseToStart) {
  TempDir dir;
  std::string out;
  const int rc = RunDaemons({absl::StrCat("--root ", dir.Sub("host0"), " --socket ", dir.Sub("s/0.sock")),
                             absl::StrCat("--root ", dir.Sub("host1"), " --socket ", dir.Sub("s/1.sock"))},
                            &out);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("rank 0 on host "), std::string::npos) << out;
  EXPECT_NE(out.find("that rank(s) 1 (on "), std::string::npos) << out;
  EXPECT_NE(out.find("does not see the checkpoint root"), std::string::npos) << out;
  EXPECT_NE(out.find("every daemon must use one shared root"), std::string::npos) << out;
}

}  // namespace
}  // namespace ckptd::testing
