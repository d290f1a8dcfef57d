// The job CA and its certificates (OpenSSL 3), their loading and checking,
// and non-blocking TLS sessions over sockets the caller polls.
#include "common/tls.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>

#include "common/env.h"
#include "common/names.h"
#include "common/secret.h"

namespace endure::tls {
namespace {

template <auto Free>
struct Deleter {
  template <typename T>
  void operator()(T* p) const {
    Free(p);
  }
};
using BioPtr = std::unique_ptr<BIO, Deleter<BIO_free_all>>;
using X509Ptr = std::unique_ptr<X509, Deleter<X509_free>>;
using KeyPtr = std::unique_ptr<EVP_PKEY, Deleter<EVP_PKEY_free>>;
using StorePtr = std::unique_ptr<X509_STORE, Deleter<X509_STORE_free>>;
using StoreCtxPtr = std::unique_ptr<X509_STORE_CTX, Deleter<X509_STORE_CTX_free>>;
using ExtPtr = std::unique_ptr<X509_EXTENSION, Deleter<X509_EXTENSION_free>>;
using BnPtr = std::unique_ptr<BIGNUM, Deleter<BN_free>>;
using SslCtxPtr = std::unique_ptr<SSL_CTX, Deleter<SSL_CTX_free>>;

constexpr char kCaName[] = "ca";
// Certificates start this long before they are made, so that a host whose
// clock is a little behind accepts them at once.
constexpr long kBackdateSeconds = 3600;
constexpr Duration kMaxValidity = std::chrono::hours(24 * 365 * 100);
constexpr size_t kMaxDnsNameBytes = 253;

// What OpenSSL's error queue says (and empties it), reasons only.
std::string OpenSslErrors() {
  std::string out;
  while (const unsigned long e = ERR_get_error()) {
    const char* reason = ERR_reason_error_string(e);
    char buf[256];
    if (reason == nullptr) {
      ERR_error_string_n(e, buf, sizeof buf);
      reason = buf;
    }
    if (out.find(reason) != std::string::npos) continue;
    if (!out.empty()) out += "; ";
    out += reason;
  }
  return out.empty() ? "no detail from OpenSSL" : out;
}

Status OpenSslFailure(const std::string& what) { return Internal(what + ": " + OpenSslErrors()); }

// Never asks for a passphrase: keys that `endure certs` writes have none,
// and OpenSSL's default would prompt on the terminal.
int NoPassphrase(char*, int, int, void*) { return 0; }

Result<X509Ptr> ParseCert(const std::string& pem, const std::string& file) {
  ERR_clear_error();
  BioPtr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  if (!bio) return OpenSslFailure("BIO_new_mem_buf");
  X509Ptr cert(PEM_read_bio_X509(bio.get(), nullptr, NoPassphrase, nullptr));
  if (!cert) {
    return InvalidArgument(file + " does not hold a PEM certificate (" + OpenSslErrors() +
                           "): make the job's certificates again with `endure certs`");
  }
  return cert;
}

Result<KeyPtr> ParseKey(const std::string& pem, const std::string& file) {
  ERR_clear_error();
  BioPtr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  if (!bio) return OpenSslFailure("BIO_new_mem_buf");
  KeyPtr key(PEM_read_bio_PrivateKey(bio.get(), nullptr, NoPassphrase, nullptr));
  if (!key) {
    return InvalidArgument(file + " does not hold an unencrypted PEM private key (" +
                           OpenSslErrors() + "): make the job's certificates again with " +
                           "`endure certs`");
  }
  return key;
}

// The subject's CN; empty when there is none, or it holds a NUL.
std::string CommonName(X509* cert) {
  const X509_NAME* subject = X509_get_subject_name(cert);
  const int at = X509_NAME_get_index_by_NID(subject, NID_commonName, -1);
  if (at < 0) return "";
  const ASN1_STRING* data = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(subject, at));
  const std::string cn(reinterpret_cast<const char*>(ASN1_STRING_get0_data(data)),
                       static_cast<size_t>(ASN1_STRING_length(data)));
  return cn.find('\0') == std::string::npos ? cn : "";
}

// Empty when `cert` chains to `ca` and both are within their validity;
// otherwise OpenSSL's reason.
std::string VerifyAgainst(X509* ca, X509* cert) {
  ERR_clear_error();
  StorePtr store(X509_STORE_new());
  StoreCtxPtr ctx(X509_STORE_CTX_new());
  if (!store || !ctx || X509_STORE_add_cert(store.get(), ca) != 1 ||
      X509_STORE_CTX_init(ctx.get(), store.get(), cert, nullptr) != 1) {
    return "cannot set up the verification: " + OpenSslErrors();
  }
  if (X509_verify_cert(ctx.get()) == 1) return "";
  return X509_verify_cert_error_string(X509_STORE_CTX_get_error(ctx.get()));
}

bool KeyReadableByOthers(const std::string& path, mode_t* mode) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return false;  // reading it reports the error
  *mode = st.st_mode & 07777;
  return (st.st_mode & 077) != 0;
}

Status CheckKeyMode(const std::string& path) {
  mode_t mode = 0;
  if (!KeyReadableByOthers(path, &mode)) return Status::Ok();
  char octal[8];
  std::snprintf(octal, sizeof octal, "%04o", static_cast<unsigned>(mode));
  return InvalidArgument(path + " is open to group or others (mode " + octal +
                         "): a private key must be the owner's alone; chmod 600 " + path);
}

// The file's contents; kInvalidArgument naming it when it cannot be read.
Result<std::string> ReadIdentityFile(const std::string& path, const std::string& dir) {
  Result<std::string> text = Env::Default()->ReadFile(path);
  if (text.ok()) return text;
  if (text.status().code() == StatusCode::kNotFound) {
    return InvalidArgument(path + " does not exist: make the job's certificates with " +
                           "`endure certs --dir " + dir + " --nodes ...` and copy " + dir +
                           " to every host");
  }
  return InvalidArgument(text.status().message());
}

Status CheckIdentityName(const std::string& name, const char* what) {
  if (name == kCaName) {
    return InvalidArgument(std::string(what) + ": '" + name + "' is the CA's file name (" +
                           kCaName + ".pem); pick another name");
  }
  if (name == kControllerName) return Status::Ok();
  return CheckNodeName(name, what);
}

// Writes `data` to `path` with exactly permission bits `mode`, so that a
// reader sees the old file or the whole new one: PATH.tmp (created afresh,
// never through a link), fsync, rename. The caller fsyncs the directory.
Status WriteFileWithMode(const std::string& path, std::string_view data, mode_t mode) {
  const std::string tmp = path + ".tmp";
  const auto fail = [&](const std::string& what) {
    const Status st = IOError(what + " '" + tmp + "': " + std::strerror(errno));
    ::unlink(tmp.c_str());
    return st;
  };
  if (::unlink(tmp.c_str()) != 0 && errno != ENOENT) return fail("cannot remove");
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
  if (fd < 0) return IOError("cannot create '" + tmp + "': " + std::strerror(errno));
  // The umask may have taken bits away; a certificate should stay readable.
  if (::fchmod(fd, mode) != 0) {
    const Status st = fail("fchmod");
    ::close(fd);
    return st;
  }
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const Status st = fail("write");
      ::close(fd);
      return st;
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  if (::fsync(fd) != 0) {
    const Status st = fail("fsync");
    ::close(fd);
    return st;
  }
  if (::close(fd) != 0) return fail("close");
  if (::rename(tmp.c_str(), path.c_str()) != 0) return fail("cannot rename to '" + path + "' from");
  return Status::Ok();
}

// `dir` as a directory: made 0700 when missing (its parents as mkdir -p).
Status EnsurePrivateDir(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  struct stat st;
  if (::stat(dir.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode)) return IOError("'" + dir + "' exists and is not a directory");
    return Status::Ok();
  }
  if (errno != ENOENT) return IOError("cannot use '" + dir + "': " + std::strerror(errno));
  std::error_code ec;
  const std::filesystem::path parent = std::filesystem::path(dir).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  if (ec) return IOError("cannot create directory '" + parent.string() + "': " + ec.message());
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return IOError("cannot create directory '" + dir + "': " + std::strerror(errno));
  }
  return Status::Ok();
}

bool IsIpAddress(const std::string& host) {
  unsigned char buf[sizeof(in6_addr)];
  return ::inet_pton(AF_INET, host.c_str(), buf) == 1 ||
         ::inet_pton(AF_INET6, host.c_str(), buf) == 1;
}

bool IsDnsLabel(std::string_view label) {
  if (label.empty() || label.size() > 63 || label.front() == '-' || label.back() == '-') {
    return false;
  }
  for (char c : label) {
    const bool alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    if (!alnum && c != '-') return false;
  }
  return true;
}

Result<KeyPtr> NewKey() {
  ERR_clear_error();
  KeyPtr key(EVP_EC_gen("P-256"));
  if (!key) return OpenSslFailure("cannot make an ECDSA P-256 key");
  return key;
}

Status AddExtension(X509* cert, X509* issuer, int nid, const char* value) {
  X509V3_CTX v3;
  X509V3_set_ctx(&v3, issuer, cert, nullptr, nullptr, 0);
  ExtPtr ext(X509V3_EXT_nconf_nid(nullptr, &v3, nid, value));
  if (!ext || X509_add_ext(cert, ext.get(), -1) != 1) {
    return OpenSslFailure(std::string("cannot add the extension ") + OBJ_nid2sn(nid) + "=" + value);
  }
  return Status::Ok();
}

// A certificate for `key` named `cn`, signed by `issuer_key`; `issuer` is
// null for the self-signed CA. Valid from kBackdateSeconds ago for
// `validity`, but never past the issuer's end.
Result<X509Ptr> NewCertificate(const std::string& cn, EVP_PKEY* key, X509* issuer,
                               EVP_PKEY* issuer_key, Duration validity,
                               const std::vector<std::string>& hosts) {
  ERR_clear_error();
  X509Ptr cert(X509_new());
  BnPtr serial(BN_new());
  if (!cert || !serial) return OpenSslFailure("X509_new");
  // RFC 5280 serials are positive; 128 random bits are unique in practice.
  do {
    if (BN_rand(serial.get(), 128, BN_RAND_TOP_ANY, BN_RAND_BOTTOM_ANY) != 1) {
      return OpenSslFailure("cannot draw a serial number");
    }
  } while (BN_is_zero(serial.get()));
  const int64_t seconds = std::chrono::duration_cast<std::chrono::seconds>(validity).count();
  X509_NAME* subject = X509_get_subject_name(cert.get());
  if (X509_set_version(cert.get(), X509_VERSION_3) != 1 ||
      BN_to_ASN1_INTEGER(serial.get(), X509_get_serialNumber(cert.get())) == nullptr ||
      X509_gmtime_adj(X509_getm_notBefore(cert.get()), -kBackdateSeconds) == nullptr ||
      X509_time_adj_ex(X509_getm_notAfter(cert.get()), static_cast<int>(seconds / 86400),
                       static_cast<long>(seconds % 86400), nullptr) == nullptr ||
      X509_NAME_add_entry_by_txt(subject, "O", MBSTRING_ASC,
                                 reinterpret_cast<const unsigned char*>("Endure"), -1, -1,
                                 0) != 1 ||
      X509_NAME_add_entry_by_txt(subject, "CN", MBSTRING_UTF8,
                                 reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1,
                                 0) != 1 ||
      X509_set_issuer_name(cert.get(),
                           issuer != nullptr ? X509_get_subject_name(issuer) : subject) != 1 ||
      X509_set_pubkey(cert.get(), key) != 1) {
    return OpenSslFailure("cannot fill in the certificate for " + cn);
  }
  if (issuer != nullptr &&
      ASN1_TIME_compare(X509_get0_notAfter(cert.get()), X509_get0_notAfter(issuer)) > 0 &&
      X509_set1_notAfter(cert.get(), X509_get0_notAfter(issuer)) != 1) {
    return OpenSslFailure("cannot end the certificate for " + cn + " with its CA");
  }
  X509* const signer = issuer != nullptr ? issuer : cert.get();
  if (issuer == nullptr) {
    ENDURE_RETURN_IF_ERROR(
        AddExtension(cert.get(), signer, NID_basic_constraints, "critical,CA:TRUE,pathlen:0"));
    ENDURE_RETURN_IF_ERROR(
        AddExtension(cert.get(), signer, NID_key_usage, "critical,keyCertSign,cRLSign"));
    ENDURE_RETURN_IF_ERROR(AddExtension(cert.get(), signer, NID_subject_key_identifier, "hash"));
  } else {
    // Names and hosts were checked (CheckIdentityName, CheckSanHost): no
    // ',' or ':' can smuggle another entry into the list.
    std::string san = "DNS:" + cn;
    for (const std::string& host : hosts) san += (IsIpAddress(host) ? ",IP:" : ",DNS:") + host;
    ENDURE_RETURN_IF_ERROR(
        AddExtension(cert.get(), signer, NID_basic_constraints, "critical,CA:FALSE"));
    ENDURE_RETURN_IF_ERROR(
        AddExtension(cert.get(), signer, NID_key_usage, "critical,digitalSignature"));
    ENDURE_RETURN_IF_ERROR(
        AddExtension(cert.get(), signer, NID_ext_key_usage, "serverAuth,clientAuth"));
    ENDURE_RETURN_IF_ERROR(AddExtension(cert.get(), signer, NID_subject_alt_name, san.c_str()));
    ENDURE_RETURN_IF_ERROR(AddExtension(cert.get(), signer, NID_subject_key_identifier, "hash"));
    ENDURE_RETURN_IF_ERROR(
        AddExtension(cert.get(), signer, NID_authority_key_identifier, "keyid:always"));
  }
  if (X509_sign(cert.get(), issuer_key, EVP_sha256()) <= 0) {
    return OpenSslFailure("cannot sign the certificate for " + cn);
  }
  return cert;
}

Result<std::string> BioText(BIO* bio) {
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio, &data);
  if (n < 0 || data == nullptr) return OpenSslFailure("BIO_get_mem_data");
  return std::string(data, static_cast<size_t>(n));
}

Result<std::string> CertPem(X509* cert) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  if (!bio || PEM_write_bio_X509(bio.get(), cert) != 1) return OpenSslFailure("PEM_write_bio_X509");
  return BioText(bio.get());
}

Result<std::string> KeyPem(EVP_PKEY* key) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  if (!bio ||
      PEM_write_bio_PrivateKey(bio.get(), key, nullptr, nullptr, 0, nullptr, nullptr) != 1) {
    return OpenSslFailure("PEM_write_bio_PrivateKey");
  }
  return BioText(bio.get());
}

// Writes NAME.key (0600) and NAME.pem (0644) into `dir`.
Status WritePair(const std::string& dir, const std::string& name, X509* cert, EVP_PKEY* key) {
  ENDURE_ASSIGN_OR_RETURN(const std::string key_pem, KeyPem(key));
  ENDURE_ASSIGN_OR_RETURN(const std::string cert_pem, CertPem(cert));
  ENDURE_RETURN_IF_ERROR(WriteFileWithMode(JoinPath(dir, name + ".key"), key_pem, 0600));
  return WriteFileWithMode(JoinPath(dir, name + ".pem"), cert_pem, 0644);
}

struct Ca {
  X509Ptr cert;
  KeyPtr key;
};

// The CA in `dir`: both files, loadable, matching, a CA and not expired.
Result<Ca> LoadCa(const std::string& dir) {
  const std::string cert_path = JoinPath(dir, std::string(kCaName) + ".pem");
  const std::string key_path = JoinPath(dir, std::string(kCaName) + ".key");
  ENDURE_RETURN_IF_ERROR(CheckKeyMode(key_path));
  Result<std::string> cert_pem = Env::Default()->ReadFile(cert_path);
  if (!cert_pem.ok()) return InvalidArgument(cert_pem.status().message());
  Result<std::string> key_pem = Env::Default()->ReadFile(key_path);
  if (!key_pem.ok()) return InvalidArgument(key_pem.status().message());
  Ca ca;
  ENDURE_ASSIGN_OR_RETURN(ca.cert, ParseCert(*cert_pem, cert_path));
  ENDURE_ASSIGN_OR_RETURN(ca.key, ParseKey(*key_pem, key_path));
  ERR_clear_error();
  if (X509_check_private_key(ca.cert.get(), ca.key.get()) != 1) {
    ERR_clear_error();
    return InvalidArgument(key_path + " is not the key of " + cert_path +
                           ": restore the ca.key made with it, or make a new CA in an empty --dir "
                           "(and give every node new certificates)");
  }
  if (X509_check_ca(ca.cert.get()) == 0) {
    return InvalidArgument(cert_path + " is not a CA certificate: use an empty --dir");
  }
  if (X509_cmp_current_time(X509_get0_notAfter(ca.cert.get())) <= 0) {
    return InvalidArgument(cert_path +
                           " has expired: make a new CA in an empty --dir and give every node "
                           "new certificates");
  }
  return ca;
}

// ---- A socket BIO whose writes cannot raise SIGPIPE ----
//
// OpenSSL's own socket BIO uses write(2), which kills a process that does
// not ignore SIGPIPE when the peer has gone; this one uses send(2) with
// MSG_NOSIGNAL. The BIO's data is the descriptor, which it does not own.

int SocketOf(BIO* bio) { return static_cast<int>(reinterpret_cast<intptr_t>(BIO_get_data(bio))); }

int SocketBioWrite(BIO* bio, const char* data, int len) {
  BIO_clear_retry_flags(bio);
  while (true) {
    const ssize_t n = ::send(SocketOf(bio), data, static_cast<size_t>(len), MSG_NOSIGNAL);
    if (n >= 0) return static_cast<int>(n);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) BIO_set_retry_write(bio);
    return -1;
  }
}

int SocketBioRead(BIO* bio, char* data, int len) {
  BIO_clear_retry_flags(bio);
  while (true) {
    const ssize_t n = ::recv(SocketOf(bio), data, static_cast<size_t>(len), 0);
    if (n >= 0) return static_cast<int>(n);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) BIO_set_retry_read(bio);
    return -1;
  }
}

long SocketBioCtrl(BIO*, int cmd, long, void*) {
  // Writes go straight to the socket: there is never anything to flush.
  return cmd == BIO_CTRL_FLUSH ? 1 : 0;
}

BIO_METHOD* SocketBioMethod() {
  static BIO_METHOD* const method = [] {
    const int index = BIO_get_new_index();
    ENDURE_CHECK(index > 0);
    BIO_METHOD* m = BIO_meth_new(index | BIO_TYPE_SOURCE_SINK, "endure socket");
    ENDURE_CHECK(m != nullptr);
    ENDURE_CHECK(BIO_meth_set_write(m, SocketBioWrite) == 1);
    ENDURE_CHECK(BIO_meth_set_read(m, SocketBioRead) == 1);
    ENDURE_CHECK(BIO_meth_set_ctrl(m, SocketBioCtrl) == 1);
    return m;
  }();
  return method;
}

// A hint for an OpenSSL reason met on a connection.
std::string HintFor(unsigned long e) {
  if (ERR_GET_LIB(e) != ERR_LIB_SSL) return "";
  const int reason = ERR_GET_REASON(e);
  if (reason >= SSL_AD_REASON_OFFSET) {
    return "the peer refused this side's certificate or TLS parameters: both sides need "
           "certificates from the same `endure certs` CA";
  }
  switch (reason) {
    case SSL_R_CERTIFICATE_VERIFY_FAILED:
      return "the peer's certificate is not from this job's CA (or has expired)";
    case SSL_R_PEER_DID_NOT_RETURN_A_CERTIFICATE:
      return "the peer presented no certificate: it must use one from this job's CA";
    case SSL_R_WRONG_VERSION_NUMBER:
    case SSL_R_PACKET_LENGTH_TOO_LONG:
    case SSL_R_HTTP_REQUEST:
      return "the peer does not speak TLS: both sides need --tls-dir";
    case SSL_R_UNSUPPORTED_PROTOCOL:
      return "the peer does not offer TLS 1.3";
    default:
      return "";
  }
}

}  // namespace

Status CheckSanHost(std::string_view host, std::string_view what) {
  const std::string h(host);
  const auto bad = [&](const char* why) {
    return InvalidArgument(std::string(what) + ": '" + QuoteForLog(host) + "' " + why +
                           " (give a DNS name such as node0.example.com, or an IP address)");
  };
  if (h.empty()) return bad("is empty");
  if (h.find('\0') == std::string::npos && IsIpAddress(h)) return Status::Ok();
  if (h.size() > kMaxDnsNameBytes) return bad("is longer than 253 bytes");
  std::string_view rest = host;
  if (rest.substr(0, 2) == "*.") rest.remove_prefix(2);
  while (true) {
    const size_t dot = rest.find('.');
    if (!IsDnsLabel(rest.substr(0, dot))) {
      return bad("is neither an IP address nor a DNS name");
    }
    if (dot == std::string_view::npos) break;
    rest.remove_prefix(dot + 1);
  }
  return Status::Ok();
}

Result<Identity> LoadIdentity(const std::string& dir, const std::string& name) {
  ENDURE_RETURN_IF_ERROR(CheckIdentityName(name, "the TLS identity's name"));
  const std::string ca_path = JoinPath(dir, std::string(kCaName) + ".pem");
  const std::string cert_path = JoinPath(dir, name + ".pem");
  const std::string key_path = JoinPath(dir, name + ".key");
  Identity id;
  id.name = name;
  ENDURE_ASSIGN_OR_RETURN(id.ca_pem, ReadIdentityFile(ca_path, dir));
  ENDURE_ASSIGN_OR_RETURN(id.cert_pem, ReadIdentityFile(cert_path, dir));
  ENDURE_RETURN_IF_ERROR(CheckKeyMode(key_path));
  ENDURE_ASSIGN_OR_RETURN(id.key_pem, ReadIdentityFile(key_path, dir));
  ENDURE_ASSIGN_OR_RETURN(const X509Ptr ca, ParseCert(id.ca_pem, ca_path));
  ENDURE_ASSIGN_OR_RETURN(const X509Ptr cert, ParseCert(id.cert_pem, cert_path));
  ENDURE_ASSIGN_OR_RETURN(const KeyPtr key, ParseKey(id.key_pem, key_path));
  if (X509_check_ca(ca.get()) == 0) {
    return InvalidArgument(ca_path + " is not a CA certificate: copy the ca.pem that " +
                           "`endure certs` wrote");
  }
  const std::string why = VerifyAgainst(ca.get(), cert.get());
  if (!why.empty()) {
    return InvalidArgument(cert_path + " does not verify against " + ca_path + ": " + why +
                           " (copy the files of one `endure certs` run, or make new ones with "
                           "`endure certs --dir " +
                           dir + " --nodes " + name + "`)");
  }
  const std::string cn = CommonName(cert.get());
  if (cn != name) {
    return InvalidArgument(cert_path + " is a certificate for '" + QuoteForLog(cn) + "', not '" +
                           name + "': put " + name + "'s own certificate there");
  }
  if (X509_check_purpose(cert.get(), X509_PURPOSE_SSL_SERVER, 0) != 1 ||
      X509_check_purpose(cert.get(), X509_PURPOSE_SSL_CLIENT, 0) != 1) {
    return InvalidArgument(cert_path +
                           " does not allow both TLS server and client use (extendedKeyUsage "
                           "serverAuth, clientAuth): make it with `endure certs`");
  }
  ERR_clear_error();
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    ERR_clear_error();
    return InvalidArgument(key_path + " is not the key of " + cert_path +
                           ": copy both files from the same `endure certs` run");
  }
  return id;
}

Status MakeCertificates(const CertRequest& request) {
  if (request.dir.empty()) return InvalidArgument("no directory for the certificates");
  if (request.validity <= Duration::zero() || request.validity > kMaxValidity) {
    return InvalidArgument("validity " + FormatDuration(request.validity) +
                           " is out of range: give a positive duration of at most 100 years");
  }
  std::set<std::string> seen;
  for (const std::string& node : request.nodes) {
    ENDURE_RETURN_IF_ERROR(CheckIdentityName(node, "node name"));
    if (node == kControllerName) {
      return InvalidArgument(std::string("node name: '") + kControllerName +
                             "' is the controller's certificate (always made): pick another name");
    }
    if (!seen.insert(node).second) {
      return InvalidArgument("node name: '" + node + "' is listed twice");
    }
  }
  for (const std::string& host : request.hosts) {
    ENDURE_RETURN_IF_ERROR(CheckSanHost(host, "host"));
  }
  const std::string& dir = request.dir;
  ENDURE_RETURN_IF_ERROR(EnsurePrivateDir(dir));

  const std::string ca_cert_path = JoinPath(dir, std::string(kCaName) + ".pem");
  const std::string ca_key_path = JoinPath(dir, std::string(kCaName) + ".key");
  const bool have_cert = Env::Default()->Exists(ca_cert_path);
  const bool have_key = Env::Default()->Exists(ca_key_path);
  Ca ca;
  if (have_cert && have_key) {
    ENDURE_ASSIGN_OR_RETURN(ca, LoadCa(dir));
  } else if (have_cert || have_key) {
    const std::string& present = have_cert ? ca_cert_path : ca_key_path;
    const std::string& missing = have_cert ? ca_key_path : ca_cert_path;
    return InvalidArgument(present + " exists without " + missing +
                           ": restore it to add certificates to this CA, or use an empty --dir");
  } else {
    ENDURE_ASSIGN_OR_RETURN(ca.key, NewKey());
    // A name of its own, so that two jobs' CAs are told apart in messages.
    ENDURE_ASSIGN_OR_RETURN(const std::string tag, RandomHex(4));
    ENDURE_ASSIGN_OR_RETURN(ca.cert, NewCertificate("Endure job CA " + tag, ca.key.get(), nullptr,
                                                    ca.key.get(), request.validity, {}));
    ENDURE_RETURN_IF_ERROR(WritePair(dir, kCaName, ca.cert.get(), ca.key.get()));
  }

  std::vector<std::string> names = {kControllerName};
  names.insert(names.end(), request.nodes.begin(), request.nodes.end());
  for (const std::string& name : names) {
    ENDURE_ASSIGN_OR_RETURN(const KeyPtr key, NewKey());
    ENDURE_ASSIGN_OR_RETURN(const X509Ptr cert,
                            NewCertificate(name, key.get(), ca.cert.get(), ca.key.get(),
                                           request.validity, request.hosts));
    ENDURE_RETURN_IF_ERROR(WritePair(dir, name, cert.get(), key.get()));
  }
  return Env::Default()->SyncDir(dir);
}

Result<std::shared_ptr<const Context>> Context::Make(const Identity& id) {
  const std::string what = "the TLS identity '" + id.name + "'";
  ENDURE_ASSIGN_OR_RETURN(const X509Ptr ca, ParseCert(id.ca_pem, what + "'s CA certificate"));
  ENDURE_ASSIGN_OR_RETURN(const X509Ptr cert, ParseCert(id.cert_pem, what + "'s certificate"));
  ENDURE_ASSIGN_OR_RETURN(const KeyPtr key, ParseKey(id.key_pem, what + "'s key"));
  ERR_clear_error();
  SslCtxPtr ctx(SSL_CTX_new(TLS_method()));
  if (!ctx) return OpenSslFailure("SSL_CTX_new");
  if (SSL_CTX_set_min_proto_version(ctx.get(), TLS1_3_VERSION) != 1 ||
      X509_STORE_add_cert(SSL_CTX_get_cert_store(ctx.get()), ca.get()) != 1 ||
      SSL_CTX_add_client_CA(ctx.get(), ca.get()) != 1 ||
      SSL_CTX_use_certificate(ctx.get(), cert.get()) != 1) {
    return OpenSslFailure("cannot set up TLS for " + what);
  }
  if (SSL_CTX_use_PrivateKey(ctx.get(), key.get()) != 1 ||
      SSL_CTX_check_private_key(ctx.get()) != 1) {
    return InvalidArgument(what + ": the key does not match the certificate (" + OpenSslErrors() +
                           ")");
  }
  SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  // Every connection proves its certificate afresh: no tickets, no cache.
  SSL_CTX_set_session_cache_mode(ctx.get(), SSL_SESS_CACHE_OFF);
  SSL_CTX_set_options(ctx.get(), SSL_OP_NO_TICKET);
  SSL_CTX_set_num_tickets(ctx.get(), 0);
  // Partial writes report progress to the caller's idle limit; a retried
  // write may come from a buffer that moved (the same bytes).
  SSL_CTX_set_mode(ctx.get(), SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  return std::shared_ptr<const Context>(new Context(ctx.release(), id.name));
}

Context::~Context() { SSL_CTX_free(ctx_); }

Result<std::shared_ptr<const Context>> LoadContext(const std::string& dir,
                                                   const std::string& name) {
  ENDURE_ASSIGN_OR_RETURN(const Identity id, LoadIdentity(dir, name));
  return Context::Make(id);
}

Result<std::unique_ptr<Session>> Session::New(const Context& ctx, int fd, Role role) {
  ERR_clear_error();
  SSL* ssl = SSL_new(ctx.native_handle());
  if (ssl == nullptr) return OpenSslFailure("SSL_new");
  std::unique_ptr<Session> s(new Session(ssl, role));
  BIO* bio = BIO_new(SocketBioMethod());
  if (bio == nullptr) return OpenSslFailure("BIO_new");
  BIO_set_data(bio, reinterpret_cast<void*>(static_cast<intptr_t>(fd)));
  BIO_set_init(bio, 1);
  SSL_set_bio(ssl, bio, bio);  // the SSL owns the BIO from now on
  if (role == Role::kClient) {
    SSL_set_connect_state(ssl);
  } else {
    SSL_set_accept_state(ssl);
  }
  return s;
}

Session::~Session() { SSL_free(ssl_); }

Result<Session::Io> Session::Outcome(int rc, size_t bytes, const char* call) {
  const int saved_errno = errno;
  const int err = SSL_get_error(ssl_, rc);
  switch (err) {
    case SSL_ERROR_NONE:
      return Io{State::kDone, bytes};
    case SSL_ERROR_WANT_READ:
      return Io{State::kWantRead, 0};
    case SSL_ERROR_WANT_WRITE:
      return Io{State::kWantWrite, 0};
    case SSL_ERROR_ZERO_RETURN:
      return Io{State::kClosed, 0};
    case SSL_ERROR_SYSCALL: {
      failed_ = true;
      const std::string detail = OpenSslErrors();
      if (saved_errno == 0) return Io{State::kClosed, 0};
      std::string message = std::string(call) + ": " + std::strerror(saved_errno);
      if (role_ == Role::kClient && !SSL_is_init_finished(ssl_)) {
        message += " (does the peer use TLS with this job's certificates?)";
      }
      return Unavailable(message);
    }
    default:
      break;
  }
  failed_ = true;
  const unsigned long first = ERR_peek_error();
  if (ERR_GET_LIB(first) == ERR_LIB_SSL &&
      ERR_GET_REASON(first) == SSL_R_UNEXPECTED_EOF_WHILE_READING) {
    ERR_clear_error();
    return Io{State::kClosed, 0};
  }
  std::string message = std::string(call) + ": " + OpenSslErrors();
  const long verify = SSL_get_verify_result(ssl_);
  if (verify != X509_V_OK)
    message += std::string(" (") + X509_verify_cert_error_string(verify) + ")";
  const std::string hint = HintFor(first);
  if (!hint.empty()) message += ": " + hint;
  return Unavailable(message);
}

Result<Session::Io> Session::Handshake() {
  ERR_clear_error();
  errno = 0;
  const int rc = SSL_do_handshake(ssl_);
  ENDURE_ASSIGN_OR_RETURN(const Io io, Outcome(rc, 0, "TLS handshake"));
  if (io.state == State::kClosed) {
    return Unavailable(
        "TLS handshake: the peer closed the connection (does it use TLS with this "
        "job's certificates?)");
  }
  if (io.state != State::kDone) return io;
  // SSL_VERIFY_PEER fails the handshake of a peer without a valid
  // certificate; this is a second look, and where the peer's name comes from.
  X509* peer = SSL_get0_peer_certificate(ssl_);
  if (peer == nullptr || SSL_get_verify_result(ssl_) != X509_V_OK) {
    failed_ = true;
    return Unavailable("TLS handshake: the peer's certificate did not verify");
  }
  peer_name_ = CommonName(peer);
  if (peer_name_.empty()) {
    failed_ = true;
    return Unavailable("TLS handshake: the peer's certificate has no common name");
  }
  return io;
}

Result<Session::Io> Session::Read(char* buf, size_t n) {
  ERR_clear_error();
  errno = 0;
  size_t got = 0;
  const int rc = SSL_read_ex(ssl_, buf, n, &got);
  return Outcome(rc, got, "TLS read");
}

Result<Session::Io> Session::Write(const char* buf, size_t n) {
  ERR_clear_error();
  errno = 0;
  size_t written = 0;
  const int rc = SSL_write_ex(ssl_, buf, n, &written);
  return Outcome(rc, written, "TLS write");
}

void Session::Close() {
  if (failed_ || !SSL_is_init_finished(ssl_)) return;
  failed_ = true;  // once
  ERR_clear_error();
  (void)SSL_shutdown(ssl_);
  ERR_clear_error();
}

}  // namespace endure::tls
