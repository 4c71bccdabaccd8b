// Which of this host's addresses the other daemons of the job reach it by, for the
// peer channel the daemons bring up themselves (no tcp.address configured). Reads the
// host's interfaces (getifaddrs) and its name; called once at start-up, any thread.
#ifndef CKPTD_DAEMON_PEER_PEER_ADDRESS_H_
#define CKPTD_DAEMON_PEER_PEER_ADDRESS_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ckptd {

// One IPv4 address of an interface that is up.
struct InterfaceAddress {
  std::string interface;  // "eth0"
  std::string address;    // "10.0.0.7"
  bool loopback = false;
};
std::vector<InterfaceAddress> HostInterfaces();

// The address to listen on and announce, and why it was chosen (for the log).
struct PeerHostChoice {
  std::string address;
  std::string reason;
};

// In order:
//  1. `peer_interface` (config): an interface name ("ib0") or an IPv4 network in CIDR
//     form ("10.1.0.0/16"); INVALID_ARGUMENT naming the interfaces there are when no
//     address of this host matches.
//  2. The interfaces Open MPI was told to use for TCP (OMPI_MCA_btl_tcp_if_include,
//     then OMPI_MCA_oob_tcp_if_include, as mpirun's --mca passes them): the first
//     entry that matches an address here.
//  3. `one_host` (every rank of the job runs on this host): loopback.
//  4. The address this host's name resolves to, if it is one of its interfaces and
//     not loopback (the address the job's host file names).
//  5. The first non-loopback interface's address.
// FAILED_PRECONDITION when none is left (a job across hosts with loopback only).
absl::StatusOr<PeerHostChoice> ChoosePeerHost(const std::string& peer_interface, bool one_host,
                                              const std::vector<InterfaceAddress>& interfaces,
                                              const std::map<std::string, std::string>& environment,
                                              const std::vector<std::string>& name_addresses);

// The IPv4 addresses `host_name` resolves to (getaddrinfo); empty when it does not.
std::vector<std::string> ResolveHostName(const std::string& host_name);

// Whether `spec` is an interface name or CIDR network that `candidate` matches.
bool InterfaceMatches(const std::string& spec, const InterfaceAddress& candidate);

}  // namespace ckptd

#endif  // CKPTD_DAEMON_PEER_PEER_ADDRESS_H_
