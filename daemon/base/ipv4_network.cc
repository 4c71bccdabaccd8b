#include "daemon/base/ipv4_network.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include "absl/strings/numbers.h"

namespace ckptd {

std::optional<uint32_t> ParseIpv4(const std::string& text) {
  in_addr address{};
  if (::inet_pton(AF_INET, text.c_str(), &address) != 1) return std::nullopt;
  return ntohl(address.s_addr);
}

std::optional<Ipv4Network> ParseIpv4Network(const std::string& text) {
  const size_t slash = text.find('/');
  if (slash == std::string::npos) return std::nullopt;
  const std::optional<uint32_t> address = ParseIpv4(text.substr(0, slash));
  int bits = -1;
  if (!address || !absl::SimpleAtoi(text.substr(slash + 1), &bits) || bits < 0 || bits > 32)
    return std::nullopt;
  return Ipv4Network{*address, bits};
}

}  // namespace ckptd
