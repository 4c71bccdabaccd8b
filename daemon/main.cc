// ckptd: wiring only. Flags and config, MPI, logging, the gRPC server on a unix socket,
// a signal thread, and the coordinator loop on the main thread (the MPI thread).
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <iostream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "ckptd/v1/wire.h"
#include "daemon/base/config.h"
#include "daemon/base/logging.h"
#include "daemon/coord/collective.h"
#include "daemon/coord/coordinator.h"
#include "daemon/io/file_system.h"
#include "daemon/io/private_dir.h"
#include "daemon/service/ckptd_service.h"
#include "daemon/service/credentials.h"

namespace {

// Exit statuses (docs/operations.md): 0 stopped with every rank; 2 bad flags, config
// or start-up; 3 coordination failed and the job was aborted; 4 stopped on a signal
// while some peer rank never joined the stop (dead or stopped).
constexpr int kExitStoppedAlone = 4;

int Fail(const absl::Status& status) {
  std::cerr << "ckptd: " << status << std::endl;
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ckptd: per-host checkpoint daemon; run one per host under mpirun"};
  // A flag given twice takes its last value, so wrappers can append overrides.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  std::string config_path, root, socket_path, commit_timeout, log_level;
  app.add_option("--config", config_path, "YAML config file (see config/ckptd.yaml)");
  app.add_option("--root", root, "checkpoint root directory (overrides config root)");
  app.add_option("--socket", socket_path, "unix socket path; {rank} and {uid} are substituted");
  app.add_option("--commit-timeout", commit_timeout, "deadline of every commit collective, e.g. 60s");
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error");
  int keep_last = -1, keep_every = -1;
  app.add_option("--keep-last", keep_last, "retention: keep the newest N steps (0 = all)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--keep-every-n-steps", keep_every, "retention: also keep steps divisible by K")
      ->check(CLI::NonNegativeNumber);
  app.set_version_flag("--version", ckptd::wire::kVersion);
  CLI11_PARSE(app, argc, argv);

  ckptd::FileSystem* fs = ckptd::PosixFileSystem();
  ckptd::DaemonConfig config;
  if (!config_path.empty()) {
    absl::StatusOr<std::string> text = fs->ReadFileToString(config_path, 1 << 20);
    if (!text.ok()) return Fail(text.status());
    absl::StatusOr<ckptd::DaemonConfig> parsed = ckptd::ParseConfig(*text);
    if (!parsed.ok()) return Fail(parsed.status());
    config = *parsed;
  }
  if (!root.empty()) config.root = root;
  if (!socket_path.empty()) config.socket_path = socket_path;
  if (!log_level.empty()) config.log_level = log_level;
  if (keep_last >= 0) config.keep_last = keep_last;
  if (keep_every >= 0) config.keep_every_n_steps = keep_every;
  if (!commit_timeout.empty()) {
    absl::StatusOr<absl::Duration> d = ckptd::ParseDuration(commit_timeout);
    if (!d.ok()) return Fail(d.status());
    config.commit_timeout = *d;
  }

  // Signals go to one thread that only sets the stop flag; block them everywhere else
  // before any thread (MPI's, gRPC's) exists.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  absl::StatusOr<std::unique_ptr<ckptd::Collective>> collective = ckptd::CreateMpiCollective(&argc, &argv);
  if (!collective.ok()) return Fail(collective.status());
  const int rank = (*collective)->rank();
  if (absl::Status s = ckptd::SetUpLogging(rank, config.log_level); !s.ok()) return Fail(s);

  auto fatal = [&](const absl::Status& s) {
    spdlog::critical("start-up: {}", std::string(s.message()));
    (*collective)->Abort(2);
  };
  gid_t checkpoint_group = ckptd::kNoGroup;
  if (!config.checkpoint_group.empty()) {
    absl::StatusOr<gid_t> gid = ckptd::ResolveGroup(config.checkpoint_group);
    if (!gid.ok()) fatal(gid.status());
    checkpoint_group = *gid;
  }
  // The root is this daemon's own: refused if someone else made it or can write it,
  // and one daemon per rank and root (a second one would commit into the same steps).
  if (absl::Status s = ckptd::PreparePrivateDirectory(config.root, checkpoint_group, "root"); !s.ok())
    fatal(s);
  absl::StatusOr<std::unique_ptr<ckptd::ProcessLock>> root_lock =
      ckptd::ProcessLock::Acquire(ckptd::JoinPath(config.root, absl::StrCat(".ckptd-rank-", rank, ".lock")),
                                  absl::StrCat("checkpoint root ", config.root, " for rank ", rank));
  if (!root_lock.ok()) fatal(root_lock.status());
  // Every checkpoint file is reached beneath the root, never through a symlink.
  absl::StatusOr<std::unique_ptr<ckptd::FileSystem>> confined = ckptd::ConfinedFileSystem(
      config.root, checkpoint_group == ckptd::kNoGroup ? ckptd::kPrivateFileMode : ckptd::kGroupFileMode);
  if (!confined.ok()) fatal(confined.status());
  char resolved_root[PATH_MAX];
  if (::realpath(config.root.c_str(), resolved_root) != nullptr) config.root = resolved_root;

  // Who may talk to this daemon: by default its own uid and root.
  ckptd::PeerPolicy policy;
  policy.allowed_uids.insert(config.allowed_uids.begin(), config.allowed_uids.end());
  policy.allowed_gids.insert(config.allowed_gids.begin(), config.allowed_gids.end());
  if (config.allowed_uids.empty()) policy.allowed_uids = {::getuid(), 0};
  gid_t socket_group = static_cast<gid_t>(-1);
  if (!config.socket_group.empty()) {
    absl::StatusOr<gid_t> gid = ckptd::ResolveGroup(config.socket_group);
    if (!gid.ok()) fatal(gid.status());
    socket_group = *gid;
  }
  const std::string socket = ckptd::ExpandSocketPath(config.socket_path, rank, ::getuid());
  // Held before the socket is replaced: a second daemon on this path refuses to start
  // instead of taking the socket from the running one.
  if (absl::Status s = ckptd::PreparePrivateDirectory(ckptd::DirName(socket), socket_group, "socket_path");
      !s.ok()) {
    fatal(s);
  }
  absl::StatusOr<std::unique_ptr<ckptd::ProcessLock>> socket_lock =
      ckptd::ProcessLock::Acquire(socket + ".lock", absl::StrCat("socket ", socket));
  if (!socket_lock.ok()) fatal(socket_lock.status());
  absl::StatusOr<std::unique_ptr<ckptd::LocalListener>> listener =
      ckptd::LocalListener::Listen(socket, socket_group);
  if (!listener.ok()) fatal(listener.status());

  ckptd::StagingArea staging(config.staging_memory_limit);
  ckptd::StepRegistry registry;
  ckptd::CheckpointStore store(confined->get(), config.root);
  ckptd::PeerTable peers;
  ckptd::ServiceContext context{rank,
                                (*collective)->size(),
                                ckptd::wire::kVersion,
                                static_cast<uint64_t>(config.max_index_bytes),
                                config.max_tensors_per_request,
                                config.max_request_bytes,
                                config.max_trainers,
                                ""};
  ckptd::CkptdService service(context, &registry, &store, &staging, &peers);
  spdlog::info("device memory: {}", service.DeviceDescription());
  grpc::ServerBuilder builder;
  int tcp_port = 0;
  if (!config.tcp_address.empty()) {
    absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> tls =
        ckptd::MutualTlsCredentials(fs, config.tls_cert, config.tls_key, config.tls_ca);
    if (!tls.ok()) fatal(tls.status());
    builder.AddListeningPort(config.tcp_address, *tls, &tcp_port);
  }
  builder.RegisterService(&service);
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(ckptd::NewParseErrorInterceptorFactory());
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  builder.SetMaxReceiveMessageSize(ckptd::wire::kMaxMessageBytes);
  builder.SetMaxSendMessageSize(ckptd::wire::kMaxMessageBytes);
  // Bounds concurrent calls: past it, new calls get RESOURCE_EXHAUSTED.
  grpc::ResourceQuota quota("ckptd");
  quota.SetMaxThreads(config.max_concurrent_rpcs);
  builder.SetResourceQuota(quota);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || (!config.tcp_address.empty() && tcp_port == 0)) {
    fatal(absl::UnavailableError(
        absl::StrCat("cannot start the gRPC server (tcp address '", config.tcp_address, "')")));
  }
  if (tcp_port != 0) {
    const std::string host = config.tcp_address.substr(0, config.tcp_address.rfind(':'));
    service.set_tcp_address(absl::StrCat(host, ":", tcp_port));
    spdlog::info("listening on {}:{} (mutual TLS)", host, tcp_port);
  }
  (*listener)->Serve(server.get(), &peers, policy);
  spdlog::info("ckptd {} listening on unix:{}, root {}", ckptd::wire::kVersion, socket, config.root);

  std::atomic<bool> stop{false};
  std::thread signal_thread([&signals, &stop] {
    int sig = 0;
    sigwait(&signals, &sig);
    spdlog::info("signal {}: stopping", sig);
    stop = true;
  });
  signal_thread.detach();

  ckptd::Coordinator coordinator(
      collective->get(), &registry, &store,
      {.commit_timeout = config.commit_timeout,
       .version = ckptd::wire::kVersion,
       .keep_last = config.keep_last,
       .keep_every_n_steps = config.keep_every_n_steps,
       .local_report = [&service] { return service.LocalStatus().SerializeAsString(); },
       .dir_mode = checkpoint_group == ckptd::kNoGroup ? ckptd::kPrivateDirMode : ckptd::kGroupDirMode});
  if (absl::Status s = coordinator.CheckSharedRoot(); !s.ok()) fatal(s);
  absl::Status outcome = coordinator.Run(stop);
  service.StopAccepting();
  if (stop.load() && absl::IsUnavailable(outcome)) {
    // Asked to stop, and some peer never joined (it died, or is stopped): everything
    // pending here has failed with UNAVAILABLE and nothing partial was published, but
    // MPI cannot be finalized with a collective still open, so leave without it.
    server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
    listener->reset();
    spdlog::warn("ckptd stopped without its peers (exit {}): {}", kExitStoppedAlone,
                 std::string(outcome.message()));
    spdlog::shutdown();
    std::_Exit(kExitStoppedAlone);
  }
  // Calls still running get 2 s to finish. gRPC also waits this long for idle client
  // connections that do not answer its GOAWAY, then closes them.
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  listener->reset();
  if (!outcome.ok()) {
    spdlog::critical("coordination failed, aborting the job: {}", std::string(outcome.message()));
    (*collective)->Abort(3);
  }
  collective->reset();
  spdlog::info("ckptd stopped");
  return 0;
}
