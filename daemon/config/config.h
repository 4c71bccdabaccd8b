// The daemon's configuration: a plain value, parsed from YAML text and then overridden
// by flags, every key declared once in config_keys.cc (config/ckptd.yaml documents
// them all). Parse and validation are pure functions; any thread.
#ifndef CKPTD_DAEMON_CONFIG_CONFIG_H_
#define CKPTD_DAEMON_CONFIG_CONFIG_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "daemon/base/storage_mode.h"

namespace ckptd {

struct DaemonConfig {
  // Unix socket path; "{rank}" becomes the daemon's MPI rank, "{uid}" its user id.
  std::string socket_path = "/tmp/ckptd-{uid}/ckptd-{rank}.sock";
  // Checkpoints go to <root>/<run>/step-NNNNNNNN/; "{rank}" and "{uid}" as in
  // socket_path (so that ranks sharing a machine can each have a root in local mode).
  std::string root = "/tmp/ckptd-checkpoints";
  Storage storage = Storage::kShared;
  // Local storage: before a step commits, each host's data file is also copied to this
  // many partner hosts (never two copies on one host, nor in one failure domain), so a
  // step survives the loss of up to `replicas` hosts. Needs storage local.
  int replicas = 0;
  // "none", or "parity": local storage, and hosts form groups of about parity_group;
  // each group keeps `parity` Reed-Solomon parity chunks per stripe of its data files
  // on its own hosts, so a step survives the loss of up to `parity` hosts per group
  // at parity / (parity_group - parity) of the data in extra space. Exclusive with
  // replicas.
  std::string redundancy = "none";
  int parity_group = 4;
  int parity = 1;
  // Host name -> failure domain (a rack, a switch); hosts not named are their own.
  std::map<std::string, std::string> failure_domains;
  // Drain: committed steps are also copied, in the background, into this directory (a
  // shared or remote-mounted file system every host sees), as complete TF
  // checkpoints; restore falls back to them. Empty = no drain.
  std::string drain_to;
  int64_t drain_bandwidth = 0;  // bytes per second per host; 0 = unthrottled
  int drain_keep_last = 0;      // the drain's retention: newest N drained steps (0 = all)
  int drain_every_n_steps = 0;  // drain only steps divisible by N (0 or 1 = every step)
  // Keep this daemon's data files of the last N committed steps in staging memory, so
  // that restores after a trainer restart read memory, not disk (0 = none). Kept steps
  // give way to new saves when staging memory runs short.
  int memory_steps = 0;
  // Restores read each data file of a step from storage once for the whole job: the
  // daemon of its writer's host (on a shared root, the rank that wrote it) reads it
  // and the others ask that daemon over the peer channel. Off: every daemon reads what its
  // trainers need itself.
  bool read_once = true;
  // A trainer on this host that names its tensors' memory gets its restores written
  // there by the daemon itself (process_vm_writev), where the kernel lets the daemon
  // ptrace it: no shared segment to fault in and copy out of. Off (or not permitted):
  // through the trainer's shared-memory segment.
  bool restore_into_trainer_memory = true;
  // Without tcp.address, the daemons make their own peer channel (for local storage,
  // read_once across hosts, replicas) and listen on this interface: a name ("ib0") or
  // an IPv4 network ("10.1.0.0/16"). Empty: Open MPI's TCP interface if it was told
  // one, else the address of the host's name.
  std::string peer_interface;
  // Blocks of data files read for restores stay in memory this long after their last
  // use, within read_cache bytes, so that the host's other restores and the other
  // daemons get them without another storage read (0 bytes: no cache).
  int64_t read_cache_bytes = int64_t{1} << 30;
  absl::Duration read_cache_linger = absl::Seconds(30);
  // Every collective of a commit must finish within this, else the step fails.
  absl::Duration commit_timeout = absl::Seconds(60);
  // spdlog level name: trace, debug, info, warn, error.
  std::string log_level = "info";
  // "text" (one human line each) or "json" (one JSON object per line: time, rank,
  // level, msg), for log shippers.
  std::string log_format = "text";
  // Empty: stderr. Else the file lines are appended to ("{rank}" becomes the rank);
  // SIGHUP reopens it.
  std::string log_file{};
  // Retention, applied right after each publish (by rank 0 on a shared root, by every
  // daemon on local roots): keep the newest keep_last
  // steps (0 = keep all) plus every step divisible by keep_every_n_steps (0 = none).
  int keep_last = 0;
  int keep_every_n_steps = 0;
  // security: who may use the local socket. Empty lists mean the daemon's own uid
  // and root. socket_group (a group name or number) opens the socket directory
  // 0750 and the socket 0660 to that group.
  std::vector<uint32_t> allowed_uids;
  std::vector<uint32_t> allowed_gids;
  std::string socket_group;
  // checkpoint_group (a group name or number): checkpoints become readable by that
  // group (directories 0750, files 0640); without it they are private (0700, 0600).
  std::string checkpoint_group;

  // limits: requests over these are refused before anything large is allocated.
  int64_t max_tensors_per_request = 100000;
  int64_t max_request_bytes = int64_t{64} << 30;  // declared bytes in one Save
  int max_concurrent_rpcs = 256;                  // gRPC handler threads
  int max_trainers = 16384;                       // largest trainer_count of a step or barrier
  // staging.memory_limit: host memory for staged bytes; a Save waits (up to its
  // deadline) for room rather than exceed it.
  int64_t staging_memory_limit = int64_t{16} << 30;

  // tcp: an optional TCP listener, only with mutual TLS: a server certificate and
  // key, and the CA that client certificates must chain to.
  std::string tcp_address;  // e.g. "0.0.0.0:7070"; empty = none
  // /metrics in the Prometheus text format on HOST:PORT (rank r listens on PORT + r,
  // so several daemons on one machine do not collide; port 0: any free port, shown
  // by Status). Empty: off.
  std::string metrics_address;
  std::string tls_cert, tls_key, tls_ca;

  // Largest index file the reader accepts; guards against garbage sizes.
  int64_t max_index_bytes = int64_t{1} << 30;
};

// Parses YAML text over the defaults, then ValidateConfig. Unknown keys (with the
// closest known one) and malformed values are INVALID_ARGUMENT naming the key, the
// value and what it may be, so a typo never silently falls back to a default; with
// several, the message names them all, one per line.
absl::StatusOr<DaemonConfig> ParseConfig(absl::string_view yaml_text);

// What no single key can check: combinations (replicas need local storage; a TCP
// listener needs its certificates). Run after the command line's overrides are applied.
absl::Status ValidateConfig(const DaemonConfig& config);

// The configuration as YAML that ParseConfig reads back to the same values: every
// key, in the reference's order. What `ckptd --check-config` prints.
std::string EffectiveConfigYaml(const DaemonConfig& config);

// Substitutes {rank} and {uid} in a socket path or root pattern.
std::string ExpandPathPattern(absl::string_view pattern, int rank, unsigned uid);

}  // namespace ckptd

#endif  // CKPTD_DAEMON_CONFIG_CONFIG_H_
