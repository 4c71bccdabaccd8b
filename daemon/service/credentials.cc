#include "daemon/service/credentials.h"

#include <grp.h>
#include <grpcpp/security/server_credentials.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "daemon/base/status.h"

namespace ckptd {

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MutualTlsCredentials(FileSystem* fs,
                                                                              const std::string& cert,
                                                                              const std::string& key,
                                                                              const std::string& ca) {
  constexpr uint64_t kMaxPem = 1 << 20;
  ASSIGN_OR_RETURN(std::string cert_pem, fs->ReadFileToString(cert, kMaxPem));
  ASSIGN_OR_RETURN(std::string key_pem, fs->ReadFileToString(key, kMaxPem));
  ASSIGN_OR_RETURN(std::string ca_pem, fs->ReadFileToString(ca, kMaxPem));
  grpc::SslServerCredentialsOptions options(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  options.pem_root_certs = ca_pem;
  options.pem_key_cert_pairs.push_back({key_pem, cert_pem});
  return grpc::SslServerCredentials(options);
}

absl::StatusOr<gid_t> ResolveGroup(const std::string& group) {
  uint32_t gid = 0;
  if (absl::SimpleAtoi(group, &gid)) return static_cast<gid_t>(gid);
  struct group* entry = ::getgrnam(group.c_str());
  if (entry == nullptr)
    return absl::InvalidArgumentError(absl::StrCat("security.socket_group: no group '", group, "'"));
  return entry->gr_gid;
}

}  // namespace ckptd
