// A real ckptd job for integration tests: `mpirun -np N ckptd` over a fresh temp
// directory, one unix socket per rank, and helpers to run trainers as threads.
// Owned by one test; not thread-safe itself (clients it hands out are).
#ifndef CKPTD_TESTS_INTEGRATION_CLUSTER_H_
#define CKPTD_TESTS_INTEGRATION_CLUSTER_H_

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "ckptd/client.h"
#include "tests/common/temp_dir.h"

namespace ckptd::testing {

class Cluster {
 public:
  // `root` empty: a root inside the cluster's own temp directory.
  explicit Cluster(int ranks, std::string root = "", std::vector<std::string> extra_args = {})
      : ranks_(ranks), root_(std::move(root)), extra_args_(std::move(extra_args)) {}
  ~Cluster();

  // Starts the job and waits until every daemon accepts connections. If the job exits
  // first, FAILED_PRECONDITION, and exit_code() says how it exited.
  absl::Status Start();
  int exit_code() const { return exit_code_; }
  // SIGTERM to one daemon (all ranks then stop together); returns mpirun's exit code.
  int Stop();

  std::string Address(int rank) const { return dir_.Sub("sock/ckptd-" + std::to_string(rank) + ".sock"); }
  std::string root() const { return root_.empty() ? dir_.Sub("root") : root_; }
  std::string log() const { return dir_.Sub("daemons.log"); }
  const std::string& dir() const { return dir_.path(); }
  std::unique_ptr<Client> Connect(int rank) const;
  // The daemon process of `rank`, from its Status; -1 if it does not answer.
  pid_t Pid(int rank) const;
  // Waits for mpirun to exit (after a daemon was killed, say); returns its exit code.
  int WaitForExit();

 private:
  int ranks_;
  std::string root_;
  std::vector<std::string> extra_args_;
  TempDir dir_;
  pid_t mpirun_ = -1;
  int exit_code_ = -1;
};

// Runs fn(trainer) on `count` threads and returns each one's status, by trainer id.
std::vector<absl::Status> RunTrainers(int count, const std::function<absl::Status(int trainer)>& fn);

// Runs a command line; returns its exit code and, in *output, stdout and stderr.
int RunCommand(const std::string& command, std::string* output);

}  // namespace ckptd::testing

#endif  // CKPTD_TESTS_INTEGRATION_CLUSTER_H_
