// The job's own peer-channel credentials, for daemons whose operator provisioned none:
// an in-memory certificate authority (made by rank 0 at start, never written anywhere)
// that issues each rank a certificate for a key the rank made itself. The private keys
// never leave their process; only public keys and certificates travel, over MPI.
// Pure functions and a value type; any thread. OpenSSL is used only here.
#ifndef CKPTD_DAEMON_PEER_JOB_CREDENTIALS_H_
#define CKPTD_DAEMON_PEER_JOB_CREDENTIALS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ckptd {

// The name every job certificate carries (subjectAltName DNS) and that peers check
// instead of the address they dial: daemons reach each other by IP address, and one
// name that only the job's CA signs is what identifies a member of the job.
inline constexpr char kJobPeerName[] = "ckptd-peer.job";

// A key pair (EC P-256), as PEM: the private key stays with its maker.
struct PeerKey {
  std::string private_pem;
  std::string public_pem;
};
absl::StatusOr<PeerKey> NewPeerKey();

// The job's certificate authority. Holds its private key in memory only.
class JobCertificateAuthority {
 public:
  // A self-signed CA certificate, valid from an hour ago (clocks across hosts differ)
  // for `lifetime`, named after the job (`job` goes into its common name).
  static absl::StatusOr<JobCertificateAuthority> Create(const std::string& job, absl::Duration lifetime);
  JobCertificateAuthority(JobCertificateAuthority&&) noexcept;
  JobCertificateAuthority& operator=(JobCertificateAuthority&&) noexcept;
  ~JobCertificateAuthority();

  const std::string& certificate_pem() const { return certificate_pem_; }
  // A certificate for `public_pem` (from NewPeerKey) that serves as both a TLS server
  // and client certificate under kJobPeerName; `rank` and `host` go into its common
  // name, for logs. INVALID_ARGUMENT when the key does not parse.
  absl::StatusOr<std::string> Issue(const std::string& public_pem, int rank, const std::string& host) const;

 private:
  struct Key;
  JobCertificateAuthority(std::unique_ptr<Key> key, std::string certificate_pem, absl::Duration lifetime);
  std::unique_ptr<Key> key_;
  std::string certificate_pem_;
  absl::Duration lifetime_;
};

// Whether `certificate_pem` chains to `ca_pem` and names kJobPeerName (for tests and
// for a start-up self-check); the error says why not.
absl::Status CheckJobCertificate(const std::string& certificate_pem, const std::string& ca_pem);

}  // namespace ckptd

#endif  // CKPTD_DAEMON_PEER_JOB_CREDENTIALS_H_
