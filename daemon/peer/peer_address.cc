#include "daemon/peer/peer_address.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>

#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "daemon/base/ipv4_network.h"

namespace ckptd {

std::vector<InterfaceAddress> HostInterfaces() {
  std::vector<InterfaceAddress> found;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return found;
  for (ifaddrs* entry = list; entry != nullptr; entry = entry->ifa_next) {
    if (entry->ifa_addr == nullptr || entry->ifa_addr->sa_family != AF_INET ||
        (entry->ifa_flags & IFF_UP) == 0)
      continue;
    char text[INET_ADDRSTRLEN];
    const auto* ipv4 = reinterpret_cast<const sockaddr_in*>(entry->ifa_addr);
    if (::inet_ntop(AF_INET, &ipv4->sin_addr, text, sizeof text) == nullptr) continue;
    found.push_back({entry->ifa_name, text, (entry->ifa_flags & IFF_LOOPBACK) != 0});
  }
  ::freeifaddrs(list);
  return found;
}

std::vector<std::string> ResolveHostName(const std::string& host_name) {
  std::vector<std::string> addresses;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  if (::getaddrinfo(host_name.c_str(), nullptr, &hints, &result) != 0) return addresses;
  for (addrinfo* entry = result; entry != nullptr; entry = entry->ai_next) {
    char text[INET_ADDRSTRLEN];
    const auto* ipv4 = reinterpret_cast<const sockaddr_in*>(entry->ai_addr);
    if (::inet_ntop(AF_INET, &ipv4->sin_addr, text, sizeof text) != nullptr) addresses.push_back(text);
  }
  ::freeaddrinfo(result);
  return addresses;
}

bool InterfaceMatches(const std::string& spec, const InterfaceAddress& candidate) {
  if (spec.find('/') == std::string::npos) return spec == candidate.interface;
  const std::optional<Ipv4Network> network = ParseIpv4Network(spec);
  const std::optional<uint32_t> address = ParseIpv4(candidate.address);
  return network && address && network->Contains(*address);
}

absl::StatusOr<PeerHostChoice> ChoosePeerHost(const std::string& peer_interface, bool one_host,
                                              const std::vector<InterfaceAddress>& interfaces,
                                              const std::map<std::string, std::string>& environment,
                                              const std::vector<std::string>& name_addresses) {
  if (!peer_interface.empty()) {
    for (const InterfaceAddress& candidate : interfaces) {
      if (InterfaceMatches(peer_interface, candidate)) {
        return PeerHostChoice{candidate.address, absl::StrCat("peer_interface ", peer_interface, " (",
                                                              candidate.interface, ")")};
      }
    }
    std::vector<std::string> there;
    for (const InterfaceAddress& c : interfaces) there.push_back(absl::StrCat(c.interface, " ", c.address));
    return absl::InvalidArgumentError(absl::StrCat(
        "peer_interface '", peer_interface, "' matches no interface with an IPv4 address on this host (",
        there.empty() ? "none" : absl::StrJoin(there, ", "), ")"));
  }
  for (const char* variable : {"OMPI_MCA_btl_tcp_if_include", "OMPI_MCA_oob_tcp_if_include"}) {
    auto value = environment.find(variable);
    if (value == environment.end()) continue;
    for (absl::string_view spec : absl::StrSplit(value->second, ',', absl::SkipWhitespace())) {
      for (const InterfaceAddress& candidate : interfaces) {
        if (InterfaceMatches(std::string(absl::StripAsciiWhitespace(spec)), candidate)) {
          return PeerHostChoice{candidate.address, absl::StrCat("Open MPI's TCP interface ",
                                                                candidate.interface, " (", variable, ")")};
        }
      }
    }
  }
  if (one_host) return PeerHostChoice{"127.0.0.1", "every rank of the job runs on this host"};
  for (const std::string& named : name_addresses) {
    for (const InterfaceAddress& candidate : interfaces) {
      if (!candidate.loopback && candidate.address == named) {
        return PeerHostChoice{named,
                              absl::StrCat("the address of this host's name (", candidate.interface, ")")};
      }
    }
  }
  for (const InterfaceAddress& candidate : interfaces) {
    if (!candidate.loopback) {
      return PeerHostChoice{candidate.address,
                            absl::StrCat("the first interface that is up, ", candidate.interface,
                                         " (peer_interface chooses another)")};
    }
  }
  return absl::FailedPreconditionError(
      "the job runs on several hosts but this one has no network interface with an IPv4 address other than "
      "loopback for the peer channel; set peer_interface, or tcp.address with certificates");
}

}  // namespace ckptd
