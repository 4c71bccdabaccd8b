// The tiers' start-up work that involves the host or the other daemons: claiming the
// drain root, and meeting the peers over MPI.
#include <limits.h>
#include <spdlog/spdlog.h>
#include <stdlib.h>
#include <unistd.h>

#include <map>
#include <optional>
#include <random>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "daemon/base/status.h"
#include "daemon/coord/parity.h"
#include "daemon/coord/replicas.h"
#include "daemon/io/private_dir.h"
#include "daemon/peer/job_credentials.h"
#include "daemon/peer/peer_address.h"
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

namespace {

// The Open MPI settings in this process's environment (ChoosePeerHost reads them).
std::map<std::string, std::string> OpenMpiEnvironment() {
  std::map<std::string, std::string> variables;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    const absl::string_view text(*entry);
    if (!absl::StartsWith(text, "OMPI_MCA_")) continue;
    const size_t equals = text.find('=');
    if (equals != absl::string_view::npos)
      variables.emplace(std::string(text.substr(0, equals)), std::string(text.substr(equals + 1)));
  }
  return variables;
}

// Rank 0 certifies every rank's public key with a CA made now, in memory, and sends the
// certificates to every rank; each rank gets the CA and its own certificate, beside
// its own key. A rank 0 that cannot issue sends nothing, so every rank fails at start.
absl::StatusOr<TlsPem> IssueJobCertificates(int rank, const std::vector<internal::PeerInfo>& all,
                                            const PeerKey& key, Coordinator& coordinator) {
  // A job may run for months; the certificates die with it.
  constexpr absl::Duration kLifetime = absl::Hours(24 * 400);
  absl::Status issued = absl::OkStatus();
  internal::JobCertificates certificates;
  if (rank == 0) {
    issued = [&]() -> absl::Status {
      ASSIGN_OR_RETURN(
          JobCertificateAuthority ca,
          JobCertificateAuthority::Create(absl::StrCat(HostName(), " pid ", ::getpid()), kLifetime));
      certificates.set_ca(ca.certificate_pem());
      for (size_t r = 0; r < all.size(); ++r) {
        ASSIGN_OR_RETURN(*certificates.add_certificates(),
                         ca.Issue(all[r].public_key(), static_cast<int>(r), all[r].host()));
      }
      return absl::OkStatus();
    }();
    if (!issued.ok()) certificates.Clear();
  }
  ASSIGN_OR_RETURN(std::string shared, coordinator.ShareFromRankZero(certificates.SerializeAsString()));
  RETURN_IF_ERROR(issued);
  internal::JobCertificates received;
  if (!received.ParseFromString(shared) || received.certificates_size() != static_cast<int>(all.size()) ||
      received.ca().empty()) {
    return absl::FailedPreconditionError(
        "rank 0 could not make the job's peer certificates (see its log); the peer channel cannot start");
  }
  return TlsPem{.cert = received.certificates(rank), .key = key.private_pem, .ca = received.ca()};
}

}  // namespace

absl::Status StorageTiers::MeetPeers(const PeerSetUp& mine, Coordinator& coordinator, ShardCopier* copier) {
  if (!NeedsPeers()) return absl::OkStatus();
  internal::PeerInfo info;
  info.set_host(HostName());
  std::optional<PeerKey> key;
  if (mine.tcp_port != 0) {
    std::string host = mine.tcp_address.substr(0, mine.tcp_address.rfind(':'));
    if (host == "0.0.0.0" || host == "[::]" || host.empty()) host = HostName();
    info.set_address(absl::StrCat(host, ":", mine.tcp_port));
  } else {
    ASSIGN_OR_RETURN(key, NewPeerKey());
    info.set_public_key(key->public_pem);
  }
  // 128 random bits as hex: gRPC metadata values must be printable.
  std::random_device random;
  info.set_token(absl::StrFormat("%08x%08x%08x%08x", random(), random(), random(), random()));
  ASSIGN_OR_RETURN(std::vector<internal::PeerInfo> all, coordinator.ExchangePeerInfo(info));
  std::vector<std::string> listening, not_listening, hosts;
  for (const internal::PeerInfo& p : all) {
    (p.address().empty() ? not_listening : listening).push_back(p.host());
    hosts.push_back(p.host());
  }
  if (!listening.empty() && !not_listening.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("tcp.address is set on ", JoinBounded(listening),
                                                      " but not on ", JoinBounded(not_listening),
                                                      ": set it (with its certificates) on every host, or on "
                                                      "none and the daemons make their own peer channel"));
  }
  const bool one_host = std::set<std::string>(hosts.begin(), hosts.end()).size() == 1;
  std::vector<std::string> addresses;
  TlsPem pem;
  std::string peer_name;  // the name peers' certificates are checked against, if not their address
  if (not_listening.empty()) {
    for (const internal::PeerInfo& p : all) addresses.push_back(p.address());
    ASSIGN_OR_RETURN(pem, ReadTlsFiles(PosixFileSystem(), mine.tls));
  } else {
    // Every rank decides alike, from the same gathered infos.
    const bool wanted = all.size() >= 2 && (local_storage() || !one_host || mine.replicas > 0);
    if (!wanted && mine.parity > 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("redundancy: parity needs at least ", mine.parity + 1, " hosts; this job has one"));
    }
    if (!wanted) return absl::OkStatus();
    ASSIGN_OR_RETURN(pem, IssueJobCertificates(mine.rank, all, *key, coordinator));
    ASSIGN_OR_RETURN(PeerHostChoice choice,
                     ChoosePeerHost(mine.peer_interface, one_host, HostInterfaces(), OpenMpiEnvironment(),
                                    ResolveHostName(HostName())));
    ASSIGN_OR_RETURN(const int port, mine.start_peer_listener(choice.address, pem));
    spdlog::info(
        "peer channel on {}:{}, chosen as {}: mutual TLS with certificates from the job's own CA (made "
        "in memory at start; tcp.address with certificates replaces it)",
        choice.address, port, choice.reason);
    info.set_address(absl::StrCat(choice.address, ":", port));
    info.clear_public_key();
    ASSIGN_OR_RETURN(std::vector<internal::PeerInfo> listeners, coordinator.ExchangePeerInfo(info));
    for (const internal::PeerInfo& p : listeners) addresses.push_back(p.address());
    peer_name = kJobPeerName;
  }
  // Replicas go to other failure domains: a host's own name unless the config maps it.
  std::vector<std::string> domains;
  for (const std::string& host : hosts) {
    auto mapped = mine.failure_domains.find(host);
    domains.push_back(mapped == mine.failure_domains.end() ? host : mapped->second);
  }
  RETURN_IF_ERROR(peer_directory_.Set(mine.rank, std::move(addresses), std::move(hosts), all[0].token(),
                                      std::move(pem), std::move(peer_name)));
  if (mine.parity > 0) return PlaceParity(mine, domains, coordinator, copier);
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

absl::Status StorageTiers::PlaceParity(const PeerSetUp& mine, const std::vector<std::string>& domains,
                                       Coordinator& coordinator, ShardCopier* copier) {
  ASSIGN_OR_RETURN(ParityGroups groups, PlaceParityGroups(domains, mine.parity_group, mine.parity));
  const std::vector<int>& members = groups.members[groups.group_of[mine.rank]];
  std::vector<std::string> named;
  for (int member : members) named.push_back(peer_directory_.Describe(member));
  const int k = static_cast<int>(members.size()) - mine.parity;
  spdlog::info(
      "parity: {} of {} hosts may be lost per group (space: {}/{} of the data); this host's group: {}{}",
      mine.parity, members.size(), mine.parity, k, absl::StrJoin(named, ", "),
      groups.note.empty() ? "" : absl::StrCat(" (", groups.note, ")"));
  if (!groups.note.empty() && mine.rank == 0) spdlog::warn("parity: {}", groups.note);
  coordinator.SetParity(std::move(groups), mine.parity, copier);
  return absl::OkStatus();
}

}  // namespace ckptd
