// Real daemons under mpirun, hurt for real: SIGKILL at random moments during saves
// (then a restart), SIGSTOP past the commit deadline, a trainer whose stream breaks,
// corrupt and missing files, retention, and a disk that fills up.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mount.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "daemon/base/dtype.h"
#include "daemon/base/status.h"
#include "daemon/bundle/bundle.h"
#include "daemon/store/checkpoint_store.h"
#include "tests/common/temp_dir.h"
#include "tests/fault/in_process_job.h"
#include "tests/integration/cluster.h"

namespace ckptd::testing {
namespace {

constexpr int kRanks = 2;

// The same model InProcessJob saves, sent by trainer `t` (one per daemon).
absl::Status SaveModel(Client& client, const std::string& run, int64_t step, int t,
                       absl::Duration timeout = absl::Minutes(2)) {
  const std::vector<float> w = ExpectedW(kRanks, step);
  const std::vector<int64_t> r = ExpectedR(step);
  std::vector<TensorShard> shards = {
      {.name = "w",
       .dtype = kDtFloat,
       .shape = {2 * kRanks, 8},
       .box_start = {2 * t, 0},
       .box_length = {2, 8},
       .data = w.data() + 16 * t,
       .size = 16 * sizeof(float)},
      {.name = "r", .dtype = kDtInt64, .shape = {16}, .data = r.data(), .size = r.size() * sizeof(int64_t)},
  };
  SaveOptions options;
  options.timeout = timeout;
  RETURN_IF_ERROR(client.Save(run, step, t, kRanks, shards, options).status());
  return client.Wait(run, step, timeout);
}

// Trainer 0 stages its half of step 1 of the model (and does not wait).
absl::Status StageFirstHalf(Client& client, const std::string& run) {
  const std::vector<float> w = ExpectedW(kRanks, 1);
  const std::vector<int64_t> r = ExpectedR(1);
  return client
      .Save(run, 1, 0, kRanks,
            {{.name = "w",
              .dtype = kDtFloat,
              .shape = {4, 8},
              .box_start = {0, 0},
              .box_length = {2, 8},
              .data = w.data(),
              .size = 64},
             {.name = "r", .dtype = kDtInt64, .shape = {16}, .data = r.data(), .size = 128}})
      .status();
}

std::string ReadLog(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

int KillIterations() {
  const char* env = std::getenv("CKPTD_KILL_ITERATIONS");
  return env != nullptr && std::atoi(env) > 0 ? std::atoi(env) : 30;
}

TEST(ProcessFaultTest, SigkillDuringSavesNeverExposesAPartialCheckpoint) {
  TempDir root;
  std::mt19937 rng(20261202);
  int64_t next_step = 1;
  int orphans_seen = 0;
  const int iterations = KillIterations();
  for (int iteration = 0; iteration < iterations; ++iteration) {
    SCOPED_TRACE(absl::StrCat("iteration ", iteration));
    Cluster cluster(kRanks, root.path());
    ASSERT_TRUE(cluster.Start().ok());
    const pid_t victim = cluster.Pid(static_cast<int>(rng() % kRanks));
    ASSERT_GT(victim, 0);
    // The first commit after a restart cleans what the last kill left behind.
    auto first =
        RunTrainers(kRanks, [&](int t) { return SaveModel(*cluster.Connect(t), "kill", next_step, t); });
    for (const absl::Status& s : first) ASSERT_TRUE(s.ok()) << s;
    ++next_step;
    std::vector<int64_t> visible;
    ASSERT_EQ(CheckVisibleState(root.path(), "kill", kRanks, /*strict=*/true, &visible), "");
    const auto names = PosixFileSystem()->ListDir(JoinPath(root.path(), "kill"));
    ASSERT_TRUE(names.ok());
    for (const std::string& name : *names) {
      ASSERT_NE(name[0], '.') << "orphan " << name << " survived a commit after restart";
    }
    if (ReadLog(cluster.log()).find("removed orphaned") != std::string::npos) ++orphans_seen;

    // Trainers save step after step; a daemon dies at a random moment among them.
    std::atomic<int64_t> step{next_step};
    std::atomic<bool> done{false};
    std::thread saver([&] {
      while (!done) {
        const int64_t s = step.load();
        auto results = RunTrainers(kRanks, [&](int t) -> absl::Status {
          auto client = Client::Connect(cluster.Address(t), absl::Seconds(2));
          if (!client.ok()) return client.status();
          return SaveModel(**client, "kill", s, t, absl::Seconds(20));
        });
        bool all_ok = true;
        for (const absl::Status& r : results) all_ok = all_ok && r.ok();
        if (!all_ok) break;
        step = s + 1;
      }
    });
    std::this_thread::sleep_for(
        std::chrono::milliseconds(rng() % 400));  // the fault's timing, not synchronization
    ::kill(victim, SIGKILL);
    EXPECT_NE(cluster.WaitForExit(), 0);  // Open MPI ends the whole job
    done = true;
    saver.join();
    next_step = step.load() + 1;

    // Whatever the moment: every visible step is complete and exact, the previous
    // ones are intact, and TF's state file names only visible steps.
    const std::string broken = CheckVisibleState(root.path(), "kill", kRanks, /*strict=*/false, &visible);
    ASSERT_EQ(broken, "");
    ASSERT_FALSE(visible.empty());
  }
  std::printf("kill test: %d iterations, %d restarts found and removed orphans\n", iterations, orphans_seen);
}

TEST(ProcessFaultTest, StoppedRankFailsTheStepWithDeadlineExceededEverywhere) {
  Cluster cluster(kRanks, "", {"--commit-timeout", "2s"});
  ASSERT_TRUE(cluster.Start().ok());
  const pid_t rank1 = cluster.Pid(1);
  // Connected before the stop: a stopped daemon cannot finish a handshake.
  std::unique_ptr<Client> client0 = cluster.Connect(0), client1 = cluster.Connect(1);
  ASSERT_TRUE(client0 != nullptr && client1 != nullptr);
  ASSERT_EQ(::kill(rank1, SIGSTOP), 0);
  absl::Status trainer1;
  std::thread stalled([&] { trainer1 = SaveModel(*client1, "stop", 1, 1); });
  const absl::Status trainer0 = SaveModel(*client0, "stop", 1, 0);
  ::kill(rank1, SIGCONT);
  stalled.join();
  EXPECT_EQ(trainer0.code(), absl::StatusCode::kDeadlineExceeded) << trainer0;
  EXPECT_NE(trainer0.message().find("rank(s) 1 never arrived"), absl::string_view::npos) << trainer0;
  EXPECT_EQ(trainer1.code(), absl::StatusCode::kDeadlineExceeded) << trainer1;
  EXPECT_NE(ReadLog(cluster.log()).find("rank(s) 1 never arrived"), std::string::npos);
  auto steps = CheckpointStore(PosixFileSystem(), cluster.root()).ListSteps("stop");
  ASSERT_TRUE(steps.ok());
  EXPECT_TRUE(steps->empty());
  // The job recovers: the next step commits.
  auto next = RunTrainers(kRanks, [&](int t) { return SaveModel(*cluster.Connect(t), "stop", 2, t); });
  for (const absl::Status& s : next) EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(cluster.Stop(), 0);
}

TEST(ProcessFaultTest, TrainerThatNeverArrivesFailsTheStepAtTheDeadline) {
  Cluster cluster(kRanks, "", {"--commit-timeout", "1s"});
  ASSERT_TRUE(cluster.Start().ok());
  const absl::Status lonely = SaveModel(*cluster.Connect(0), "absent", 1, 0);
  EXPECT_EQ(lonely.code(), absl::StatusCode::kDeadlineExceeded) << lonely;
  EXPECT_NE(lonely.message().find("missing trainer(s) 1"), absl::string_view::npos) << lonely;
  EXPECT_EQ(cluster.Stop(), 0);
}

TEST(ProcessFaultTest, BrokenTrainerStreamFailsTheStepForEveryoneAndFreesMemory) {
  Cluster cluster(kRanks);
  ASSERT_TRUE(cluster.Start().ok());
  // Trainer 0 stages its part completely.
  auto client0 = cluster.Connect(0);
  ASSERT_TRUE(StageFirstHalf(*client0, "cut").ok());
  // Trainer 1 sends its header and part of its bytes, then its stream ends, as when
  // the trainer process dies mid-stream (the daemon sees the same short stream).
  {
    auto channel = grpc::CreateChannel("unix:" + cluster.Address(1), grpc::InsecureChannelCredentials());
    auto stub = v1::Ckptd::NewStub(channel);
    grpc::ClientContext ctx;
    v1::SaveResponse response;
    auto writer = stub->Save(&ctx, &response);
    v1::SaveRequest header;
    v1::SaveHeader* h = header.mutable_header();
    h->set_run("cut");
    h->set_step(1);
    h->set_trainer_id(1);
    h->set_trainer_count(kRanks);
    v1::TensorDescriptor* t = h->add_tensors();
    t->set_name("w");
    t->set_dtype(kDtFloat);
    t->add_shape(4);
    t->add_shape(8);
    t->mutable_box()->add_start(2);
    t->mutable_box()->add_start(0);
    t->mutable_box()->add_length(2);
    t->mutable_box()->add_length(8);
    ASSERT_TRUE(writer->Write(header));
    v1::SaveRequest data;
    data.set_data(std::string(20, 'x'));
    ASSERT_TRUE(writer->Write(data));
    writer->WritesDone();
    const grpc::Status cut = writer->Finish();
    EXPECT_EQ(cut.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << cut.error_message();
  }
  // Another run on the same daemons is unaffected.
  auto other = RunTrainers(kRanks, [&](int t) { return SaveModel(*cluster.Connect(t), "other", 1, t); });
  for (const absl::Status& s : other) EXPECT_TRUE(s.ok()) << s;
  const absl::Status waited = client0->Wait("cut", 1);
  EXPECT_EQ(waited.code(), absl::StatusCode::kAborted) << waited;
  EXPECT_NE(waited.message().find("trainer 1"), absl::string_view::npos) << waited;
  EXPECT_EQ(cluster.Connect(1)->Wait("cut", 1).code(), absl::StatusCode::kAborted);
  for (int rank = 0; rank < kRanks; ++rank) {
    auto status = cluster.Connect(rank)->Status();
    ASSERT_TRUE(status.ok());
    EXPECT_EQ(status->bytes_staged(), 0) << "rank " << rank;
  }
  auto steps = CheckpointStore(PosixFileSystem(), cluster.root()).ListSteps("cut");
  EXPECT_TRUE(steps.ok() && steps->empty());
  EXPECT_EQ(cluster.Stop(), 0);
}

// A Save stream opened by hand, as any gRPC client (or a trainer about to die) would.
struct RawSave {
  grpc::ClientContext ctx;
  v1::SaveResponse response;
  std::unique_ptr<grpc::ClientWriter<v1::SaveRequest>> writer;
};

// Rows [2t, 2t+2) of "w" (8 x 8 float32), the part trainer t of 4 holds at `step`.
std::vector<float> RowsOf(int t, int64_t step) {
  std::vector<float> rows(16);
  for (int i = 0; i < 16; ++i) rows[i] = static_cast<float>(step * 1000 + t * 16 + i);
  return rows;
}

std::unique_ptr<RawSave> OpenRawSave(const std::string& address, const std::string& run, int64_t step,
                                     int trainer) {
  auto save = std::make_unique<RawSave>();
  auto channel = grpc::CreateChannel("unix:" + address, grpc::InsecureChannelCredentials());
  save->writer = v1::Ckptd::NewStub(channel)->Save(&save->ctx, &save->response);
  v1::SaveRequest header;
  v1::SaveHeader* h = header.mutable_header();
  h->set_run(run);
  h->set_step(step);
  h->set_trainer_id(trainer);
  h->set_trainer_count(4);
  v1::TensorDescriptor* t = h->add_tensors();
  t->set_name("w");
  t->set_dtype(kDtFloat);
  t->add_shape(8);
  t->add_shape(8);
  t->mutable_box()->add_start(2 * trainer);
  t->mutable_box()->add_start(0);
  t->mutable_box()->add_length(2);
  t->mutable_box()->add_length(8);
  if (!save->writer->Write(header)) return nullptr;
  return save;
}

// Polls a daemon's Status until its staged bytes exceed `above`: the daemon has taken
// the first bytes of a stream (so its header was accepted).
bool StagedMoreThan(Client& client, int64_t above) {
  for (int i = 0; i < 3000; ++i) {
    auto status = client.Status();
    if (status.ok() && status->bytes_staged() > above) return true;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return false;
}

absl::Status SaveRows(Client& client, const std::string& run, int64_t step, int t) {
  const std::vector<float> rows = RowsOf(t, step);
  return client
      .Save(run, step, t, 4,
            {{.name = "w",
              .dtype = kDtFloat,
              .shape = {8, 8},
              .box_start = {2 * t, 0},
              .box_length = {2, 8},
              .data = rows.data(),
              .size = rows.size() * 4}})
      .status();
}

TEST(ProcessFaultTest, TrainerDyingMidSaveAbortsEveryTrainerOfTheStepWithItsCause) {
  // A long commit timeout: a trainer wrongly taken into a fresh attempt would wait
  // for it and end with DEADLINE_EXCEEDED instead of ABORTED.
  Cluster cluster(kRanks, "", {"--commit-timeout", "60s"});
  ASSERT_TRUE(cluster.Start().ok());
  // Trainers 0 and 1 use daemon 0, trainers 2 and 3 daemon 1.
  auto client0 = cluster.Connect(0), client1 = cluster.Connect(1);
  // Before the failure: trainer 0 has staged, trainer 2 is mid-stream.
  ASSERT_TRUE(SaveRows(*client0, "die", 1, 0).ok());
  const int64_t staged0 = client0->Status()->bytes_staged();
  const std::vector<float> rows2 = RowsOf(2, 1);
  std::unique_ptr<RawSave> trainer2 = OpenRawSave(cluster.Address(1), "die", 1, 2);
  ASSERT_NE(trainer2, nullptr);
  v1::SaveRequest first_half;
  first_half.set_data(std::string(reinterpret_cast<const char*>(rows2.data()), 32));
  ASSERT_TRUE(trainer2->writer->Write(first_half));
  ASSERT_TRUE(StagedMoreThan(*client1, 0)) << "daemon 1 never took trainer 2's first bytes";
  // Trainer 1 dies mid-Save: its header and some bytes arrive, then the connection
  // goes, as when the process is killed.
  {
    std::unique_ptr<RawSave> trainer1 = OpenRawSave(cluster.Address(0), "die", 1, 1);
    ASSERT_NE(trainer1, nullptr);
    v1::SaveRequest some;
    some.set_data(std::string(20, 'x'));
    ASSERT_TRUE(trainer1->writer->Write(some));
    // Dies only once the daemon holds its header and first bytes (a trainer that dies
    // before its header arrives has simply not arrived).
    ASSERT_TRUE(StagedMoreThan(*client0, staged0)) << "daemon 0 never took trainer 1's first bytes";
    trainer1->ctx.TryCancel();
    EXPECT_FALSE(trainer1->writer->Finish().ok());
  }
  const absl::Time failed_at = absl::Now();
  const std::string cause = absl::StrCat("trainer 1 on host ", HostName(), " (rank 0)");
  // Already staged: trainer 0 hears why.
  const absl::Status waited0 = client0->Wait("die", 1, absl::Seconds(30));
  EXPECT_EQ(waited0.code(), absl::StatusCode::kAborted) << waited0;
  EXPECT_NE(waited0.message().find(cause), absl::string_view::npos) << waited0;
  // Daemon 1 knows too (a trainer of the step waiting there hears the same).
  const absl::Status waited1 = client1->Wait("die", 1, absl::Seconds(30));
  EXPECT_EQ(waited1, waited0);
  // Arriving afterwards: trainer 3 is refused at once with the same cause.
  const absl::Status late = SaveRows(*client1, "die", 1, 3);
  const absl::Duration took = absl::Now() - failed_at;
  EXPECT_EQ(late.code(), absl::StatusCode::kAborted) << late;
  EXPECT_EQ(late.message(), waited0.message());
  // In flight across the failure: trainer 2's Save ends ABORTED with that cause too,
  // not with an error of another trainer's request.
  v1::SaveRequest second_half;
  second_half.set_data(std::string(reinterpret_cast<const char*>(rows2.data()) + 32, 32));
  trainer2->writer->Write(second_half);
  trainer2->writer->WritesDone();
  const grpc::Status finished2 = trainer2->writer->Finish();
  EXPECT_EQ(finished2.error_code(), grpc::StatusCode::ABORTED) << finished2.error_message();
  EXPECT_EQ(finished2.error_message(), std::string(waited0.message()));
  std::printf("trainer death: every trainer of the step told within %s\n",
              absl::FormatDuration(took).c_str());
  auto steps = CheckpointStore(PosixFileSystem(), cluster.root()).ListSteps("die");
  ASSERT_TRUE(steps.ok());
  EXPECT_TRUE(steps->empty());
  for (int rank = 0; rank < kRanks; ++rank) EXPECT_EQ(cluster.Connect(rank)->Status()->bytes_staged(), 0);

  // The retry: every trainer, the one that died (restarted) included, saves the step
  // again, and it commits bit-exact.
  auto retry = RunTrainers(4, [&](int t) -> absl::Status {
    auto client = cluster.Connect(t / 2);
    RETURN_IF_ERROR(SaveRows(*client, "die", 1, t));
    return client->Wait("die", 1, absl::Seconds(30));
  });
  for (int t = 0; t < 4; ++t) EXPECT_TRUE(retry[t].ok()) << "trainer " << t << ": " << retry[t];
  std::vector<float> all(64);
  ASSERT_TRUE(
      client0
          ->Restore("die", 1,
                    {RestoreTarget{
                        .name = "w", .dtype = kDtFloat, .shape = {8, 8}, .data = all.data(), .size = 256}})
          .ok());
  for (int t = 0; t < 4; ++t) {
    const std::vector<float> rows = RowsOf(t, 1);
    EXPECT_TRUE(std::equal(rows.begin(), rows.end(), all.begin() + 16 * t)) << "rows of trainer " << t;
  }
  // The log line of the failed step names the trainer, host and rank.
  EXPECT_NE(ReadLog(cluster.log()).find(absl::StrCat("run 'die' step 1 failed: ", cause)), std::string::npos);
  EXPECT_EQ(cluster.Stop(), 0);
}

TEST(ProcessFaultTest, SurvivorStopsOnSigtermWhenItsPeerIsDead) {
  // mpirun escalates to SIGKILL after odls_base_sigkill_timeout (1 s by default); a
  // longer one makes this a launcher that sends SIGTERM and waits (Slurm, systemd),
  // so the daemon must stop by itself: had it not, mpirun's SIGKILL would leave no
  // "stopped" line in the log.
  ::setenv("OMPI_MCA_odls_base_sigkill_timeout", "5", 1);
  Cluster cluster(kRanks, "", {"--commit-timeout", "60s"});
  const absl::Status started = cluster.Start();
  ::unsetenv("OMPI_MCA_odls_base_sigkill_timeout");
  ASSERT_TRUE(started.ok()) << started;
  const pid_t rank0 = cluster.Pid(0), rank1 = cluster.Pid(1);
  ASSERT_GT(rank0, 0);
  ASSERT_GT(rank1, 0);
  auto client0 = cluster.Connect(0);
  ASSERT_TRUE(StageFirstHalf(*client0, "alone").ok());
  absl::Status waited;
  std::thread waiter([&] { waited = client0->Wait("alone", 1, absl::Seconds(120)); });
  ASSERT_EQ(::kill(rank1, SIGKILL), 0);
  const absl::Time signalled = absl::Now();
  ASSERT_EQ(::kill(rank0, SIGTERM), 0);
  // The daemon is mpirun's child, not ours: it is gone once /proc says so.
  absl::Duration stopped_in = absl::InfiniteDuration();
  while (absl::Now() - signalled < absl::Seconds(30)) {
    std::string state = ReadLog(absl::StrCat("/proc/", rank0, "/stat"));
    if (state.empty() || state.find(") Z ") != std::string::npos) {
      stopped_in = absl::Now() - signalled;
      break;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  cluster.WaitForExit();
  waiter.join();
  std::printf("survivor stopped %s after SIGTERM\n", absl::FormatDuration(stopped_in).c_str());
  EXPECT_EQ(waited.code(), absl::StatusCode::kUnavailable) << waited;
  const std::string log = ReadLog(cluster.log());
  EXPECT_NE(log.find("[rank 0] [warning] ckptd stopped without its peers (exit 4)"), std::string::npos)
      << log;
  auto steps = CheckpointStore(PosixFileSystem(), cluster.root()).ListSteps("alone");
  ASSERT_TRUE(steps.ok());
  EXPECT_TRUE(steps->empty());
}

TEST(ProcessFaultTest, CorruptionIsDataLossAndFallbackFindsTheNewestGoodStep) {
  Cluster cluster(kRanks);
  ASSERT_TRUE(cluster.Start().ok());
  for (int64_t step : {1, 2}) {
    auto results = RunTrainers(kRanks, [&](int t) { return SaveModel(*cluster.Connect(t), "rot", step, t); });
    for (const absl::Status& s : results) ASSERT_TRUE(s.ok()) << s;
  }
  CheckpointStore store(PosixFileSystem(), cluster.root());
  const std::string prefix = CheckpointStore::Prefix(store.StepDir("rot", 2));
  auto reader = BundleReader::Open(PosixFileSystem(), prefix);
  ASSERT_TRUE(reader.ok());
  const tf::BundleEntryProto* r = (*reader)->Find("r");
  const std::string data_file = DataPath(prefix, r->shard_id(), kRanks);
  auto bytes = PosixFileSystem()->ReadFileToString(data_file, 1 << 20);
  (*bytes)[r->offset() + 3] ^= 0x04;
  ASSERT_TRUE(PosixFileSystem()->WriteFileAtomically(data_file, *bytes).ok());

  auto client = cluster.Connect(0);
  std::vector<int64_t> out(16);
  const RestoreTarget target{.name = "r", .dtype = kDtInt64, .shape = {16}, .data = out.data(), .size = 128};
  absl::StatusOr<int64_t> plain = client->Restore("rot", std::nullopt, {target});
  EXPECT_EQ(plain.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(plain.status().message().find("'r'"), absl::string_view::npos);

  grpc::ClientContext ctx;
  auto stub = v1::Ckptd::NewStub(
      grpc::CreateChannel("unix:" + cluster.Address(0), grpc::InsecureChannelCredentials()));
  v1::RestoreRequest request;
  request.set_run("rot");
  request.set_latest(true);
  request.set_fallback(true);
  request.add_tensors()->set_name("r");
  auto stream = stub->Restore(&ctx, request);
  v1::RestoreResponse message;
  std::string note;
  int64_t restored = -1;
  std::string got;
  while (stream->Read(&message)) {
    if (message.has_header()) {
      restored = message.header().step();
      note = message.header().note();
    } else {
      got += message.chunk().data();
    }
  }
  ASSERT_TRUE(stream->Finish().ok());
  EXPECT_EQ(restored, 1);
  EXPECT_NE(note.find("skipped step 2"), std::string::npos) << note;
  const std::vector<int64_t> want = ExpectedR(1);
  EXPECT_EQ(got, std::string(reinterpret_cast<const char*>(want.data()), 128));

  // A missing data file is DATA_LOSS naming the file.
  ASSERT_TRUE(PosixFileSystem()
                  ->DeleteFile(DataPath(CheckpointStore::Prefix(store.StepDir("rot", 1)), 0, kRanks))
                  .ok());
  absl::Status missing = client->Restore("rot", 1, {target}).status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kDataLoss) << missing;
  EXPECT_NE(missing.message().find("data-00000-of-00002"), absl::string_view::npos) << missing;
  EXPECT_EQ(cluster.Stop(), 0);
}

TEST(ProcessFaultTest, RetentionKeepsLastAndEveryKthAndNeverTheNewest) {
  Cluster cluster(kRanks, "", {"--keep-last", "2", "--keep-every-n-steps", "10"});
  ASSERT_TRUE(cluster.Start().ok());
  for (int64_t step : {5, 10, 15, 20, 25}) {
    auto results =
        RunTrainers(kRanks, [&](int t) { return SaveModel(*cluster.Connect(t), "keep", step, t); });
    for (const absl::Status& s : results) ASSERT_TRUE(s.ok()) << s;
  }
  std::vector<int64_t> visible;
  ASSERT_EQ(CheckVisibleState(cluster.root(), "keep", kRanks, /*strict=*/true, &visible), "");
  EXPECT_EQ(visible, (std::vector<int64_t>{10, 20, 25}));
  EXPECT_EQ(cluster.Stop(), 0);

  // ckptctl gc: a dry run changes nothing; a real one keeps the newest.
  const std::string run_dir = JoinPath(cluster.root(), "keep");
  std::string out;
  EXPECT_EQ(RunCommand(absl::StrCat(CKPTCTL_BINARY, " gc ", run_dir, " --keep-last 1 --dry-run"), &out), 0)
      << out;
  EXPECT_NE(out.find("would remove step 10"), std::string::npos) << out;
  ASSERT_EQ(CheckVisibleState(cluster.root(), "keep", kRanks, true, &visible), "");
  EXPECT_EQ(visible.size(), 3u);
  EXPECT_EQ(RunCommand(absl::StrCat(CKPTCTL_BINARY, " gc ", run_dir, " --keep-last 1"), &out), 0) << out;
  ASSERT_EQ(CheckVisibleState(cluster.root(), "keep", kRanks, true, &visible), "");
  EXPECT_EQ(visible, (std::vector<int64_t>{25}));
}

TEST(ProcessFaultTest, DiskFullFailsTheStepCleanlyAndTheNextSaveSucceeds) {
  TempDir mount_point;
  // mode=0700: a fresh tmpfs is world-writable (1777), which a root must not be.
  if (::mount("tmpfs", mount_point.path().c_str(), "tmpfs", 0, "size=4m,mode=0700") != 0) {
    GTEST_SKIP() << "cannot mount a tmpfs here (needs root and CAP_SYS_ADMIN): " << std::strerror(errno);
  }
  {
    Cluster cluster(kRanks, mount_point.path());
    ASSERT_TRUE(cluster.Start().ok());
    auto first = RunTrainers(kRanks, [&](int t) { return SaveModel(*cluster.Connect(t), "full", 1, t); });
    for (const absl::Status& s : first) ASSERT_TRUE(s.ok()) << s;
    // 6 MiB does not fit in what is left of 4 MiB.
    std::vector<char> big(3 << 20, 'z');
    auto results = RunTrainers(kRanks, [&](int t) -> absl::Status {
      auto client = cluster.Connect(t);
      RETURN_IF_ERROR(client
                          ->Save("full", 2, t, kRanks,
                                 {{.name = "big",
                                   .dtype = kDtUint8,
                                   .shape = {6 << 20},
                                   .box_start = {t * (3 << 20)},
                                   .box_length = {3 << 20},
                                   .data = big.data(),
                                   .size = big.size()}})
                          .status());
      return client->Wait("full", 2);
    });
    for (const absl::Status& s : results) {
      EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
      // Where it failed: every trainer hears the rank and host.
      EXPECT_NE(s.message().find(absl::StrCat("(host ", HostName(), ")")), absl::string_view::npos) << s;
    }
    std::vector<int64_t> visible;
    EXPECT_EQ(CheckVisibleState(mount_point.path(), "full", kRanks, true, &visible), "");
    EXPECT_EQ(visible, (std::vector<int64_t>{1}));
    const auto names = PosixFileSystem()->ListDir(JoinPath(mount_point.path(), "full"));
    ASSERT_TRUE(names.ok());
    for (const std::string& name : *names) {
      EXPECT_NE(name[0], '.') << name << " left behind";
    }
    // The failed step's space is back: the next save succeeds and the daemons serve.
    auto next = RunTrainers(kRanks, [&](int t) { return SaveModel(*cluster.Connect(t), "full", 3, t); });
    for (const absl::Status& s : next) EXPECT_TRUE(s.ok()) << s;
    EXPECT_EQ(cluster.Stop(), 0);
  }
  ::umount2(mount_point.path().c_str(), MNT_DETACH);
}

}  // namespace
}  // namespace ckptd::testing
