// A real ckptd job for integration tests: `mpirun -np N ckptd` over a fresh temp
// directory, one unix socket per rank, and helpers to run trainers as threads.
// With SimulatedHosts, the ranks are spread (by node) over simulated hosts made by
// tests/multihost/hosts.sh: Open MPI over TCP between network namespaces, each host
// with its own hostname and its own "local disk". Sockets stay reachable from the
// test, which runs outside the namespaces.
// Owned by one test; not thread-safe itself (clients it hands out are).
#ifndef CKPTD_TESTS_INTEGRATION_CLUSTER_H_
#define CKPTD_TESTS_INTEGRATION_CLUSTER_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "ckptd/client.h"
#include "tests/common/temp_dir.h"

namespace ckptd::testing {

// Where a multi-host job keeps its checkpoints: one root on a directory every host
// sees (--storage shared), or each host's own disk (--storage local).
struct SimulatedHosts {
  int hosts = 2;
  bool local_storage = false;  // --storage local, else shared
  // Whether the root lies on each host's own disk; by default exactly when storage
  // is local. Set otherwise to test a misconfiguration.
  std::optional<bool> root_on_host_disks{};
};

class Cluster {
 public:
  // `root` empty: a root inside the cluster's own temp directory.
  explicit Cluster(int ranks, std::string root = "", std::vector<std::string> extra_args = {})
      : ranks_(ranks), root_(std::move(root)), extra_args_(std::move(extra_args)) {}
  // `ranks` daemons over simulated hosts; rank r runs on host r % hosts.hosts.
  Cluster(int ranks, SimulatedHosts hosts, std::vector<std::string> extra_args = {});
  ~Cluster();

  // Starts the job and waits until every daemon accepts connections. If the job exits
  // first, FAILED_PRECONDITION, and exit_code() says how it exited.
  absl::Status Start();
  int exit_code() const { return exit_code_; }
  // SIGTERM to one daemon (all ranks then stop together); returns mpirun's exit code.
  int Stop();
  // Simulated hosts, while the job is stopped: the next Start runs one daemon on each
  // of host0..host(hosts-1), with the same disks (a host beyond the old count gets its
  // disk back if it had one: wipe HostRoot first for a fresh host).
  void Resize(int hosts);
  // More daemon flags, from the next Start on (for paths inside dir()).
  void AddArgs(const std::vector<std::string>& args) {
    extra_args_.insert(extra_args_.end(), args.begin(), args.end());
  }

  std::string Address(int rank) const { return dir_.Sub("sock/ckptd-" + std::to_string(rank) + ".sock"); }
  // The root as the daemons see it.
  std::string root() const { return root_.empty() ? dir_.Sub("root") : root_; }
  // The root as the test sees host `host`'s copy: its own disk with local storage.
  std::string HostRoot(int host) const;
  int hosts() const { return hosts_.has_value() ? hosts_->hosts : 1; }
  std::string log() const { return dir_.Sub("daemons.log"); }
  // Simulated hosts, once started: the command prefix that runs a command inside
  // host `host`'s network, UTS and mount namespaces.
  std::vector<std::string> EnterHost(int host) const;
  const std::string& dir() const { return dir_.path(); }
  std::unique_ptr<Client> Connect(int rank) const;
  // The daemon process of `rank`, from its Status; -1 if it does not answer.
  pid_t Pid(int rank) const;
  // Waits for mpirun to exit (after a daemon was killed, say); returns its exit code.
  int WaitForExit();

 private:
  // The command line that starts the job (mpirun inside host 0 with simulated hosts).
  std::vector<std::string> JobCommand() const;

  int ranks_;
  std::optional<SimulatedHosts> hosts_;
  bool hosts_up_ = false;
  std::string root_;
  std::vector<std::string> extra_args_;
  TempDir dir_;
  pid_t mpirun_ = -1;
  int exit_code_ = -1;
};

// The client API's form of a daemon Shape or Box start/length (the daemon keeps
// them inline; the client takes std::vector).
template <typename Dims>
std::vector<int64_t> AsVector(const Dims& dims) {
  return std::vector<int64_t>(dims.begin(), dims.end());
}

// Runs fn(trainer) on `count` threads and returns each one's status, by trainer id.
std::vector<absl::Status> RunTrainers(int count, const std::function<absl::Status(int trainer)>& fn);

// Runs a command line; returns its exit code and, in *output, stdout and stderr.
int RunCommand(const std::string& command, std::string* output);

}  // namespace ckptd::testing

#endif  // CKPTD_TESTS_INTEGRATION_CLUSTER_H_
