// The job CA and certificates: what MakeCertificates writes, what
// LoadIdentity accepts and refuses, and a mutual-TLS session between two
// identities over a socket pair.
#include "common/tls.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "common/env.h"

namespace endure::tls {
namespace {

using testing::HasSubstr;

// A directory of the test's own, removed with its contents afterwards.
class TlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/tlsXXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    root_ = pattern;
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  std::string Dir(const std::string& name) const { return root_ + "/" + name; }

  // Certificates for the controller and `nodes` in Dir(name).
  std::string Make(const std::string& name, std::vector<std::string> nodes,
                   std::vector<std::string> hosts = {}) {
    CertRequest r;
    r.dir = Dir(name);
    r.nodes = std::move(nodes);
    r.hosts = std::move(hosts);
    const Status st = MakeCertificates(r);
    EXPECT_TRUE(st.ok()) << st.ToString();
    return r.dir;
  }

  static std::string Read(const std::string& path) {
    Result<std::string> text = Env::Default()->ReadFile(path);
    return text.ok() ? *text : "";
  }
  static void Write(const std::string& path, const std::string& text, mode_t mode) {
    ::unlink(path.c_str());
    ASSERT_TRUE(WriteFileAtomically(Env::Default(), path, text).ok());
    ASSERT_EQ(::chmod(path.c_str(), mode), 0);
  }
  static mode_t Mode(const std::string& path) {
    struct stat st {};
    EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
    return st.st_mode & 07777;
  }

  std::string root_;
};

X509* ParsePem(const std::string& pem) {
  BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  X509* cert = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr);
  BIO_free(bio);
  return cert;
}

TEST_F(TlsTest, MakesCertificatesThatLoadForTheControllerAndEachNode) {
  const std::string dir =
      Make("certs/job", {"node0", "node1"}, {"trainer.example.com", "10.1.2.3"});
  EXPECT_EQ(Mode(dir), 0700u);
  for (const char* name : {"ca", "controller", "node0", "node1"}) {
    EXPECT_EQ(Mode(dir + "/" + name + ".key"), 0600u) << name;
    EXPECT_EQ(Mode(dir + "/" + name + ".pem"), 0644u) << name;
  }
  for (const char* name : {"controller", "node0", "node1"}) {
    Result<Identity> id = LoadIdentity(dir, name);
    ASSERT_TRUE(id.ok()) << name << ": " << id.status().ToString();
    EXPECT_EQ(id->name, name);
    EXPECT_EQ(id->ca_pem, Read(dir + "/ca.pem"));
    EXPECT_EQ(id->cert_pem, Read(dir + "/" + name + ".pem"));
    EXPECT_EQ(id->key_pem, Read(dir + "/" + name + ".key"));
    Result<std::shared_ptr<const Context>> ctx = Context::Make(*id);
    ASSERT_TRUE(ctx.ok()) << ctx.status().ToString();
    EXPECT_EQ((*ctx)->name(), name);
  }
  EXPECT_FALSE(Env::Default()->Exists(dir + "/node0.pem.tmp"));
}

TEST_F(TlsTest, LeafCertificatesCarryTheProfile) {
  const std::string dir = Make("job", {"node0"}, {"trainer.example.com", "10.1.2.3", "::1"});
  X509* leaf = ParsePem(Read(dir + "/node0.pem"));
  X509* ca = ParsePem(Read(dir + "/ca.pem"));
  ASSERT_NE(leaf, nullptr);
  ASSERT_NE(ca, nullptr);
  EXPECT_EQ(X509_get_version(leaf), X509_VERSION_3);
  EXPECT_EQ(X509_get_signature_nid(leaf), NID_ecdsa_with_SHA256);
  EXPECT_EQ(EVP_PKEY_get_bits(X509_get0_pubkey(leaf)), 256);
  EXPECT_EQ(X509_check_ca(leaf), 0);
  EXPECT_GE(X509_check_ca(ca), 1);
  EXPECT_EQ(X509_check_purpose(leaf, X509_PURPOSE_SSL_SERVER, 0), 1);
  EXPECT_EQ(X509_check_purpose(leaf, X509_PURPOSE_SSL_CLIENT, 0), 1);
  EXPECT_EQ(X509_check_host(leaf, "node0", 0, 0, nullptr), 1);
  EXPECT_EQ(X509_check_host(leaf, "trainer.example.com", 0, 0, nullptr), 1);
  EXPECT_EQ(X509_check_ip_asc(leaf, "10.1.2.3", 0), 1);
  EXPECT_EQ(X509_check_ip_asc(leaf, "::1", 0), 1);
  EXPECT_EQ(X509_check_host(leaf, "node1", 0, 0, nullptr), 0);
  // Serials are drawn afresh: the two leaves differ.
  X509* controller = ParsePem(Read(dir + "/controller.pem"));
  ASSERT_NE(controller, nullptr);
  EXPECT_NE(ASN1_INTEGER_cmp(X509_get0_serialNumber(leaf), X509_get0_serialNumber(controller)), 0);
  EXPECT_EQ(X509_check_host(controller, kControllerName, 0, 0, nullptr), 1);
  X509_free(controller);
  X509_free(leaf);
  X509_free(ca);
}

TEST_F(TlsTest, RefusesACertificateForAnotherName) {
  const std::string dir = Make("job", {"node0", "node1"});
  Write(dir + "/node0.pem", Read(dir + "/node1.pem"), 0644);
  Write(dir + "/node0.key", Read(dir + "/node1.key"), 0600);
  Result<Identity> id = LoadIdentity(dir, "node0");
  ASSERT_EQ(id.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(id.status().message(), HasSubstr(dir + "/node0.pem is a certificate for 'node1'"));
}

TEST_F(TlsTest, RefusesACertificateFromAnotherCa) {
  const std::string dir = Make("job", {"node0"});
  const std::string other = Make("other", {"node0"});
  Write(dir + "/node0.pem", Read(other + "/node0.pem"), 0644);
  Write(dir + "/node0.key", Read(other + "/node0.key"), 0600);
  Result<Identity> id = LoadIdentity(dir, "node0");
  ASSERT_EQ(id.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(id.status().message(), HasSubstr(dir + "/node0.pem does not verify against"));
}

TEST_F(TlsTest, RefusesAKeyThatOthersCanRead) {
  const std::string dir = Make("job", {"node0"});
  const std::string key = dir + "/node0.key";
  ASSERT_EQ(::chmod(key.c_str(), 0644), 0);
  Result<Identity> id = LoadIdentity(dir, "node0");
  ASSERT_EQ(id.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(id.status().message(), HasSubstr("mode 0644"));
  EXPECT_THAT(id.status().message(), HasSubstr("chmod 600 " + key));
  ASSERT_EQ(::chmod(key.c_str(), 0400), 0);  // the owner's alone, read-only: fine
  EXPECT_TRUE(LoadIdentity(dir, "node0").ok());
}

TEST_F(TlsTest, RefusesATamperedCertificate) {
  const std::string dir = Make("job", {"node0"});
  const std::string pem = Read(dir + "/node0.pem");
  // One base64 character in the middle of the body: the DER either no longer
  // parses or no longer matches its signature.
  const size_t body = pem.find('\n') + 1;
  for (size_t at : {body + 200, body + 300, pem.size() - 100}) {
    std::string tampered = pem;
    tampered[at] = tampered[at] == 'A' ? 'B' : 'A';
    Write(dir + "/node0.pem", tampered, 0644);
    Result<Identity> id = LoadIdentity(dir, "node0");
    ASSERT_EQ(id.status().code(), StatusCode::kInvalidArgument) << at;
    EXPECT_THAT(id.status().message(), HasSubstr(dir + "/node0.pem")) << at;
  }
  Write(dir + "/node0.pem", "-----BEGIN CERTIFICATE-----\ngarbage\n-----END CERTIFICATE-----\n",
        0644);
  EXPECT_THAT(LoadIdentity(dir, "node0").status().message(),
              HasSubstr("does not hold a PEM certificate"));
}

TEST_F(TlsTest, RefusesAKeyOfAnotherCertificate) {
  const std::string dir = Make("job", {"node0", "node1"});
  Write(dir + "/node0.key", Read(dir + "/node1.key"), 0600);
  Result<Identity> id = LoadIdentity(dir, "node0");
  ASSERT_EQ(id.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(id.status().message(), HasSubstr(dir + "/node0.key is not the key of"));
}

TEST_F(TlsTest, MissingFilesAndBadNamesAreNamed) {
  const std::string dir = Make("job", {"node0"});
  Result<Identity> missing = LoadIdentity(dir, "node7");
  ASSERT_EQ(missing.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(missing.status().message(), HasSubstr(dir + "/node7.pem does not exist"));
  EXPECT_THAT(missing.status().message(), HasSubstr("endure certs --dir " + dir));
  for (const char* name : {"../job/node0", "", "ca"}) {
    EXPECT_EQ(LoadIdentity(dir, name).status().code(), StatusCode::kInvalidArgument) << name;
  }
}

TEST_F(TlsTest, ReusesTheCaToAddNodes) {
  const std::string dir = Make("job", {"node0"});
  const std::string ca = Read(dir + "/ca.pem");
  const std::string ca_key = Read(dir + "/ca.key");
  const std::string node0 = Read(dir + "/node0.pem");
  Make("job", {"node2"});
  EXPECT_EQ(Read(dir + "/ca.pem"), ca);
  EXPECT_EQ(Read(dir + "/ca.key"), ca_key);
  EXPECT_EQ(Read(dir + "/node0.pem"), node0);  // not requested: untouched
  for (const char* name : {"node0", "node2", "controller"}) {
    Result<Identity> id = LoadIdentity(dir, name);
    EXPECT_TRUE(id.ok()) << name << ": " << id.status().ToString();
  }
}

TEST_F(TlsTest, RefusesACaKeyThatDoesNotMatch) {
  const std::string dir = Make("job", {"node0"});
  const std::string other = Make("other", {"node0"});
  Write(dir + "/ca.key", Read(other + "/ca.key"), 0600);
  CertRequest r;
  r.dir = dir;
  r.nodes = {"node1"};
  const Status st = MakeCertificates(r);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr(dir + "/ca.key is not the key of " + dir + "/ca.pem"));
  EXPECT_FALSE(Env::Default()->Exists(dir + "/node1.pem"));

  ASSERT_EQ(::unlink((dir + "/ca.key").c_str()), 0);
  EXPECT_THAT(MakeCertificates(r).message(), HasSubstr(dir + "/ca.pem exists without"));
}

TEST_F(TlsTest, RefusesBadRequests) {
  const auto code = [&](std::vector<std::string> nodes, std::vector<std::string> hosts,
                        Duration validity) {
    CertRequest r;
    r.dir = Dir("job");
    r.nodes = std::move(nodes);
    r.hosts = std::move(hosts);
    r.validity = validity;
    return MakeCertificates(r).code();
  };
  const Duration year = std::chrono::hours(24 * 365);
  EXPECT_EQ(code({"node0", "../evil"}, {}, year), StatusCode::kInvalidArgument);
  EXPECT_EQ(code({"controller"}, {}, year), StatusCode::kInvalidArgument);
  EXPECT_EQ(code({"ca"}, {}, year), StatusCode::kInvalidArgument);
  EXPECT_EQ(code({"node0", "node0"}, {}, year), StatusCode::kInvalidArgument);
  EXPECT_EQ(code({"node0"}, {"a,DNS:evil"}, year), StatusCode::kInvalidArgument);
  EXPECT_EQ(code({"node0"}, {}, Duration::zero()), StatusCode::kInvalidArgument);
  EXPECT_EQ(code({"node0"}, {}, year * 101), StatusCode::kInvalidArgument);
  EXPECT_FALSE(Env::Default()->Exists(Dir("job")));  // refused before anything was written

  Write(Dir("file"), "x", 0644);
  CertRequest under_a_file;
  under_a_file.dir = Dir("file") + "/certs";
  under_a_file.nodes = {"node0"};
  EXPECT_EQ(MakeCertificates(under_a_file).code(), StatusCode::kIOError);
}

TEST(CheckSanHost, AcceptsAddressesAndDnsNamesOnly) {
  for (const char* ok :
       {"localhost", "node0.example.com", "*.example.com", "10.0.0.1", "::1", "fe80::1", "a-b.c"}) {
    EXPECT_TRUE(CheckSanHost(ok, "--host").ok()) << ok;
  }
  for (const char* bad : {"", "a,b", "a:b", "-a.com", "a..b", "a b", "x.*.com", "a/b", "a.b."}) {
    const Status st = CheckSanHost(bad, "--host");
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(st.message(), HasSubstr("--host: '")) << bad;
  }
  EXPECT_FALSE(CheckSanHost(std::string(300, 'a'), "--host").ok());
}

// Drives a client and a server session over a non-blocking socket pair from
// one thread, each stepping whenever it would wait, until both are done.
class SessionPair {
 public:
  SessionPair(const Context& client_ctx, const Context& server_ctx) {
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds_), 0);
    client_ = Session::New(client_ctx, fds_[0], Session::Role::kClient).value();
    server_ = Session::New(server_ctx, fds_[1], Session::Role::kServer).value();
  }
  ~SessionPair() {
    client_.reset();
    server_.reset();
    ::close(fds_[0]);
    ::close(fds_[1]);
  }

  // OK when both handshakes finish; the first error otherwise.
  Status Handshake() {
    Session* sessions[2] = {client_.get(), server_.get()};
    bool done[2] = {false, false};
    for (int i = 0; i < 1000 && !(done[0] && done[1]); ++i) {
      for (int k = 0; k < 2; ++k) {
        if (done[k]) continue;
        Result<Session::Io> io = sessions[k]->Handshake();
        if (!io.ok()) return io.status();
        done[k] = io->state == Session::State::kDone;
      }
    }
    return done[0] && done[1] ? Status::Ok() : Internal("no progress");
  }

  Session& client() { return *client_; }
  Session& server() { return *server_; }

 private:
  int fds_[2] = {-1, -1};
  std::unique_ptr<Session> client_;
  std::unique_ptr<Session> server_;
};

TEST_F(TlsTest, SessionsAuthenticateBothSidesAndCarryBytes) {
  const std::string dir = Make("job", {"node0", "node1"});
  Result<std::shared_ptr<const Context>> node0 = LoadContext(dir, "node0");
  Result<std::shared_ptr<const Context>> node1 = LoadContext(dir, "node1");
  ASSERT_TRUE(node0.ok()) << node0.status().ToString();
  ASSERT_TRUE(node1.ok()) << node1.status().ToString();
  SessionPair pair(**node0, **node1);
  const Status st = pair.Handshake();
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(pair.client().peer_name(), "node1");
  EXPECT_EQ(pair.server().peer_name(), "node0");
  Result<Session::Io> w = pair.client().Write("hello", 5);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(w->state, Session::State::kDone);
  EXPECT_EQ(w->bytes, 5u);
  char buf[16];
  Result<Session::Io> r = pair.server().Read(buf, sizeof buf);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->state, Session::State::kDone);
  EXPECT_EQ(std::string(buf, r->bytes), "hello");
  Result<Session::Io> nothing = pair.server().Read(buf, sizeof buf);
  ASSERT_TRUE(nothing.ok());
  EXPECT_EQ(nothing->state, Session::State::kWantRead);
  pair.client().Close();
  Result<Session::Io> closed = pair.server().Read(buf, sizeof buf);
  ASSERT_TRUE(closed.ok()) << closed.status().ToString();
  EXPECT_EQ(closed->state, Session::State::kClosed);
}

TEST_F(TlsTest, SessionsRefuseAPeerFromAnotherCa) {
  const std::string dir = Make("job", {"node0"});
  const std::string other = Make("other", {"node0"});
  Result<std::shared_ptr<const Context>> ours = LoadContext(dir, "node0");
  Result<std::shared_ptr<const Context>> theirs = LoadContext(other, "node0");
  ASSERT_TRUE(ours.ok() && theirs.ok());
  SessionPair pair(**theirs, **ours);
  const Status st = pair.Handshake();
  EXPECT_EQ(st.code(), StatusCode::kUnavailable);
  EXPECT_THAT(st.message(), HasSubstr("TLS handshake"));
}

}  // namespace
}  // namespace endure::tls
