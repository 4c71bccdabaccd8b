#include "daemon/peer/credentials.h"

#include <grp.h>
#include <grpcpp/security/server_credentials.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "daemon/base/status.h"

namespace ckptd {

absl::StatusOr<TlsPem> ReadTlsFiles(FileSystem* fs, const TlsFilePaths& files) {
  constexpr uint64_t kMaxPem = 1 << 20;
  TlsPem pem;
  ASSIGN_OR_RETURN(pem.cert, fs->ReadFileToString(files.cert, kMaxPem));
  ASSIGN_OR_RETURN(pem.key, fs->ReadFileToString(files.key, kMaxPem));
  ASSIGN_OR_RETURN(pem.ca, fs->ReadFileToString(files.ca, kMaxPem));
  return pem;
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MutualTlsCredentials(FileSystem* fs,
                                                                              const TlsFilePaths& files) {
  ASSIGN_OR_RETURN(TlsPem pem, ReadTlsFiles(fs, files));
  return MutualTlsCredentials(std::move(pem));
}

std::shared_ptr<grpc::ServerCredentials> MutualTlsCredentials(TlsPem pem) {
  grpc::SslServerCredentialsOptions options(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  options.pem_root_certs = std::move(pem.ca);
  options.pem_key_cert_pairs.push_back({std::move(pem.key), std::move(pem.cert)});
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
