#include "tests/integration/cluster.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "absl/strings/str_cat.h"
#include "daemon/io/file_system.h"

namespace ckptd::testing {

namespace {

constexpr char kHostsSubnet[] = "10.213.77.0/24";  // tests/multihost/hosts.sh

std::string HostsScript() { return std::string(CKPTD_SOURCE_DIR) + "/tests/multihost/hosts.sh"; }

}  // namespace

Cluster::Cluster(int ranks, SimulatedHosts hosts, std::vector<std::string> extra_args)
    : ranks_(ranks), hosts_(hosts), extra_args_(std::move(extra_args)) {
  // Seen by every daemon at the same path: the shared directory, or each host's disk.
  root_ = dir_.Sub(hosts.root_on_host_disks.value_or(hosts.local_storage) ? "disk/root" : "shared/root");
  extra_args_.insert(extra_args_.begin(), {"--storage", hosts.local_storage ? "local" : "shared"});
}

Cluster::~Cluster() {
  if (mpirun_ > 0) {
    ::kill(-mpirun_, SIGKILL);
    ::waitpid(mpirun_, nullptr, 0);
  }
  if (hosts_up_) {
    std::string ignored;
    RunCommand(absl::StrCat("bash ", HostsScript(), " down ", dir_.path()), &ignored);
  }
}

void Cluster::Resize(int hosts) {
  if (hosts_up_) {
    std::string ignored;
    RunCommand(absl::StrCat("bash ", HostsScript(), " down ", dir_.path()), &ignored);
    hosts_up_ = false;
  }
  hosts_->hosts = hosts;
  ranks_ = hosts;
}

std::string Cluster::HostRoot(int host) const {
  if (!hosts_.has_value() || !hosts_->root_on_host_disks.value_or(hosts_->local_storage)) return root();
  return dir_.Sub(absl::StrCat("host", host, "/root"));
}

std::vector<std::string> Cluster::EnterHost(int host) const {
  // The host's holder process keeps its namespaces.
  std::string pid = PosixFileSystem()->ReadFileToString(dir_.Sub(absl::StrCat("pid", host)), 64).value_or("");
  pid.erase(pid.find_last_not_of(" \n") + 1);
  return {"/usr/bin/nsenter", "-t", pid, "-n", "-u", "-m", "--"};
}

std::vector<std::string> Cluster::JobCommand() const {
  std::vector<std::string> args;
  if (hosts_.has_value()) args = EnterHost(0);  // mpirun runs on host 0
  args.insert(args.end(), {MPIEXEC, "--allow-run-as-root", "--oversubscribe", "-np", std::to_string(ranks_)});
  if (hosts_.has_value()) {
    args.insert(args.end(),
                {"--map-by", "node", "--hostfile", dir_.Sub("hostfile"), "--mca", "plm_rsh_agent",
                 dir_.Sub("agent"), "--mca", "btl", "tcp,self", "--mca", "pml", "ob1", "--mca",
                 "btl_tcp_if_include", kHostsSubnet, "--mca", "oob_tcp_if_include", kHostsSubnet});
  }
  args.insert(args.end(), {CKPTD_BINARY, "--root", root(), "--socket", dir_.Sub("sock/ckptd-{rank}.sock"),
                           "--commit-timeout", "60s"});
  args.insert(args.end(), extra_args_.begin(), extra_args_.end());  // later flags win
  return args;
}

absl::Status Cluster::Start() {
  if (hosts_.has_value() && !hosts_up_) {
    std::string out;
    const int rc = RunCommand(absl::StrCat("CKPTD_HOSTS_OWNER=", ::getpid(), " bash ", HostsScript(), " up ",
                                           hosts_->hosts, " ", dir_.path()),
                              &out);
    if (rc != 0) return absl::FailedPreconditionError(absl::StrCat("simulated hosts did not come up: ", out));
    hosts_up_ = true;
  }
  const std::string log_path = log();
  std::vector<std::string> args = JobCommand();
  mpirun_ = ::fork();
  if (mpirun_ < 0) return absl::InternalError("fork failed");
  if (mpirun_ == 0) {
    ::setpgid(0, 0);  // its own group, so teardown can kill the whole job
    // Under AddressSanitizer, leak reports of a daemon are dominated by what Open
    // MPI's dlopen'ed components keep (unsymbolizable once MPI_Finalize unloads
    // them); memory errors still abort. In-process suites keep leak checking on.
    if (const char* asan = std::getenv("ASAN_OPTIONS"); asan != nullptr) {
      ::setenv("ASAN_OPTIONS", (std::string(asan) + ":detect_leaks=0").c_str(), 1);
    }
    int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::setpgid(mpirun_, mpirun_);
  // Connects to every daemon; a job that exits first (a daemon refused to start) is
  // reported with its exit code at once instead of after the connect timeout.
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  for (int rank = 0; rank < ranks_; ++rank) {
    while (true) {
      auto client = Client::Connect(Address(rank), absl::Milliseconds(250));
      if (client.ok()) break;
      int wstatus = 0;
      if (::waitpid(mpirun_, &wstatus, WNOHANG) == mpirun_) {
        mpirun_ = -1;
        exit_code_ = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 128 + WTERMSIG(wstatus);
        return absl::FailedPreconditionError(absl::StrCat("the daemons exited with status ", exit_code_,
                                                          " before rank ", rank, " answered; see ", log()));
      }
      if (absl::Now() > deadline) return client.status();
    }
  }
  return absl::OkStatus();
}

std::unique_ptr<Client> Cluster::Connect(int rank) const {
  auto client = Client::Connect(Address(rank), absl::Seconds(30));
  return client.ok() ? std::move(*client) : nullptr;
}

pid_t Cluster::Pid(int rank) const {
  if (auto client = Connect(rank); client != nullptr) {
    if (auto status = client->Status(); status.ok()) return static_cast<pid_t>(status->pid());
  }
  return -1;
}

int Cluster::Stop() {
  if (mpirun_ <= 0) return -1;
  const pid_t daemon = Pid(0);
  if (daemon > 0) ::kill(daemon, SIGTERM);
  return WaitForExit();
}

int Cluster::WaitForExit() {
  if (mpirun_ <= 0) return -1;
  int wstatus = 0;
  ::waitpid(mpirun_, &wstatus, 0);
  mpirun_ = -1;
  return WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 128 + WTERMSIG(wstatus);
}

std::vector<absl::Status> RunTrainers(int count, const std::function<absl::Status(int trainer)>& fn) {
  std::vector<absl::Status> results(count);
  std::vector<std::thread> threads;
  for (int t = 0; t < count; ++t) threads.emplace_back([&, t] { results[t] = fn(t); });
  for (std::thread& th : threads) th.join();
  return results;
}

int RunCommand(const std::string& command, std::string* output) {
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return -1;
  std::array<char, 4096> buf;
  output->clear();
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), pipe)) > 0) output->append(buf.data(), n);
  int status = ::pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace ckptd::testing
