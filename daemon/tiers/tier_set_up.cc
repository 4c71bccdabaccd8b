// The tiers' start-up work that involves the host or the other daemons: claiming the
// drain root, and meeting the peers over MPI.
#include <limits.h>
#include <spdlog/spdlog.h>
#include <stdlib.h>

#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "daemon/base/status.h"
#include "daemon/coord/replicas.h"
#include "daemon/io/private_dir.h"
#include "daemon/tiers/storage_tiers.h"

namespace ckptd {

absl::StatusOr<DrainRootClaim> ClaimDrainRoot(const std::string& drain_to, gid_t group) {
  DrainRootClaim claim;
  if (drain_to.empty()) return claim;
  RETURN_IF_ERROR(PreparePrivateDirectory(drain_to, group, "drain_to"));
  ASSIGN_OR_RETURN(claim.fs,
                   ConfinedFileSystem(drain_to, group == kNoGroup ? kPrivateFileMode : kGroupFileMode));
  char resolved[PATH_MAX];
  claim.path = ::realpath(drain_to.c_str(), resolved) != nullptr ? std::string(resolved) : drain_to;
  return claim;
}

absl::Status StorageTiers::MeetPeers(const PeerSetUp& mine, Coordinator& coordinator, ShardCopier* copier) {
  if (!NeedsPeers()) return absl::OkStatus();
  internal::PeerInfo info;
  info.set_host(HostName());
  if (mine.tcp_port != 0) {
    std::string host = mine.tcp_address.substr(0, mine.tcp_address.rfind(':'));
    if (host == "0.0.0.0" || host == "[::]" || host.empty()) host = HostName();
    info.set_address(absl::StrCat(host, ":", mine.tcp_port));
  }
  // 128 random bits as hex: gRPC metadata values must be printable.
  std::random_device random;
  info.set_token(absl::StrFormat("%08x%08x%08x%08x", random(), random(), random(), random()));
  ASSIGN_OR_RETURN(std::vector<internal::PeerInfo> all, coordinator.ExchangePeerInfo(info));
  std::vector<std::string> addresses, hosts;
  for (const internal::PeerInfo& p : all) {
    if (p.address().empty()) {
      spdlog::info("no TCP listener on host {}: restores read {} from storage{}", p.host(),
                   local_storage() ? "this host's shards only" : "what they need",
                   options_.read_once ? " (read_once needs tcp.address on every host)" : "");
      return absl::OkStatus();
    }
    addresses.push_back(p.address());
    hosts.push_back(p.host());
  }
  // Replicas go to other failure domains: a host's own name unless the config maps it.
  std::vector<std::string> domains;
  for (const std::string& host : hosts) {
    auto mapped = mine.failure_domains.find(host);
    domains.push_back(mapped == mine.failure_domains.end() ? host : mapped->second);
  }
  RETURN_IF_ERROR(peer_directory_.Set(mine.rank, std::move(addresses), std::move(hosts), all[0].token(),
                                      mine.tls, PosixFileSystem()));
  if (mine.replicas == 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::vector<std::vector<int>> copies, PlaceReplicas(domains, mine.replicas));
  std::vector<std::string> mine_elsewhere;
  for (int holder : copies[mine.rank]) mine_elsewhere.push_back(peer_directory_.Describe(holder));
  spdlog::info("replicas: {}; this host's data files are also kept on {}", mine.replicas,
               absl::StrJoin(mine_elsewhere, ", "));
  peer_directory_.SetCopies(copies);
  coordinator.SetReplicas(std::move(copies), copier);
  return absl::OkStatus();
}

}  // namespace ckptd
