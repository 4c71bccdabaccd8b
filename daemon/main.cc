// ckptd: wiring only. Flags and config, MPI, logging, the gRPC server on a unix socket,
// a signal thread, and the coordinator loop on the main thread (the MPI thread).
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <malloc.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <optional>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "ckptd/v1/wire.h"
#include "daemon/base/command_line.h"
#include "daemon/base/logging.h"
#include "daemon/base/status.h"
#include "daemon/config/config.h"
#include "daemon/config/config_flags.h"
#include "daemon/config/config_keys.h"
#include "daemon/coord/collective.h"
#include "daemon/coord/commit_metrics.h"
#include "daemon/coord/coordinator.h"
#include "daemon/io/file_system.h"
#include "daemon/io/private_dir.h"
#include "daemon/peer/credentials.h"
#include "daemon/service/ckptd_service.h"
#include "daemon/service/metrics_server.h"
#include "daemon/tiers/storage_tiers.h"

namespace {

// Exit statuses (docs/operations.md): 0 stopped with every rank; 2 bad flags, config
// or start-up; 3 coordination failed and the job was aborted; 4 stopped on a signal
// while some peer rank never joined the stop (dead or stopped).
constexpr int kExitStoppedAlone = 4;

int Fail(const absl::Status& status) {
  std::cerr << "ckptd: " << status << std::endl;
  return 2;
}

// A log file in a directory that does not exist is a typo an operator wants to hear
// about from --check-config, not from every rank at start. A directory that differs per
// rank ("{rank}" in it) is checked when each rank opens its file.
absl::Status CheckLogFileDirectory(ckptd::FileSystem* fs, const std::string& log_file) {
  if (log_file.empty()) return absl::OkStatus();
  if (log_file.back() == '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("log_file (--log-file) '", log_file, "' names a directory; it must be a file path"));
  }
  const std::string dir = ckptd::DirName(log_file);
  if (absl::StrContains(dir, "{rank}") || fs->IsDirectory(dir)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("log_file (--log-file) '", log_file, "': directory '", dir, "' does not exist"));
}

// The config file (if any) with the command line's overrides, validated as a whole.
absl::StatusOr<ckptd::DaemonConfig> LoadConfig(ckptd::FileSystem* fs, const std::string& config_path,
                                               const ckptd::ConfigFlags& flags) {
  ckptd::DaemonConfig config;
  if (!config_path.empty()) {
    ASSIGN_OR_RETURN(std::string text, fs->ReadFileToString(config_path, 1 << 20));
    ASSIGN_OR_RETURN(config, ckptd::ParseConfig(text));
  }
  RETURN_IF_ERROR(flags.Apply(config));
  RETURN_IF_ERROR(ckptd::ValidateConfig(config));
  RETURN_IF_ERROR(CheckLogFileDirectory(fs, config.log_file));
  return config;
}

// What this daemon holds on its host: its checkpoint root (checked, locked, confined)
// and its unix socket (directory checked, locked, listening).
struct HostClaims {
  gid_t checkpoint_group = ckptd::kNoGroup;
  std::unique_ptr<ckptd::ProcessLock> root_lock;
  std::unique_ptr<ckptd::FileSystem> confined;
  std::unique_ptr<ckptd::FileSystem> drain;  // confined to drain_to; null without a drain
  std::string socket;
  std::unique_ptr<ckptd::ProcessLock> socket_lock;
  std::unique_ptr<ckptd::LocalListener> listener;
};

absl::StatusOr<HostClaims> ClaimHost(ckptd::DaemonConfig& config, int rank) {
  HostClaims claims;
  config.root = ckptd::ExpandPathPattern(config.root, rank, ::getuid());
  if (!config.checkpoint_group.empty()) {
    ASSIGN_OR_RETURN(claims.checkpoint_group, ckptd::ResolveGroup(config.checkpoint_group));
  }
  // The root is this daemon's own: refused if someone else made it or can write it,
  // and one daemon per rank and root (a second one would commit into the same steps).
  RETURN_IF_ERROR(ckptd::PreparePrivateDirectory(config.root, claims.checkpoint_group, "root"));
  ASSIGN_OR_RETURN(
      claims.root_lock,
      ckptd::ProcessLock::Acquire(ckptd::JoinPath(config.root, absl::StrCat(".ckptd-rank-", rank, ".lock")),
                                  absl::StrCat("checkpoint root ", config.root, " for rank ", rank)));
  // Every checkpoint file is reached beneath the root, never through a symlink.
  ASSIGN_OR_RETURN(claims.confined,
                   ckptd::ConfinedFileSystem(config.root, claims.checkpoint_group == ckptd::kNoGroup
                                                              ? ckptd::kPrivateFileMode
                                                              : ckptd::kGroupFileMode));
  char resolved_root[PATH_MAX];
  if (::realpath(config.root.c_str(), resolved_root) != nullptr) config.root = resolved_root;
  ASSIGN_OR_RETURN(ckptd::DrainRootClaim drain,
                   ckptd::ClaimDrainRoot(config.drain_to, claims.checkpoint_group));
  claims.drain = std::move(drain.fs);
  config.drain_to = drain.path;

  gid_t socket_group = static_cast<gid_t>(-1);
  if (!config.socket_group.empty()) {
    ASSIGN_OR_RETURN(socket_group, ckptd::ResolveGroup(config.socket_group));
  }
  claims.socket = ckptd::ExpandPathPattern(config.socket_path, rank, ::getuid());
  // Held before the socket is replaced: a second daemon on this path refuses to start
  // instead of taking the socket from the running one.
  RETURN_IF_ERROR(ckptd::PreparePrivateDirectory(ckptd::DirName(claims.socket), socket_group, "socket_path"));
  ASSIGN_OR_RETURN(claims.socket_lock, ckptd::ProcessLock::Acquire(claims.socket + ".lock",
                                                                   absl::StrCat("socket ", claims.socket)));
  ASSIGN_OR_RETURN(claims.listener, ckptd::LocalListener::Listen(claims.socket, socket_group));
  return claims;
}

// Who may talk to this daemon over its unix socket: by default its own uid and root.
ckptd::PeerPolicy PolicyFrom(const ckptd::DaemonConfig& config) {
  ckptd::PeerPolicy policy;
  policy.allowed_uids.insert(config.allowed_uids.begin(), config.allowed_uids.end());
  policy.allowed_gids.insert(config.allowed_gids.begin(), config.allowed_gids.end());
  if (config.allowed_uids.empty()) policy.allowed_uids = {::getuid(), 0};
  return policy;
}

// What the health service answers, for the whole server ("") and for ckptd.v1.Ckptd.
void SetServing(grpc::Server* server, bool serving) {
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  if (health == nullptr) return;
  health->SetServingStatus(serving);
  health->SetServingStatus(ckptd::v1::Ckptd::service_full_name(), serving);
}

// Message sizes and the bound on concurrent calls (past it, new calls get
// RESOURCE_EXHAUSTED), the same on every listener.
void SetServerLimits(grpc::ServerBuilder& builder, int max_concurrent_rpcs, const std::string& quota_name) {
  builder.SetMaxReceiveMessageSize(ckptd::wire::kMaxMessageBytes);
  builder.SetMaxSendMessageSize(ckptd::wire::kMaxMessageBytes);
  grpc::ResourceQuota quota(quota_name);
  quota.SetMaxThreads(max_concurrent_rpcs);
  builder.SetResourceQuota(quota);
}

// The gRPC server: the services, the parse-error interceptor, message and thread
// limits, and the mutual-TLS TCP listener when configured (its port in *tcp_port).
absl::StatusOr<std::unique_ptr<grpc::Server>> StartServer(ckptd::FileSystem* fs,
                                                          const ckptd::DaemonConfig& config,
                                                          ckptd::CkptdService* service,
                                                          ckptd::PeerService* peer_service, int* tcp_port) {
  // The standard grpc.health.v1.Health service, for load balancers and probes: NOT_SERVING
  // until the daemon is ready and again once it stops accepting work.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  if (!config.tcp_address.empty()) {
    ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> tls,
                     ckptd::MutualTlsCredentials(fs, {config.tls_cert, config.tls_key, config.tls_ca}));
    builder.AddListeningPort(config.tcp_address, tls, tcp_port);
  }
  builder.RegisterService(service);
  // Without tcp.address the peer service gets a listener of its own (StartPeerServer).
  if (!config.tcp_address.empty()) builder.RegisterService(peer_service);
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(ckptd::NewParseErrorInterceptorFactory());
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  SetServerLimits(builder, config.max_concurrent_rpcs, "ckptd");
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || (!config.tcp_address.empty() && *tcp_port == 0)) {
    return absl::UnavailableError(
        absl::StrCat("cannot start the gRPC server (tcp address '", config.tcp_address, "')"));
  }
  SetServing(server.get(), false);
  return server;
}

// The listener of the peer channel the daemons make themselves (no tcp.address): the
// peer service alone, on `host` and any port, mutual TLS with the job's certificates.
absl::StatusOr<std::unique_ptr<grpc::Server>> StartPeerServer(const std::string& host,
                                                              const ckptd::TlsPem& pem,
                                                              int max_concurrent_rpcs,
                                                              ckptd::PeerService* peer_service, int* port) {
  grpc::ServerBuilder builder;
  builder.AddListeningPort(absl::StrCat(host, ":0"), ckptd::MutualTlsCredentials(pem), port);
  builder.RegisterService(peer_service);
  SetServerLimits(builder, max_concurrent_rpcs, "ckptd-peers");
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || *port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen for peers on ", host, " (any port)"));
  }
  return server;
}

// The daemon moves large buffers over and over: gRPC allocates each 4 MiB message it
// receives or sends, and frees it once handled. With glibc's defaults such blocks are
// mapped fresh and unmapped again (or trimmed off the heap), so every message pays
// page faults on memory that was just given back; on a VM that halves a stream save.
// Blocks up to 32 MiB (glibc's largest setting) come from the heap instead, and up to
// 512 MiB of freed heap is kept for the next message rather than returned. The
// daemon's staging memory is pooled and budgeted on its own (staging.memory_limit).
// The trim threshold only holds for the main arena: a thread's arena lives in heaps
// of its own, and glibc unmaps such a heap whenever everything in it is freed. A
// request of 100,000 tensors allocates its per-tensor arrays (tens of MB) in its
// handler's arena and frees them at commit, so each round faulted them in afresh
// (3,000-18,000 faults a round); one arena keeps them. The cost is one lock for
// blocks the threads' own caches (tcache) do not hold; the daemon's threads mostly
// move large buffers, not many small ones.
void KeepFreedMemoryForReuse() {
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
  mallopt(M_ARENA_MAX, 1);
}

// A running daemon's parts, built in dependency order (the members' order) and torn
// down in reverse. Everything here runs on the main thread, the MPI thread, which
// ends up running the coordinator.
class Daemon {
 public:
  Daemon(const ckptd::DaemonConfig& config, ckptd::Collective* collective, HostClaims* claims)
      : config_(config),
        rank_(collective->rank()),
        collective_(collective),
        claims_(claims),
        staging_(config.staging_memory_limit),
        tiers_(TiersOptions(config, *claims, collective->size())),
        dir_mode_(DirMode(*claims)),
        shard_copier_(tiers_.peer_directory()),
        service_(ServiceOptions(config, rank_, collective->size(), &metrics_), &registry_, &tiers_, &staging_,
                 &peers_),
        peer_service_(tiers_.peer_directory(), tiers_.read_store(), &registry_, tiers_.commit_store()->fs()),
        coordinator_(collective, &registry_, tiers_.commit_store(), CoordinatorOptionsFor(config)),
        commit_metrics_(&metrics_) {}

  // The start-up steps, in order; the first that fails says why, and the job must
  // not start.
  absl::Status Start() {
    spdlog::info("device memory: {}", service_.DeviceDescription());
    AttachCommitObservers();
    // Before any trainer can connect: a job whose roots do not match its storage mode
    // must not accept a single Save.
    RETURN_IF_ERROR(coordinator_.CheckRoot());
    RETURN_IF_ERROR(StartGrpc());
    RETURN_IF_ERROR(tiers_.MeetPeers(
        {.rank = rank_,
         .tcp_address = config_.tcp_address,
         .tcp_port = tcp_port_,
         .tls = {config_.tls_cert, config_.tls_key, config_.tls_ca},
         .peer_interface = config_.peer_interface,
         .start_peer_listener = [this](const std::string& host,
                                       const ckptd::TlsPem& pem) -> absl::StatusOr<int> {
           int port = 0;
           ASSIGN_OR_RETURN(peer_server_,
                            StartPeerServer(host, pem, config_.max_concurrent_rpcs, &peer_service_, &port));
           return port;
         },
         .failure_domains = config_.failure_domains,
         .replicas = config_.replicas,
         .parity = config_.redundancy == "parity" ? config_.parity : 0,
         .parity_group = config_.parity_group},
        coordinator_, &shard_copier_));
    // Before trainers connect on the local socket; with replicas the peers must already
    // serve, since a host repairs what it lost from them.
    RETURN_IF_ERROR(coordinator_.ReconcileLocalSteps());
    // Status names each run's last commit after a restart too; a root it cannot list
    // costs only that, never the start.
    if (auto committed = tiers_.commit_store()->LatestSteps(); committed.ok()) {
      registry_.NoteCommittedBeforeStart(*committed);
    }
    RETURN_IF_ERROR(StartMetrics());
    OpenToTrainers();
    return absl::OkStatus();
  }

  // Runs the coordinator until every rank has seen a stop, then stops serving. The
  // process's exit code; a failed coordination aborts the job instead.
  int RunUntilStopped(const std::atomic<bool>& stop) {
    const absl::Status outcome = coordinator_.Run(stop);
    service_.StopAccepting();
    SetServing(server_.get(), false);
    if (stop.load() && absl::IsUnavailable(outcome)) {
      // Asked to stop, and some peer never joined (it died, or is stopped): everything
      // pending here has failed with UNAVAILABLE and nothing partial was published, but
      // MPI cannot be finalized with a collective still open, so leave without it.
      server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
      claims_->listener.reset();
      spdlog::warn("ckptd stopped without its peers (exit {}): {}", kExitStoppedAlone,
                   std::string(outcome.message()));
      spdlog::shutdown();
      std::_Exit(kExitStoppedAlone);
    }
    // Calls still running get 2 s to finish. gRPC also waits this long for idle client
    // connections that do not answer its GOAWAY, then closes them.
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    if (peer_server_ != nullptr)
      peer_server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    claims_->listener.reset();
    metrics_server_.reset();
    if (!outcome.ok()) {
      spdlog::critical("coordination failed, aborting the job: {}", std::string(outcome.message()));
      collective_->Abort(3);
    }
    return 0;
  }

 private:
  static ckptd::StorageTiersOptions TiersOptions(const ckptd::DaemonConfig& config, const HostClaims& claims,
                                                 int num_ranks) {
    return {.storage = claims.confined.get(),
            .root = config.root,
            .mode = config.storage,
            .read_once = config.read_once,
            .num_ranks = num_ranks,
            .read_cache_bytes = static_cast<uint64_t>(config.read_cache_bytes),
            .read_cache_linger = config.read_cache_linger,
            .memory_steps = config.memory_steps,
            .peer_timeout = config.commit_timeout,
            .drain = claims.drain.get(),
            .drain_root = config.drain_to,
            .drain_dir_mode = DirMode(claims),
            .drain_bandwidth = config.drain_bandwidth};
  }

  // Directories of checkpoints: private, or open to the checkpoint group.
  static uint32_t DirMode(const HostClaims& claims) {
    return claims.checkpoint_group == ckptd::kNoGroup ? ckptd::kPrivateDirMode : ckptd::kGroupDirMode;
  }

  static ckptd::ServiceContext ServiceOptions(const ckptd::DaemonConfig& config, int rank, int num_ranks,
                                              ckptd::Metrics* metrics) {
    return {.rank = rank,
            .num_ranks = num_ranks,
            .version = ckptd::wire::kVersion,
            .max_index_bytes = static_cast<uint64_t>(config.max_index_bytes),
            .max_tensors_per_request = config.max_tensors_per_request,
            .max_request_bytes = config.max_request_bytes,
            .max_trainers = config.max_trainers,
            .restore_into_trainer_memory = config.restore_into_trainer_memory,
            .metrics = config.metrics_address.empty() ? nullptr : metrics};
  }

  ckptd::CoordinatorOptions CoordinatorOptionsFor(const ckptd::DaemonConfig& config) {
    return {.commit_timeout = config.commit_timeout,
            .version = ckptd::wire::kVersion,
            .keep_last = config.keep_last,
            .keep_every_n_steps = config.keep_every_n_steps,
            .local_report = [this] { return service_.LocalStatus().SerializeAsString(); },
            .dir_mode = dir_mode_,
            .storage = config.storage,
            .drain_store = tiers_.drain_store(),
            .drainer = tiers_.drainer(),
            .drain_every_n_steps = config.drain_every_n_steps,
            .drain_keep_last = config.drain_keep_last};
  }

  void AttachCommitObservers() {
    for (ckptd::CommitObserver* observer : tiers_.CommitObservers(&staging_))
      coordinator_.AddObserver(observer);
    if (!config_.metrics_address.empty()) coordinator_.AddObserver(&commit_metrics_);
  }

  absl::Status StartGrpc() {
    ASSIGN_OR_RETURN(server_,
                     StartServer(ckptd::PosixFileSystem(), config_, &service_, &peer_service_, &tcp_port_));
    if (tcp_port_ != 0) {
      const std::string host = config_.tcp_address.substr(0, config_.tcp_address.rfind(':'));
      service_.set_tcp_address(absl::StrCat(host, ":", tcp_port_));
      spdlog::info("listening on {}:{} (mutual TLS)", host, tcp_port_);
    }
    return absl::OkStatus();
  }

  absl::Status StartMetrics() {
    if (config_.metrics_address.empty()) return absl::OkStatus();
    // Validated by the config: HOST:PORT. Rank r takes PORT + r.
    const size_t colon = config_.metrics_address.rfind(':');
    const std::string host = config_.metrics_address.substr(0, colon);
    int port = 0;
    if (!absl::SimpleAtoi(config_.metrics_address.substr(colon + 1), &port)) {
      return absl::InvalidArgumentError(absl::StrCat("metrics_address '", config_.metrics_address, "'"));
    }
    ASSIGN_OR_RETURN(metrics_server_, ckptd::MetricsServer::Start(host, port == 0 ? 0 : port + rank_,
                                                                  [this] { return service_.MetricsText(); }));
    service_.set_metrics_address(absl::StrCat(host, ":", metrics_server_->port()));
    spdlog::info("metrics on http://{}:{}/metrics", host, metrics_server_->port());
    return absl::OkStatus();
  }

  void OpenToTrainers() {
    claims_->listener->Serve(server_.get(), &peers_, PolicyFrom(config_));
    SetServing(server_.get(), true);
    spdlog::info("ckptd {} listening on unix:{}, root {} ({} storage)", ckptd::wire::kVersion,
                 claims_->socket, config_.root, std::string(ckptd::StorageName(config_.storage)));
    tiers_.LogSetUp();
  }

  const ckptd::DaemonConfig& config_;
  const int rank_;
  ckptd::Collective* collective_;
  HostClaims* claims_;
  ckptd::StagingArea staging_;
  ckptd::StepRegistry registry_;
  ckptd::StorageTiers tiers_;
  const uint32_t dir_mode_;
  ckptd::Metrics metrics_;
  ckptd::PeerTable peers_;
  ckptd::PeerShardCopier shard_copier_;
  ckptd::CkptdService service_;
  ckptd::PeerService peer_service_;
  ckptd::Coordinator coordinator_;
  ckptd::CommitMetrics commit_metrics_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<grpc::Server> peer_server_;  // the job's own peer channel, without tcp.address
  int tcp_port_ = 0;
  std::unique_ptr<ckptd::MetricsServer> metrics_server_;
};

// The daemon's command line: the config file, the flags that override its keys, and
// the two questions answered without starting: --check-config and --config-reference.
struct CommandLine {
  std::string config_path;
  std::string check_config_path;
  bool config_reference = false;
  ckptd::ConfigFlags overrides;
};

void DeclareFlags(CLI::App& app, CommandLine& flags) {
  // A flag given twice takes its last value, so wrappers can append overrides.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--config", flags.config_path, "YAML config file (see config/ckptd.yaml)")
      ->type_name("FILE");
  app.add_option("--check-config", flags.check_config_path,
                 "validate this config file (with the other flags' overrides), print the effective "
                 "configuration and exit: 0 if valid, 2 if not")
      ->type_name("FILE");
  app.add_flag("--config-reference", flags.config_reference,
               "print the table of config keys (as in docs/operations.md) and exit");
  flags.overrides.Declare(app);
  app.set_version_flag("--version", ckptd::wire::kVersion);
}

// --check-config and --config-reference: the exit code once answered, else nullopt.
std::optional<int> AnswerConfigQuestions(const CommandLine& flags) {
  if (flags.config_reference) {
    std::cout << ckptd::ConfigReferenceMarkdown();
    return 0;
  }
  if (flags.check_config_path.empty()) return std::nullopt;
  absl::StatusOr<ckptd::DaemonConfig> config =
      LoadConfig(ckptd::PosixFileSystem(), flags.check_config_path, flags.overrides);
  if (!config.ok()) return Fail(config.status());
  std::cout << "# " << flags.check_config_path << ": valid; the effective configuration:\n"
            << ckptd::EffectiveConfigYaml(*config);
  return 0;
}

// Signals go to one thread; they are blocked everywhere else, so call this before any
// other thread (MPI's, gRPC's) exists. SIGTERM and SIGINT set `stop`; SIGHUP reopens the
// log file (logrotate) and SIGUSR1 toggles debug logging, where either would otherwise
// kill the rank and, with it, the job. The thread lives as long as the process.
void HandleSignals(std::atomic<bool>* stop) {
  static sigset_t signals;
  sigemptyset(&signals);
  for (int sig : {SIGTERM, SIGINT, SIGHUP, SIGUSR1}) sigaddset(&signals, sig);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::thread([stop] {
    for (;;) {
      int sig = 0;
      if (sigwait(&signals, &sig) != 0) continue;
      if (sig == SIGHUP) {
        ckptd::ReopenLogFile();
      } else if (sig == SIGUSR1) {
        ckptd::ToggleDebugLogging();
      } else if (!stop->exchange(true)) {
        spdlog::info("signal {} ({}): stopping", sig, strsignal(sig));
      }
    }
  }).detach();
}

}  // namespace

int main(int argc, char** argv) {
  KeepFreedMemoryForReuse();
  CLI::App app{"ckptd: per-host checkpoint daemon; run one per host under mpirun"};
  CommandLine flags;
  DeclareFlags(app, flags);
  if (std::optional<int> ended = ckptd::ParseCommandLine(app, argc, argv, "ckptd")) return *ended;
  if (std::optional<int> answered = AnswerConfigQuestions(flags)) return *answered;
  absl::StatusOr<ckptd::DaemonConfig> loaded =
      LoadConfig(ckptd::PosixFileSystem(), flags.config_path, flags.overrides);
  if (!loaded.ok()) return Fail(loaded.status());
  ckptd::DaemonConfig config = *std::move(loaded);
  std::atomic<bool> stop{false};
  HandleSignals(&stop);
  absl::StatusOr<std::unique_ptr<ckptd::Collective>> collective = ckptd::CreateMpiCollective(&argc, &argv);
  if (!collective.ok()) return Fail(collective.status());
  const int rank = (*collective)->rank();
  if (absl::Status s = ckptd::SetUpLogging(
          {.rank = rank, .level = config.log_level, .format = config.log_format, .file = config.log_file});
      !s.ok())
    return Fail(s);
  auto fatal = [&](const absl::Status& s) {
    spdlog::critical("start-up: {}", std::string(s.message()));
    (*collective)->Abort(2);
  };
  absl::StatusOr<HostClaims> claims = ClaimHost(config, rank);
  if (!claims.ok()) fatal(claims.status());
  int exit_code = 0;
  {
    Daemon daemon(config, collective->get(), &*claims);
    if (absl::Status s = daemon.Start(); !s.ok()) fatal(s);
    exit_code = daemon.RunUntilStopped(stop);
  }
  collective->reset();
  spdlog::info("ckptd stopped");
  return exit_code;
}
