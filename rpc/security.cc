#include "rpc/security.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/log.h"
#include "common/net_address.h"
#include "common/status.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_credentials_options.h"

namespace downpour {
namespace {

using ::grpc::experimental::FileWatcherCertificateProvider;

// OpenSSL's last error as text, or `fallback`.
std::string OpenSslError(const char* fallback) {
  const unsigned long code = ERR_get_error();
  ERR_clear_error();
  if (code == 0) return fallback;
  char text[256] = {};
  ERR_error_string_n(code, text, sizeof(text));
  return text;
}

absl::StatusOr<std::string> ReadPem(const char* flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  if (!in.good() && !in.eof()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, "=", path, " cannot be read"));
  }
  if (text.str().find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, "=", path, in ? " holds no PEM block" : " cannot be read (no such file?)"));
  }
  return text.str();
}

template <typename T, void (*Free)(T*)>
struct OpenSslDeleter {
  void operator()(T* p) const { Free(p); }
};
using Bio = std::unique_ptr<BIO, OpenSslDeleter<BIO, BIO_free_all>>;
using X509Ptr = std::unique_ptr<X509, OpenSslDeleter<X509, X509_free>>;
using KeyPtr = std::unique_ptr<EVP_PKEY, OpenSslDeleter<EVP_PKEY, EVP_PKEY_free>>;
using StorePtr = std::unique_ptr<X509_STORE, OpenSslDeleter<X509_STORE, X509_STORE_free>>;
using StoreContext =
    std::unique_ptr<X509_STORE_CTX, OpenSslDeleter<X509_STORE_CTX, X509_STORE_CTX_free>>;

Bio MemoryBio(const std::string& text) {
  return Bio(BIO_new_mem_buf(text.data(), static_cast<int>(text.size())));
}

// The certificate and key match, and the certificate chains to the CA bundle
// (intermediates may follow the leaf in the certificate file).
absl::Status CheckCertificate(const TlsFiles& files, const std::string& cert_pem,
                              const std::string& key_pem, const std::string& ca_pem) {
  Bio cert_bio = MemoryBio(cert_pem);
  X509Ptr cert(PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr));
  if (cert == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("--tls_cert=", files.cert,
                                                   " is not a PEM certificate (",
                                                   OpenSslError("no certificate"), ")"));
  }
  STACK_OF(X509)* chain = sk_X509_new_null();
  while (X509* more = PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr)) {
    sk_X509_push(chain, more);
  }
  ERR_clear_error();  // The end of the file.
  const auto free_chain = [&] { sk_X509_pop_free(chain, X509_free); };

  Bio key_bio = MemoryBio(key_pem);
  KeyPtr key(PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr));
  if (key == nullptr) {
    free_chain();
    return absl::InvalidArgumentError(absl::StrCat("--tls_key=", files.key,
                                                   " is not an unencrypted PEM private key (",
                                                   OpenSslError("no key"), ")"));
  }
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    free_chain();
    ERR_clear_error();
    return absl::InvalidArgumentError(
        absl::StrCat("--tls_key=", files.key, " is not the key of --tls_cert=", files.cert));
  }

  StorePtr store(X509_STORE_new());
  Bio ca_bio = MemoryBio(ca_pem);
  int roots = 0;
  while (X509* root = PEM_read_bio_X509(ca_bio.get(), nullptr, nullptr, nullptr)) {
    X509_STORE_add_cert(store.get(), root);
    X509_free(root);
    ++roots;
  }
  ERR_clear_error();
  if (roots == 0) {
    free_chain();
    return absl::InvalidArgumentError(
        absl::StrCat("--tls_ca=", files.ca, " holds no PEM certificate"));
  }
  StoreContext context(X509_STORE_CTX_new());
  X509_STORE_CTX_init(context.get(), store.get(), cert.get(), chain);
  const bool verified = X509_verify_cert(context.get()) == 1;
  const int error = X509_STORE_CTX_get_error(context.get());
  free_chain();
  if (!verified) {
    return absl::InvalidArgumentError(absl::StrCat("--tls_cert=", files.cert,
                                                   " is not valid under --tls_ca=", files.ca, ": ",
                                                   X509_verify_cert_error_string(error)));
  }
  return absl::OkStatus();
}

unsigned ReloadSeconds(const SecurityOptions& options) {
  return static_cast<unsigned>(std::max<int64_t>(1, absl::ToInt64Seconds(options.reload_interval)));
}

// Writes `text` to `path` through a temporary file and a rename, so a reader
// sees the old file or the new one, never a part.
absl::Status WriteAtomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    if (!out.good()) return absl::InternalError(absl::StrCat("cannot write ", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot rename ", tmp, " to ", path));
  }
  return absl::OkStatus();
}

// The operator's TLS files, copied into a private directory that gRPC's
// file watcher reads. The copies are replaced (atomically, file by file)
// only when the operator's files have changed, stayed still for a moment and
// check out together (ValidateTlsFiles): a file caught half-written by `cp`,
// or a certificate renewed before its key, is never served (gRPC aborts on
// an empty certificate chain); the last good files stay until the set is
// whole again. Stages live as long as the process.
class StagedTlsFiles {
 public:
  // The staged copies of `files` (one stage per distinct set of files).
  static absl::StatusOr<TlsFiles> Stage(const TlsFiles& files, bool client,
                                        absl::Duration interval) {
    static absl::Mutex mu;
    static auto* stages =
        new std::map<std::tuple<std::string, std::string, std::string, bool>, StagedTlsFiles*>();
    absl::MutexLock lock(&mu);
    const auto key = std::make_tuple(files.cert, files.key, files.ca, client);
    if (auto it = stages->find(key); it != stages->end()) return it->second->staged_;
    RETURN_IF_ERROR(ValidateTlsFiles(files, client));
    const char* tmp = std::getenv("TMPDIR");
    std::string dir =
        absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/downpour-tls-XXXXXX");
    if (mkdtemp(dir.data()) == nullptr) {
      return absl::InternalError(absl::StrCat("cannot make a directory like ", dir));
    }
    auto* stage = new StagedTlsFiles(files, client, dir);
    RETURN_IF_ERROR(stage->Copy());
    std::thread([stage, interval] { stage->Watch(interval); }).detach();
    (*stages)[key] = stage;
    return stage->staged_;
  }

 private:
  StagedTlsFiles(const TlsFiles& files, bool client, const std::string& dir)
      : source_(files), client_(client) {
    staged_.ca = dir + "/ca.pem";
    if (!files.cert.empty()) staged_.cert = dir + "/cert.pem";
    if (!files.key.empty()) staged_.key = dir + "/key.pem";
  }

  // The sources' sizes, modification times and inodes, to notice a change.
  std::string Fingerprint() const {
    std::string print;
    for (const std::string* path : {&source_.cert, &source_.key, &source_.ca}) {
      struct stat info {};
      if (!path->empty() && stat(path->c_str(), &info) == 0) {
        absl::StrAppend(&print, info.st_size, ":", info.st_mtim.tv_sec, ".", info.st_mtim.tv_nsec,
                        ":", info.st_ino, ";");
      } else {
        absl::StrAppend(&print, "-;");
      }
    }
    return print;
  }

  absl::Status Copy() {
    fingerprint_ = Fingerprint();
    for (auto [from, to] : {std::pair{&source_.ca, &staged_.ca},
                            {&source_.key, &staged_.key},
                            {&source_.cert, &staged_.cert}}) {
      if (from->empty()) continue;
      std::ifstream in(*from, std::ios::binary);
      std::stringstream text;
      text << in.rdbuf();
      RETURN_IF_ERROR(WriteAtomically(*to, text.str()));
      chmod(to->c_str(), 0600);
    }
    return absl::OkStatus();
  }

  void Watch(absl::Duration interval) {
    std::string refused;  // The set last refused, logged once.
    while (true) {
      absl::SleepFor(interval);
      const std::string now = Fingerprint();
      if (now == fingerprint_ || now == refused) continue;
      // Let a writer finish what it started.
      absl::SleepFor(absl::Milliseconds(200));
      if (Fingerprint() != now) continue;
      if (absl::Status valid = ValidateTlsFiles(source_, client_); !valid.ok()) {
        Log(absl::StrCat("TLS files changed but not reloaded (the last good ones stay): ",
                         valid.message()));
        refused = now;
        continue;
      }
      if (absl::Status copied = Copy(); !copied.ok()) {
        Log(absl::StrCat("TLS files not reloaded: ", copied.message()));
        continue;
      }
      Log(absl::StrCat("TLS files reloaded: ", source_.cert.empty() ? source_.ca : source_.cert));
    }
  }

  const TlsFiles source_;
  const bool client_;
  TlsFiles staged_;
  std::string fingerprint_;
};

}  // namespace

absl::Status ValidateTlsFiles(const TlsFiles& files, bool client) {
  if (files.ca.empty()) {
    return absl::InvalidArgumentError(
        "TLS needs --tls_ca (the CA bundle that peers' certificates chain to)");
  }
  ASSIGN_OR_RETURN(const std::string ca_pem, ReadPem("--tls_ca", files.ca));
  if (client && files.cert.empty() && files.key.empty()) return absl::OkStatus();
  if (files.cert.empty() || files.key.empty()) {
    return absl::InvalidArgumentError(
        "TLS needs --tls_cert and --tls_key together (this process's certificate and its key)");
  }
  ASSIGN_OR_RETURN(const std::string cert_pem, ReadPem("--tls_cert", files.cert));
  ASSIGN_OR_RETURN(const std::string key_pem, ReadPem("--tls_key", files.key));
  return CheckCertificate(files, cert_pem, key_pem, ca_pem);
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const SecurityOptions& options, ClientCertificates client_certificates) {
  if (!options.tls.enabled()) return grpc::InsecureServerCredentials();
  ASSIGN_OR_RETURN(const TlsFiles staged,
                   StagedTlsFiles::Stage(options.tls, /*client=*/false, options.reload_interval));
  auto provider = std::make_shared<FileWatcherCertificateProvider>(
      staged.key, staged.cert, staged.ca, ReloadSeconds(options));
  grpc::experimental::TlsServerCredentialsOptions tls(provider);
  tls.watch_root_certs();
  tls.watch_identity_key_cert_pairs();
  tls.set_cert_request_type(client_certificates == ClientCertificates::kRequired
                                ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                                : GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
  std::shared_ptr<grpc::ServerCredentials> credentials =
      grpc::experimental::TlsServerCredentials(tls);
  if (credentials == nullptr) {
    return absl::InternalError("gRPC could not make TLS server credentials from --tls_cert");
  }
  return credentials;
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const SecurityOptions& options) {
  if (!options.tls.enabled()) return grpc::InsecureChannelCredentials();
  ASSIGN_OR_RETURN(const TlsFiles staged,
                   StagedTlsFiles::Stage(options.tls, /*client=*/true, options.reload_interval));
  const bool identity = !staged.cert.empty();
  auto provider = identity ? std::make_shared<FileWatcherCertificateProvider>(
                                 staged.key, staged.cert, staged.ca, ReloadSeconds(options))
                           : std::make_shared<FileWatcherCertificateProvider>(
                                 staged.ca, ReloadSeconds(options));
  grpc::experimental::TlsChannelCredentialsOptions tls;
  tls.set_certificate_provider(provider);
  tls.watch_root_certs();
  if (identity) tls.watch_identity_key_cert_pairs();
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::experimental::TlsCredentials(tls);
  if (credentials == nullptr) {
    return absl::InternalError("gRPC could not make TLS channel credentials from --tls_ca");
  }
  return credentials;
}

absl::Status CheckListenSecurity(const std::string& listen, const SecurityOptions& options) {
  if (options.tls.enabled() || options.insecure) return absl::OkStatus();
  ASSIGN_OR_RETURN(const HostPort parsed, ParseHostPort(listen));
  if (IsLoopbackHost(parsed.host)) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("refusing to serve plaintext gRPC on ", listen,
                   ", which other machines can reach: give --tls_cert, --tls_key and --tls_ca "
                   "(scripts/make-certs.sh makes them), or --insecure to do it anyway"));
}

}  // namespace downpour
