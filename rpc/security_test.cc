// TLS credentials, the listen rule and the coordinator's role table, over
// real TLS connections on loopback with certificates from
// scripts/make-certs.sh.
#include "rpc/security.h"

#include <cstdlib>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/metrics.h"
#include "control/fake_coordinator.h"
#include "gmock/gmock.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/dynamic_message.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/impl/codegen/client_unary_call.h"
#include "grpcpp/impl/rpc_method.h"
#include "gtest/gtest.h"
#include "proto/coordinator_service.grpc.pb.h"
#include "rpc/auth.h"
#include "rpc/coordinator_service.h"
#include "rpc/daemon.h"

namespace downpour {
namespace {

using ::testing::HasSubstr;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

class SecurityTest : public ::testing::Test {
 protected:
  // Once per process: daemons' credentials stage the files they were made
  // from, so the files stay the same for every suite.
  static void SetUpTestSuite() {
    if (dir_ != nullptr) return;
    const char* tmp = std::getenv("TEST_TMPDIR");
    dir_ = new std::string(absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/certs"));
    other_ = new std::string(absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/other-ca"));
    ASSERT_EQ(std::system(absl::StrCat("rm -rf ", *dir_, " ", *other_, " && scripts/make-certs.sh ",
                                       *dir_,
                                       " coordinator node:ps0 node:worker0 user:alice:admin "
                                       "user:bob:viewer 2>/dev/null && scripts/make-certs.sh ",
                                       *other_, " node:ps0 2>/dev/null")
                              .c_str()),
              0);
  }

  static TlsFiles Files(const std::string& name, const std::string& dir = *dir_) {
    return TlsFiles{absl::StrCat(dir, "/", name, ".crt"), absl::StrCat(dir, "/", name, ".key"),
                    absl::StrCat(*dir_, "/ca.crt")};
  }
  static SecurityOptions Tls(const std::string& name) {
    SecurityOptions options;
    options.tls = Files(name);
    return options;
  }
  static std::string Token(const std::string& user) {
    std::string token = ReadAll(absl::StrCat(*dir_, "/", user, ".token"));
    while (!token.empty() && token.back() == '\n') token.pop_back();
    return token;
  }

  static std::string* dir_;
  static std::string* other_;
};

std::string* SecurityTest::dir_ = nullptr;
std::string* SecurityTest::other_ = nullptr;

TEST_F(SecurityTest, ValidatesTheFilesWithOneSentence) {
  EXPECT_TRUE(ValidateTlsFiles(Files("ps0"), /*client=*/false).ok());
  // A client may trust the CA alone.
  EXPECT_TRUE(ValidateTlsFiles(TlsFiles{"", "", Files("ps0").ca}, /*client=*/true).ok());

  TlsFiles no_ca = Files("ps0");
  no_ca.ca.clear();
  EXPECT_THAT(ValidateTlsFiles(no_ca, false).message(), HasSubstr("--tls_ca"));
  TlsFiles no_key = Files("ps0");
  no_key.key.clear();
  EXPECT_THAT(ValidateTlsFiles(no_key, false).message(), HasSubstr("--tls_key together"));
  TlsFiles wrong_key = Files("ps0");
  wrong_key.key = Files("worker0").key;
  EXPECT_THAT(ValidateTlsFiles(wrong_key, false).message(), HasSubstr("is not the key of"));
  TlsFiles missing = Files("ps0");
  missing.cert = *dir_ + "/nope.crt";
  EXPECT_THAT(ValidateTlsFiles(missing, false).message(), HasSubstr("nope.crt cannot be read"));
  // The same node name, signed by another CA.
  EXPECT_THAT(ValidateTlsFiles(Files("ps0", *other_), false).message(),
              HasSubstr("is not valid under --tls_ca"));
}

TEST_F(SecurityTest, PlaintextOnlyOnLoopbackUnlessInsecure) {
  SecurityOptions plain;
  EXPECT_TRUE(CheckListenSecurity("127.0.0.1:0", plain).ok());
  EXPECT_TRUE(CheckListenSecurity("localhost:7070", plain).ok());
  const absl::Status refused = CheckListenSecurity("0.0.0.0:7070", plain);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(), HasSubstr("--insecure"));
  EXPECT_FALSE(CheckListenSecurity("10.1.2.3:7070", plain).ok());
  SecurityOptions insecure;
  insecure.insecure = true;
  EXPECT_TRUE(CheckListenSecurity("0.0.0.0:7070", insecure).ok());
  EXPECT_TRUE(CheckListenSecurity("0.0.0.0:7070", Tls("ps0")).ok());
}

TEST_F(SecurityTest, HashesTokensAndChecksTheConfig) {
  EXPECT_EQ(Authenticator::HashToken("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_TRUE(Authenticator::FromFile(*dir_ + "/auth.pbtxt").ok());
  EXPECT_THAT(Authenticator::FromFile(*dir_ + "/none.pbtxt").status().message(),
              HasSubstr("cannot be read"));
  AuthConfig config;
  Principal* p = config.add_principal();
  p->set_name("carol");
  p->set_role(ADMIN);
  p->add_token_sha256("abc");
  EXPECT_THAT(Authenticator::FromConfig(config).status().message(), HasSubstr("64 lower-case hex"));
  p->set_token_sha256(0, Authenticator::HashToken("t"));
  EXPECT_TRUE(Authenticator::FromConfig(config).ok());
  p->set_role(NODE);
  EXPECT_THAT(Authenticator::FromConfig(config).status().message(), HasSubstr("ADMIN or VIEWER"));
  p->set_role(VIEWER);
  p->add_certificate_uri(NodeCertificateUri("ps0"));
  EXPECT_THAT(Authenticator::FromConfig(config).status().message(), HasSubstr("a node's identity"));
  p->clear_certificate_uri();
  *config.add_principal() = *p;
  EXPECT_THAT(Authenticator::FromConfig(config).status().message(), HasSubstr("named twice"));
}

// A coordinator service (over a fake coordinator) behind TLS and the
// authenticator of make-certs.sh's auth.pbtxt.
class RoleTableTest : public SecurityTest {
 protected:
  void SetUp() override {
    auto auth = Authenticator::FromFile(*dir_ + "/auth.pbtxt");
    ASSERT_TRUE(auth.ok()) << auth.status();
    auth_ = std::move(auth).value();
    service_ = std::make_unique<CoordinatorService>(&coordinator_, &metrics_, auth_.get());
    auto credentials = MakeServerCredentials(Tls("coordinator"), ClientCertificates::kOptional);
    ASSERT_TRUE(credentials.ok()) << credentials.status();
    auto server = StartGrpcServer("127.0.0.1:0", {service_.get()}, nullptr, 4 << 20, *credentials);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(server).value();
  }
  void TearDown() override {
    if (server_.server) server_.server->Shutdown();
  }

  // A channel to the service: TLS trusting the CA, with `cert`'s
  // certificate when given.
  std::shared_ptr<grpc::Channel> Channel(const std::string& cert) {
    SecurityOptions options;
    options.tls = cert.empty() ? TlsFiles{"", "", Files("ps0").ca} : Files(cert);
    auto credentials = MakeChannelCredentials(options);
    EXPECT_TRUE(credentials.ok()) << credentials.status();
    grpc::ChannelArguments args;
    args.SetSslTargetNameOverride("localhost");
    return grpc::CreateCustomChannel(server_.address, *credentials, args);
  }

  // Calls `method` with a default request, its node id (if it has one)
  // set to `node`.
  grpc::Status Call(const std::shared_ptr<grpc::Channel>& channel,
                    const google::protobuf::MethodDescriptor& method, const std::string& token,
                    const std::string& node = "worker0") {
    std::unique_ptr<google::protobuf::Message> request(
        google::protobuf::MessageFactory::generated_factory()
            ->GetPrototype(method.input_type())
            ->New());
    const auto* reflection = request->GetReflection();
    if (const auto* field = method.input_type()->FindFieldByName("node_id")) {
      reflection->SetString(request.get(), field, node);
    }
    if (const auto* field = method.input_type()->FindFieldByName("node")) {
      google::protobuf::Message* info = reflection->MutableMessage(request.get(), field);
      info->GetReflection()->SetString(info, info->GetDescriptor()->FindFieldByName("id"), node);
    }
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    if (!token.empty()) context.AddMetadata(kAuthorizationHeader, "Bearer " + token);
    grpc::ByteBuffer in, out;
    bool own = false;
    grpc::GenericSerialize<grpc::ProtoBufferWriter, google::protobuf::Message>(*request, &in, &own);
    const std::string path = absl::StrCat("/", method.service()->full_name(), "/", method.name());
    return grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
        channel.get(),
        grpc::internal::RpcMethod(path.c_str(), grpc::internal::RpcMethod::NORMAL_RPC), &context,
        in, &out);
  }

  MetricsRegistry metrics_;
  control::FakeCoordinator coordinator_;
  std::unique_ptr<Authenticator> auth_;
  std::unique_ptr<CoordinatorService> service_;
  RunningServer server_;
};

TEST_F(RoleTableTest, EveryMethodIsInTheTableAndAnswersEachRoleByIt) {
  const google::protobuf::ServiceDescriptor* service =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
          downpour::Coordinator::service_full_name());
  ASSERT_NE(service, nullptr);
  std::set<std::string> methods;
  for (int i = 0; i < service->method_count(); ++i) methods.insert(service->method(i)->name());
  std::set<std::string> table;
  for (const auto& [name, roles] : CoordinatorService::MethodRoles()) table.insert(name);
  EXPECT_EQ(methods, table) << "every method of the service has one line in the role table";

  struct Who {
    const char* what;
    std::shared_ptr<grpc::Channel> channel;
    std::string token;
    CallerRole role;  // CALLER_ROLE_UNSPECIFIED: unauthenticated.
  };
  const std::vector<Who> callers = {
      {"admin by token", Channel(""), Token("alice"), ADMIN},
      {"viewer by token", Channel(""), Token("bob"), VIEWER},
      {"admin by certificate", Channel("alice"), "", ADMIN},
      {"viewer by certificate", Channel("bob"), "", VIEWER},
      {"node certificate", Channel("worker0"), "", NODE},
      {"no credentials", Channel(""), "", CALLER_ROLE_UNSPECIFIED},
      {"unknown token", Channel(""), "not-a-token", CALLER_ROLE_UNSPECIFIED},
  };
  for (int i = 0; i < service->method_count(); ++i) {
    const google::protobuf::MethodDescriptor& method = *service->method(i);
    const std::vector<CallerRole>& allowed = CoordinatorService::MethodRoles().at(method.name());
    for (const Who& who : callers) {
      const grpc::Status status = Call(who.channel, method, who.token);
      SCOPED_TRACE(absl::StrCat(method.name(), " by ", who.what, ": ", status.error_code(), " ",
                                status.error_message()));
      if (who.role == CALLER_ROLE_UNSPECIFIED) {
        EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
      } else if (std::find(allowed.begin(), allowed.end(), who.role) == allowed.end()) {
        EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
        EXPECT_THAT(status.error_message(),
                    HasSubstr(absl::StrCat("may not call ", method.name())));
      } else {
        // Past the door: the fake coordinator answers (or says it has no
        // job queue).
        EXPECT_NE(status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
        EXPECT_NE(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
        EXPECT_NE(status.error_code(), grpc::StatusCode::UNAVAILABLE);
      }
    }
  }
}

TEST_F(RoleTableTest, ANodeSpeaksOnlyForItself) {
  const auto* service = google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
      downpour::Coordinator::service_full_name());
  for (const char* name : {"RegisterNode", "Heartbeat", "ReportProgress"}) {
    const grpc::Status status =
        Call(Channel("worker0"), *service->FindMethodByName(name), "", /*node=*/"ps0");
    EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED) << name;
    EXPECT_THAT(status.error_message(), HasSubstr("its certificate names worker0")) << name;
  }
}

TEST_F(RoleTableTest, PlaintextClientsAndStrangersCannotConnect) {
  const auto* method = google::protobuf::DescriptorPool::generated_pool()
                           ->FindServiceByName(downpour::Coordinator::service_full_name())
                           ->FindMethodByName("ListJobs");
  auto plaintext = grpc::CreateChannel(server_.address, grpc::InsecureChannelCredentials());
  EXPECT_EQ(Call(plaintext, *method, Token("alice")).error_code(), grpc::StatusCode::UNAVAILABLE);
  // A client that trusts another CA does not trust this server.
  SecurityOptions other;
  other.tls = TlsFiles{"", "", *other_ + "/ca.crt"};
  grpc::ChannelArguments args;
  args.SetSslTargetNameOverride("localhost");
  auto stranger = grpc::CreateCustomChannel(server_.address, *MakeChannelCredentials(other), args);
  EXPECT_EQ(Call(stranger, *method, Token("alice")).error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST_F(SecurityTest, NodeServersRequireACertificateFromTheCa) {
  // A shard's or worker's server: only nodes call it.
  auto credentials = MakeServerCredentials(Tls("ps0"), ClientCertificates::kRequired);
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  auto server = StartGrpcServer("127.0.0.1:0", {}, nullptr, 4 << 20, *credentials);
  ASSERT_TRUE(server.ok()) << server.status();
  auto check = [&](const TlsFiles& files) {
    SecurityOptions options;
    options.tls = files;
    auto channel = grpc::CreateChannel(server->address, *MakeChannelCredentials(options));
    return channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(3));
  };
  EXPECT_TRUE(check(Files("worker0")));
  EXPECT_FALSE(check(TlsFiles{"", "", Files("worker0").ca})) << "no client certificate";
  // Another CA's certificate (trusting ours) is refused too.
  grpc::SslCredentialsOptions stranger;
  stranger.pem_root_certs = ReadAll(Files("worker0").ca);
  stranger.pem_cert_chain = ReadAll(Files("ps0", *other_).cert);
  stranger.pem_private_key = ReadAll(Files("ps0", *other_).key);
  auto channel = grpc::CreateChannel(server->address, grpc::SslCredentials(stranger));
  EXPECT_FALSE(
      channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(3)));
  server->server->Shutdown();
}

}  // namespace
}  // namespace downpour
