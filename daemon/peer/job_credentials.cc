#include "daemon/peer/job_credentials.h"

#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <openssl/x509v3.h>

#include "absl/strings/str_cat.h"
#include "daemon/base/status.h"

namespace ckptd {
// Owners of OpenSSL objects (named, not anonymous: JobCertificateAuthority::Key holds two).
namespace openssl {

struct FreeKey {
  void operator()(EVP_PKEY* key) const { EVP_PKEY_free(key); }
};
struct FreeCert {
  void operator()(X509* cert) const { X509_free(cert); }
};
struct FreeBio {
  void operator()(BIO* bio) const { BIO_free(bio); }
};
struct FreeStore {
  void operator()(X509_STORE* store) const { X509_STORE_free(store); }
};
struct FreeStoreContext {
  void operator()(X509_STORE_CTX* ctx) const { X509_STORE_CTX_free(ctx); }
};
using KeyPtr = std::unique_ptr<EVP_PKEY, FreeKey>;
using CertPtr = std::unique_ptr<X509, FreeCert>;
using BioPtr = std::unique_ptr<BIO, FreeBio>;

}  // namespace openssl

namespace {

using openssl::BioPtr;
using openssl::CertPtr;
using openssl::KeyPtr;

// OpenSSL's queued errors as one line (and the queue emptied), after `what`.
absl::Status OpenSslError(absl::string_view what) {
  std::string reasons;
  for (unsigned long e = ERR_get_error(); e != 0; e = ERR_get_error()) {
    char text[256];
    ERR_error_string_n(e, text, sizeof text);
    absl::StrAppend(&reasons, reasons.empty() ? "" : "; ", text);
  }
  return absl::InternalError(absl::StrCat(what, reasons.empty() ? "" : ": ", reasons));
}

absl::StatusOr<std::string> BioText(BIO* bio) {
  char* data = nullptr;
  const long size = BIO_get_mem_data(bio, &data);
  if (size <= 0 || data == nullptr) return OpenSslError("PEM encoding");
  return std::string(data, static_cast<size_t>(size));
}

absl::StatusOr<std::string> CertificatePem(X509* cert) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  if (bio == nullptr || PEM_write_bio_X509(bio.get(), cert) != 1) return OpenSslError("PEM_write_bio_X509");
  return BioText(bio.get());
}

absl::StatusOr<CertPtr> ParseCertificate(const std::string& pem) {
  BioPtr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  CertPtr cert(bio == nullptr ? nullptr : PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  if (cert == nullptr) {
    ERR_clear_error();
    return absl::InvalidArgumentError("not a PEM certificate");
  }
  return cert;
}

absl::Status AddExtension(X509* cert, X509* issuer, int nid, const char* value) {
  X509V3_CTX ctx;
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
  if (ext == nullptr) return OpenSslError(absl::StrCat("extension ", OBJ_nid2sn(nid)));
  const int added = X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
  return added == 1 ? absl::OkStatus() : OpenSslError("X509_add_ext");
}

// A certificate for `subject_key` named `common_name`, valid from an hour ago for
// `lifetime`, with a random 127-bit serial; signed by the caller.
absl::StatusOr<CertPtr> NewCertificate(EVP_PKEY* subject_key, const std::string& common_name,
                                       absl::Duration lifetime) {
  CertPtr cert(X509_new());
  if (cert == nullptr || X509_set_version(cert.get(), 2) != 1) return OpenSslError("X509_new");
  BIGNUM* serial = BN_new();
  const bool serial_ok = serial != nullptr &&
                         BN_rand(serial, 127, BN_RAND_TOP_ANY, BN_RAND_BOTTOM_ANY) == 1 &&
                         BN_to_ASN1_INTEGER(serial, X509_get_serialNumber(cert.get())) != nullptr;
  BN_free(serial);
  if (!serial_ok) return OpenSslError("certificate serial");
  X509_NAME* name = X509_get_subject_name(cert.get());
  if (X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600) == nullptr ||
      X509_gmtime_adj(X509_getm_notAfter(cert.get()), static_cast<long>(absl::ToInt64Seconds(lifetime))) ==
          nullptr ||
      X509_set_pubkey(cert.get(), subject_key) != 1 ||
      X509_NAME_add_entry_by_txt(name, "O", MBSTRING_UTF8,
                                 reinterpret_cast<const unsigned char*>("ckptd job"), -1, -1, 0) != 1 ||
      X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8,
                                 reinterpret_cast<const unsigned char*>(common_name.c_str()), -1, -1,
                                 0) != 1) {
    return OpenSslError("certificate fields");
  }
  return cert;
}

}  // namespace

struct JobCertificateAuthority::Key {
  KeyPtr key;
  CertPtr certificate;
};

absl::StatusOr<PeerKey> NewPeerKey() {
  KeyPtr key(EVP_EC_gen("P-256"));
  if (key == nullptr) return OpenSslError("EC key generation");
  BioPtr private_bio(BIO_new(BIO_s_mem())), public_bio(BIO_new(BIO_s_mem()));
  if (private_bio == nullptr || public_bio == nullptr ||
      PEM_write_bio_PrivateKey(private_bio.get(), key.get(), nullptr, nullptr, 0, nullptr, nullptr) != 1 ||
      PEM_write_bio_PUBKEY(public_bio.get(), key.get()) != 1) {
    return OpenSslError("PEM encoding of a key");
  }
  PeerKey pair;
  ASSIGN_OR_RETURN(pair.private_pem, BioText(private_bio.get()));
  ASSIGN_OR_RETURN(pair.public_pem, BioText(public_bio.get()));
  return pair;
}

JobCertificateAuthority::JobCertificateAuthority(std::unique_ptr<Key> key, std::string certificate_pem,
                                                 absl::Duration lifetime)
    : key_(std::move(key)), certificate_pem_(std::move(certificate_pem)), lifetime_(lifetime) {}
JobCertificateAuthority::JobCertificateAuthority(JobCertificateAuthority&&) noexcept = default;
JobCertificateAuthority& JobCertificateAuthority::operator=(JobCertificateAuthority&&) noexcept = default;
JobCertificateAuthority::~JobCertificateAuthority() = default;

absl::StatusOr<JobCertificateAuthority> JobCertificateAuthority::Create(const std::string& job,
                                                                        absl::Duration lifetime) {
  auto key = std::make_unique<Key>();
  key->key.reset(EVP_EC_gen("P-256"));
  if (key->key == nullptr) return OpenSslError("EC key generation");
  ASSIGN_OR_RETURN(key->certificate,
                   NewCertificate(key->key.get(), absl::StrCat("ckptd job CA ", job), lifetime));
  X509* cert = key->certificate.get();
  if (X509_set_issuer_name(cert, X509_get_subject_name(cert)) != 1) return OpenSslError("issuer name");
  RETURN_IF_ERROR(AddExtension(cert, cert, NID_basic_constraints, "critical,CA:TRUE,pathlen:0"));
  RETURN_IF_ERROR(AddExtension(cert, cert, NID_key_usage, "critical,keyCertSign,cRLSign"));
  RETURN_IF_ERROR(AddExtension(cert, cert, NID_subject_key_identifier, "hash"));
  if (X509_sign(cert, key->key.get(), EVP_sha256()) <= 0) return OpenSslError("signing the CA certificate");
  ASSIGN_OR_RETURN(std::string pem, CertificatePem(cert));
  return JobCertificateAuthority(std::move(key), std::move(pem), lifetime);
}

absl::StatusOr<std::string> JobCertificateAuthority::Issue(const std::string& public_pem, int rank,
                                                           const std::string& host) const {
  BioPtr bio(BIO_new_mem_buf(public_pem.data(), static_cast<int>(public_pem.size())));
  KeyPtr subject(bio == nullptr ? nullptr : PEM_read_bio_PUBKEY(bio.get(), nullptr, nullptr, nullptr));
  if (subject == nullptr) {
    ERR_clear_error();
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " sent a public key that does not parse"));
  }
  ASSIGN_OR_RETURN(CertPtr cert,
                   NewCertificate(subject.get(), absl::StrCat("ckptd rank ", rank, " on ", host), lifetime_));
  X509* ca = key_->certificate.get();
  if (X509_set_issuer_name(cert.get(), X509_get_subject_name(ca)) != 1) return OpenSslError("issuer name");
  RETURN_IF_ERROR(AddExtension(cert.get(), ca, NID_basic_constraints, "critical,CA:FALSE"));
  RETURN_IF_ERROR(AddExtension(cert.get(), ca, NID_key_usage, "critical,digitalSignature,keyAgreement"));
  RETURN_IF_ERROR(AddExtension(cert.get(), ca, NID_ext_key_usage, "serverAuth,clientAuth"));
  RETURN_IF_ERROR(
      AddExtension(cert.get(), ca, NID_subject_alt_name, absl::StrCat("DNS:", kJobPeerName).c_str()));
  RETURN_IF_ERROR(AddExtension(cert.get(), ca, NID_authority_key_identifier, "keyid:always"));
  if (X509_sign(cert.get(), key_->key.get(), EVP_sha256()) <= 0) return OpenSslError("signing a certificate");
  return CertificatePem(cert.get());
}

absl::Status CheckJobCertificate(const std::string& certificate_pem, const std::string& ca_pem) {
  ASSIGN_OR_RETURN(CertPtr cert, ParseCertificate(certificate_pem));
  ASSIGN_OR_RETURN(CertPtr ca, ParseCertificate(ca_pem));
  std::unique_ptr<X509_STORE, openssl::FreeStore> store(X509_STORE_new());
  std::unique_ptr<X509_STORE_CTX, openssl::FreeStoreContext> ctx(X509_STORE_CTX_new());
  if (store == nullptr || ctx == nullptr || X509_STORE_add_cert(store.get(), ca.get()) != 1 ||
      X509_STORE_CTX_init(ctx.get(), store.get(), cert.get(), nullptr) != 1) {
    return OpenSslError("certificate store");
  }
  X509_VERIFY_PARAM* param = X509_STORE_CTX_get0_param(ctx.get());
  X509_VERIFY_PARAM_set1_host(param, kJobPeerName, 0);
  if (X509_verify_cert(ctx.get()) != 1) {
    const int error = X509_STORE_CTX_get_error(ctx.get());
    ERR_clear_error();
    return absl::UnauthenticatedError(
        absl::StrCat("certificate not accepted: ", X509_verify_cert_error_string(error)));
  }
  return absl::OkStatus();
}

}  // namespace ckptd
