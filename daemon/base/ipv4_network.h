// IPv4 addresses and networks in text ("10.1.4.7", "10.1.0.0/16"): what the config check
// of peer_interface and the daemon's choice of peer address both parse. Pure; any thread.
#ifndef CKPTD_DAEMON_BASE_IPV4_NETWORK_H_
#define CKPTD_DAEMON_BASE_IPV4_NETWORK_H_

#include <cstdint>
#include <optional>
#include <string>

namespace ckptd {

// A dotted-quad address in host byte order, or nullopt.
std::optional<uint32_t> ParseIpv4(const std::string& text);

struct Ipv4Network {
  uint32_t address = 0;
  int bits = 0;  // 0..32
  bool Contains(uint32_t ip) const {
    const uint32_t mask = bits == 0 ? 0 : ~uint32_t{0} << (32 - bits);
    return (address & mask) == (ip & mask);
  }
};

// "A.B.C.D/BITS" with BITS 0..32, or nullopt.
std::optional<Ipv4Network> ParseIpv4Network(const std::string& text);

}  // namespace ckptd

#endif  // CKPTD_DAEMON_BASE_IPV4_NETWORK_H_
