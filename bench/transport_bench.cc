#include "bench/transport_bench.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/barrier.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "bench/bench_cluster.h"
#include "bench/naive.grpc.pb.h"
#include "common/status.h"
#include "grpcpp/grpcpp.h"
#include "ps/parameter_store.h"
#include "rpc/remote_coordinator.h"
#include "rpc/remote_parameter_shard.h"
#include "spec/job_validation.h"
#include "spec/shard_map.h"
#include "worker/param_exchange.h"

namespace downpour {
namespace bench {
namespace {

constexpr int kInputs = 1023;

double Seconds(absl::Duration d) { return absl::ToDoubleSeconds(d); }

double Percentile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t i = std::min(values.size() - 1, static_cast<size_t>(q * values.size()));
  return values[i];
}

// Runs body(worker) on `workers` threads started together; returns the wall
// time from the common start to the last finish.
template <typename Body>
absl::Duration RunWorkers(int workers, Body body) {
  absl::Barrier* ready = new absl::Barrier(workers + 1);
  absl::Mutex mu;
  absl::Time start;
  bool go = false;
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      if (ready->Block()) delete ready;
      {
        absl::MutexLock lock(&mu);
        mu.Await(absl::Condition(&go));
      }
      body(w);
    });
  }
  if (ready->Block()) delete ready;
  {
    absl::MutexLock lock(&mu);
    start = absl::Now();
    go = true;
  }
  for (std::thread& t : threads) t.join();
  return absl::Now() - start;
}

// ------------------------------------------------------------ raw TCP

bool WriteAll(int fd, const char* data, size_t n) {
  while (n > 0) {
    const ssize_t k = ::send(fd, data, n, MSG_NOSIGNAL);
    if (k <= 0) return false;
    data += k;
    n -= k;
  }
  return true;
}

bool ReadAll(int fd, char* data, size_t n) {
  while (n > 0) {
    const ssize_t k = ::recv(fd, data, n, 0);
    if (k <= 0) return false;
    data += k;
    n -= k;
  }
  return true;
}

// Echo server: each message is an 8-byte length and that many bytes; the
// server reads it whole into its buffer, then sends the buffer back.
class EchoServer {
 public:
  EchoServer() {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    ::listen(listen_fd_, 64);
    socklen_t len = sizeof(addr);
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    accept_thread_ = std::thread([this] { AcceptLoop(); });
  }
  ~EchoServer() {
    ::shutdown(listen_fd_, SHUT_RDWR);
    ::close(listen_fd_);
    accept_thread_.join();
    for (std::thread& t : connections_) t.join();
  }
  int port() const { return port_; }

 private:
  void AcceptLoop() {
    while (true) {
      const int fd = ::accept(listen_fd_, nullptr, nullptr);
      if (fd < 0) return;
      connections_.emplace_back([fd] {
        int one = 1;
        ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        std::vector<char> buffer;
        uint64_t n = 0;
        while (ReadAll(fd, reinterpret_cast<char*>(&n), sizeof(n))) {
          buffer.resize(n);
          if (!ReadAll(fd, buffer.data(), n) || !WriteAll(fd, buffer.data(), n)) break;
        }
        ::close(fd);
      });
    }
  }
  int listen_fd_ = -1;
  int port_ = 0;
  std::thread accept_thread_;
  std::vector<std::thread> connections_;
};

int Connect(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

// Bytes of the model each shard holds (balanced, as placement does).
std::vector<int64_t> SplitBytes(int64_t total, int shards) {
  std::vector<int64_t> out(shards, (total / shards) & ~int64_t{3});
  out.back() = total - (shards - 1) * out[0];
  return out;
}

struct Timing {
  double gbps = 0;
  double p50_us = 0;
  double p99_us = 0;
};

Timing Summarise(const BenchConfig& config, absl::Duration wall,
                 const std::vector<std::vector<double>>& rtts) {
  std::vector<double> all;
  for (const auto& r : rtts) all.insert(all.end(), r.begin(), r.end());
  Timing t;
  t.gbps = 2.0 * config.size_bytes * config.workers * config.steps / Seconds(wall) / 1e9;
  t.p50_us = Percentile(all, 0.5);
  t.p99_us = Percentile(all, 0.99);
  return t;
}

absl::StatusOr<Timing> RunRawTcp(const BenchConfig& config) {
  std::vector<std::unique_ptr<EchoServer>> servers;
  for (int s = 0; s < config.shards; ++s) servers.push_back(std::make_unique<EchoServer>());
  const std::vector<int64_t> bytes = SplitBytes(config.size_bytes, config.shards);
  std::vector<std::vector<int>> fds(config.workers);
  for (int w = 0; w < config.workers; ++w) {
    for (int s = 0; s < config.shards; ++s) {
      const int fd = Connect(servers[s]->port());
      if (fd < 0) return absl::UnavailableError("raw TCP: cannot connect on loopback");
      fds[w].push_back(fd);
    }
  }
  std::vector<std::vector<double>> rtts(config.workers);
  std::atomic<bool> failed{false};
  auto step = [&](int w, std::vector<char>& out, std::vector<char>& in) {
    for (int s = 0; s < config.shards; ++s) {
      uint64_t n = bytes[s];
      if (!WriteAll(fds[w][s], reinterpret_cast<char*>(&n), sizeof(n)) ||
          !WriteAll(fds[w][s], out.data(), n)) {
        failed = true;
      }
    }
    for (int s = 0; s < config.shards; ++s) {
      if (!ReadAll(fds[w][s], in.data(), bytes[s])) failed = true;
    }
  };
  const absl::Duration wall = RunWorkers(config.workers, [&](int w) {
    std::vector<char> out(config.size_bytes, 1), in(config.size_bytes);
    step(w, out, in);  // Warm-up.
    for (int i = 0; i < config.steps; ++i) {
      const absl::Time t0 = absl::Now();
      step(w, out, in);
      rtts[w].push_back(absl::ToDoubleMicroseconds(absl::Now() - t0));
    }
  });
  for (auto& f : fds) {
    for (int fd : f) ::close(fd);
  }
  if (failed) return absl::InternalError("raw TCP: a send or receive failed");
  // The warm-up step is inside `wall` for every method alike; counting it
  // keeps the comparison fair and the code simple.
  BenchConfig counted = config;
  counted.steps += 1;
  return Summarise(counted, wall, rtts);
}

// ------------------------------------------------------------ naive gRPC

class NaiveService final : public NaiveParameterServer::Service {
 public:
  explicit NaiveService(int64_t n) : params_(n, 0.5f) {}
  grpc::Status Exchange(grpc::ServerContext*, const NaiveTensor* request,
                        NaiveTensor* response) override {
    if (request->values_size() != static_cast<int>(params_.size())) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "wrong size");
    }
    for (float v : params_) response->add_values(v);
    return grpc::Status::OK;
  }

 private:
  const std::vector<float> params_;
};

std::shared_ptr<grpc::Channel> OwnChannel(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  // One TCP connection per channel, as the raw ceiling has.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

absl::StatusOr<Timing> RunNaiveGrpc(const BenchConfig& config) {
  const std::vector<int64_t> bytes = SplitBytes(config.size_bytes, config.shards);
  std::vector<std::unique_ptr<NaiveService>> services;
  std::vector<std::unique_ptr<grpc::Server>> servers;
  std::vector<std::string> addresses;
  for (int s = 0; s < config.shards; ++s) {
    services.push_back(std::make_unique<NaiveService>(bytes[s] / 4));
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.SetMaxReceiveMessageSize(-1);
    builder.SetMaxSendMessageSize(-1);
    builder.RegisterService(services.back().get());
    servers.push_back(builder.BuildAndStart());
    if (!servers.back() || port == 0) return absl::UnavailableError("naive gRPC: cannot listen");
    addresses.push_back(absl::StrCat("127.0.0.1:", port));
  }
  std::vector<std::vector<double>> rtts(config.workers);
  std::atomic<bool> failed{false};
  const absl::Duration wall = RunWorkers(config.workers, [&](int w) {
    std::vector<std::unique_ptr<NaiveParameterServer::Stub>> stubs;
    for (int s = 0; s < config.shards; ++s) {
      stubs.push_back(NaiveParameterServer::NewStub(OwnChannel(addresses[s])));
    }
    std::vector<float> grads(config.size_bytes / 4, 0.25f), params(config.size_bytes / 4);
    auto step = [&] {
      int64_t offset = 0;
      // Push to every shard, then pull from every shard, one shard at a time:
      // the unary pattern such a server is driven with.
      for (int s = 0; s < config.shards; ++s) {
        const int64_t n = bytes[s] / 4;
        NaiveTensor request, response;
        for (int64_t i = 0; i < n; ++i) request.add_values(grads[offset + i]);
        grpc::ClientContext context;
        context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
        if (!stubs[s]->Exchange(&context, request, &response).ok() || response.values_size() != n) {
          failed = true;
          return;
        }
        std::copy(response.values().begin(), response.values().end(), params.begin() + offset);
        offset += n;
      }
    };
    step();  // Warm-up.
    for (int i = 0; i < config.steps; ++i) {
      const absl::Time t0 = absl::Now();
      step();
      rtts[w].push_back(absl::ToDoubleMicroseconds(absl::Now() - t0));
    }
  });
  for (auto& server : servers) server->Shutdown(std::chrono::system_clock::now());
  if (failed) return absl::InternalError("naive gRPC: an Exchange call failed");
  BenchConfig counted = config;
  counted.steps += 1;
  return Summarise(counted, wall, rtts);
}

std::vector<float> Gradient(int64_t n, int rank) {
  std::vector<float> g(n);
  std::mt19937 rng(1234 + rank);
  std::uniform_real_distribution<float> dist(-1e-2f, 1e-2f);
  for (float& x : g) x = dist(rng);
  return g;
}

// Tensor pointers of the one-dense-layer model held in `buffer`.
template <typename T>
std::vector<T*> TensorPointers(const std::vector<ParamInfo>& params, T* buffer) {
  std::vector<T*> out;
  int64_t offset = 0;
  for (const ParamInfo& p : params) {
    out.push_back(buffer + offset);
    offset += p.num_elements;
  }
  return out;
}

}  // namespace

std::string ToJson(const BenchResult& r) {
  return absl::StrFormat(
      "{\"size_bytes\": %d, \"workers\": %d, \"shards\": %d, \"steps\": %d, "
      "\"raw_tcp_gbps\": %.3f, \"naive_grpc_gbps\": %.3f, \"downpour_gbps\": %.3f, "
      "\"rtt_p50_us\": %.0f, \"rtt_p99_us\": %.0f, \"raw_rtt_p50_us\": %.0f, "
      "\"raw_rtt_p99_us\": %.0f, \"naive_rtt_p50_us\": %.0f, \"apply_gbps\": %.3f, "
      "\"memcpy_gbps\": %.3f, \"apply_1t_gbps\": %.3f, \"memcpy_1t_gbps\": %.3f, "
      "\"max_abs_diff_vs_local\": %g, \"transport\": \"%s\", \"signalled\": %lld, "
      "\"wire_gbps\": %.3f, "
      "\"wire_rtt_p50_us\": %.0f}",
      r.config.size_bytes, r.config.workers, r.config.shards, r.config.steps, r.raw_tcp_gbps,
      r.naive_grpc_gbps, r.downpour_gbps, r.rtt_p50_us, r.rtt_p99_us, r.raw_rtt_p50_us,
      r.raw_rtt_p99_us, r.naive_rtt_p50_us, r.apply_gbps, r.memcpy_gbps, r.apply_1t_gbps,
      r.memcpy_1t_gbps, r.max_abs_diff_vs_local, r.transport, static_cast<long long>(r.signalled),
      r.wire_gbps, r.wire_rtt_p50_us);
}

int DefaultSteps(int64_t size_bytes, int workers) {
  if (size_bytes <= (2 << 20)) return 200;
  const int64_t budget = int64_t{384} << 20;  // Bytes pushed per method.
  return static_cast<int>(std::clamp<int64_t>(budget / (size_bytes * workers), 3, 50));
}

JobSpec BenchJobSpec(int64_t size_bytes, int workers, int shards) {
  JobSpec spec;
  spec.set_name("transport-bench");
  const int64_t units = std::max<int64_t>(1, size_bytes / 4 / (kInputs + 1));
  ModelSpec* model = spec.mutable_model();
  model->add_input_shape(kInputs);
  model->set_num_classes(static_cast<int32_t>(units));
  model->add_layer()->mutable_dense()->set_units(static_cast<int32_t>(units));
  model->add_layer()->mutable_softmax_cross_entropy();
  // Never read: the benchmark's workers push synthetic gradients.
  spec.mutable_dataset()->set_train_files("unused/train-*");
  spec.mutable_dataset()->set_test_files("unused/test-*");
  spec.mutable_dataset()->set_batch_size(1);
  spec.mutable_optimizer()->set_kind(OptimizerSpec::ADAM);
  spec.mutable_optimizer()->set_learning_rate(1e-3f);
  spec.mutable_consistency()->set_mode(ConsistencySpec::ASYNC);
  spec.set_num_workers(workers);
  spec.set_num_shards(shards);
  spec.set_steps(1'000'000'000);
  spec.set_seed(7);
  // At least 8 partitions, so even the 1 MiB model spreads over 4 shards and
  // pipelines; never more than the default 4 MiB.
  spec.set_partition_bytes(std::clamp<int64_t>(size_bytes / 8, 64 << 10, kDefaultPartitionBytes));
  ApplyJobDefaults(&spec);
  return spec;
}

absl::StatusOr<ApplyBandwidth> MeasureApply(int64_t size_bytes) {
  const JobSpec spec = BenchJobSpec(size_bytes, 1, 1);
  ASSIGN_OR_RETURN(std::vector<ParamInfo> params, ValidateJobSpec(spec));
  ASSIGN_OR_RETURN(std::vector<PartitionPlacement> placed,
                   PlacePartitions(params, 1, spec.partition_bytes()));
  ParameterStore store;
  RETURN_IF_ERROR(store.AddJob("apply", spec, 0, placed));
  int64_t total = 0;
  for (const ParamInfo& p : params) total += p.num_elements;
  const std::vector<float> grads = Gradient(total, 0);
  // One request per partition, applied on `threads` threads at once: what
  // downpour-ps does with a worker's pipelined push.
  std::vector<PushRequest> requests;
  std::vector<Payload> payloads;
  for (const PartitionPlacement& p : placed) {
    PushRequest request;
    request.set_job_id("apply");
    request.mutable_request_id()->set_worker_id("apply");
    PartitionHeader* header = request.add_partitions();
    header->mutable_key()->set_tensor_id(p.tensor_id());
    header->mutable_key()->set_partition(p.partition());
    header->set_dtype(FLOAT32);
    header->set_num_elements(p.num_elements());
    int64_t base = 0;
    for (int t = 0; t < p.tensor_id(); ++t) base += params[t].num_elements;
    Payload payload;
    payload.Append(reinterpret_cast<const char*>(grads.data() + base + p.offset()),
                   p.num_elements() * sizeof(float));
    requests.push_back(std::move(request));
    payloads.push_back(std::move(payload));
  }
  ApplyBandwidth out;
  out.threads = std::max(1, std::min(2, static_cast<int>(std::thread::hardware_concurrency())));
  std::vector<char> from(total * 4, 1), to(total * 4, 2);
  int64_t sequence = 0;
  // Best of 3 timed repetitions after a warm-up, for `threads` threads.
  auto measure = [&](int threads, double* apply_gbps, double* memcpy_gbps) -> absl::Status {
    double best_apply = 1e30;
    for (int rep = 0; rep < 4; ++rep) {
      std::atomic<size_t> next{0};
      std::atomic<bool> failed{false};
      for (PushRequest& r : requests) r.mutable_request_id()->set_sequence(++sequence);
      const absl::Time t0 = absl::Now();
      std::vector<std::thread> workers;
      for (int t = 0; t < threads; ++t) {
        workers.emplace_back([&] {
          for (size_t i = next++; i < requests.size(); i = next++) {
            if (!store.Push(requests[i], payloads[i]).ok()) failed = true;
          }
        });
      }
      for (std::thread& t : workers) t.join();
      if (failed) return absl::InternalError("apply benchmark: a push failed");
      if (rep > 0) best_apply = std::min(best_apply, Seconds(absl::Now() - t0));
    }
    double best_copy = 1e30;
    for (int rep = 0; rep < 4; ++rep) {
      const absl::Time t0 = absl::Now();
      std::vector<std::thread> workers;
      const size_t part = from.size() / threads;
      for (int t = 0; t < threads; ++t) {
        workers.emplace_back([&, t] {
          const size_t begin = t * part;
          const size_t end = t + 1 == threads ? from.size() : begin + part;
          std::memcpy(to.data() + begin, from.data() + begin, end - begin);
        });
      }
      for (std::thread& t : workers) t.join();
      if (rep > 0) best_copy = std::min(best_copy, Seconds(absl::Now() - t0));
      from[rep] = to[rep + 1];
    }
    *apply_gbps = total * 4 / best_apply / 1e9;
    *memcpy_gbps = total * 4 / best_copy / 1e9;
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(measure(1, &out.apply_1t_gbps, &out.memcpy_1t_gbps));
  RETURN_IF_ERROR(measure(out.threads, &out.apply_gbps, &out.memcpy_gbps));
  return out;
}

// --------------------------------------------------------- the real cluster

struct TransportBench::State {
  std::unique_ptr<BenchCluster> cluster;
  int jobs = 0;
};

TransportBench::TransportBench(const Options& options)
    : options_(options), state_(std::make_unique<State>()) {}

TransportBench::~TransportBench() = default;

std::string TransportBench::Logs() const { return state_->cluster ? state_->cluster->Logs() : ""; }

absl::StatusOr<std::unique_ptr<TransportBench>> TransportBench::Start(const Options& options) {
  std::unique_ptr<TransportBench> bench(new TransportBench(options));
  BenchCluster::Options cluster;
  cluster.shards = options.max_shards;
  cluster.workers = options.max_workers;
  if (!options.shared_memory) cluster.shard_flags.push_back("--shared_memory=false");
  ASSIGN_OR_RETURN(bench->state_->cluster, BenchCluster::Start(cluster));
  return bench;
}

absl::StatusOr<BenchResult> TransportBench::Run(const BenchConfig& config) {
  if (config.workers > options_.max_workers || config.shards > options_.max_shards) {
    return absl::InvalidArgumentError("configuration larger than the started cluster");
  }
  BenchResult result;
  result.config = config;
  ASSIGN_OR_RETURN(Timing raw, RunRawTcp(config));
  result.raw_tcp_gbps = raw.gbps;
  result.raw_rtt_p50_us = raw.p50_us;
  result.raw_rtt_p99_us = raw.p99_us;
  if (options_.naive) {
    ASSIGN_OR_RETURN(Timing naive, RunNaiveGrpc(config));
    result.naive_grpc_gbps = naive.gbps;
    result.naive_rtt_p50_us = naive.p50_us;
  }

  State& st = *state_;
  const JobSpec spec = BenchJobSpec(config.size_bytes, config.workers, config.shards);
  const std::string job_id = absl::StrCat("bench-", ++st.jobs);
  ASSIGN_OR_RETURN(JobStatus submitted, st.cluster->coordinator().SubmitJob(spec, job_id));
  (void)submitted;
  // The coordinator hands the job to `workers` of our nodes.
  ASSIGN_OR_RETURN(std::vector<Task> tasks, st.cluster->AwaitTasks(job_id, config.workers));
  ASSIGN_OR_RETURN(std::vector<ParamInfo> params, ValidateJobSpec(spec));
  int64_t total = 0;
  for (const ParamInfo& p : params) total += p.num_elements;
  const std::vector<PartitionPlacement> placement(tasks[0].placement().partitions().begin(),
                                                  tasks[0].placement().partitions().end());

  auto make_exchange = [&](const Task& task, std::vector<ParameterShard*> shards, int incarnation) {
    ExchangeOptions options;
    options.job_id = job_id;
    options.rank = task.rank();
    // The node the coordinator placed at the rank: shards take the rank's
    // pushes from it alone.
    options.worker_id = task.placement().worker_nodes(task.rank());
    options.incarnation = incarnation;
    options.pull_timeout = absl::Seconds(60);
    if (options_.message_bytes > 0) options.message_bytes = options_.message_bytes;
    return std::make_unique<ParameterExchange>(options, placement, std::move(shards));
  };
  auto never = [] { return false; };
  std::vector<std::vector<float>> grads, pulled;
  for (int w = 0; w < config.workers; ++w) {
    grads.push_back(Gradient(total, w));
    pulled.emplace_back(total);
  }
  // One timed pass of every worker's steps, its tensor bytes through shared
  // memory or not; `incarnation` numbers the pass (a later pass's requests
  // are new to the shards).
  struct Pass {
    Timing timing;
    int64_t segment_bytes = 0;
    int64_t signalled = 0;
  };
  auto run_pass = [&](bool shared_memory, int incarnation) -> absl::StatusOr<Pass> {
    std::vector<std::vector<double>> rtts(config.workers);
    std::vector<absl::Status> errors(config.workers);
    // Every worker's shards are connected and the job hosted before timing.
    std::vector<std::vector<std::unique_ptr<RemoteParameterShard>>> remotes(config.workers);
    std::vector<std::unique_ptr<ParameterExchange>> exchanges;
    for (int w = 0; w < config.workers; ++w) {
      std::vector<ParameterShard*> shards;
      for (const std::string& address : tasks[w].shard_addresses()) {
        RemoteParameterShard::Options remote_options;
        remote_options.use_streams = options_.streams;
        remote_options.use_shared_memory = shared_memory;
        remotes[w].push_back(RemoteParameterShard::Create(address, remote_options));
        shards.push_back(remotes[w].back().get());
      }
      exchanges.push_back(make_exchange(tasks[w], shards, incarnation));
      RETURN_IF_ERROR(exchanges[w]->Pull(0, 0, TensorPointers(params, pulled[w].data()), never));
    }
    const absl::Duration wall = RunWorkers(config.workers, [&](int w) {
      const auto grad_ptrs = TensorPointers<const float>(params, grads[w].data());
      const auto param_ptrs = TensorPointers(params, pulled[w].data());
      for (int i = -1; i < config.steps; ++i) {  // Step -1 is the warm-up.
        const absl::Time t0 = absl::Now();
        absl::Status s;
        if (options_.push_pull) {
          s = exchanges[w]->PushPull(i + 1, grad_ptrs, 0, 0, param_ptrs, never);
        } else {
          s = exchanges[w]->Push(i + 1, grad_ptrs);
          if (s.ok()) s = exchanges[w]->Pull(0, 0, param_ptrs, never);
        }
        if (!s.ok()) {
          errors[w] = s;
          return;
        }
        if (i >= 0) rtts[w].push_back(absl::ToDoubleMicroseconds(absl::Now() - t0));
      }
    });
    for (const absl::Status& s : errors) {
      if (!s.ok()) return s;
    }
    Pass pass;
    BenchConfig counted = config;
    counted.steps += 1;
    pass.timing = Summarise(counted, wall, rtts);
    for (const auto& of_worker : remotes) {
      for (const auto& remote : of_worker) {
        const RemoteParameterShard::SharedMemoryStats stats = remote->shared_memory_stats();
        pass.segment_bytes += stats.push_bytes + stats.pull_bytes;
        pass.signalled += stats.signalled;
      }
    }
    return pass;
  };
  // Over the wire; then, with shared memory on, the same steps through it.
  const int passes = options_.shared_memory ? 2 : 1;
  for (int p = 0; p < passes; ++p) {
    const bool shared_memory = p == 1;
    ASSIGN_OR_RETURN(const Pass pass, run_pass(shared_memory, /*incarnation=*/p + 1));
    if (!shared_memory) {
      result.wire_gbps = pass.timing.gbps;
      result.wire_rtt_p50_us = pass.timing.p50_us;
    }
    result.downpour_gbps = pass.timing.gbps;
    result.rtt_p50_us = pass.timing.p50_us;
    result.rtt_p99_us = pass.timing.p99_us;
    result.transport = pass.segment_bytes > 0 ? "shared_memory" : "wire";
    result.signalled = pass.signalled;
  }

  if (config.workers == 1) {
    // Replay the same pushes on in-process shards and compare.
    std::vector<std::unique_ptr<ParameterStore>> stores;
    std::vector<ParameterShard*> shards;
    for (int s = 0; s < config.shards; ++s) {
      stores.push_back(std::make_unique<ParameterStore>());
      RETURN_IF_ERROR(stores.back()->AddJob(job_id, spec, s, placement));
      shards.push_back(stores.back().get());
    }
    auto local = make_exchange(tasks[0], shards, 1);
    const auto grad_ptrs = TensorPointers<const float>(params, grads[0].data());
    for (int p = 0; p < passes; ++p) {
      for (int i = -1; i < config.steps; ++i) RETURN_IF_ERROR(local->Push(i + 1, grad_ptrs));
    }
    std::vector<float> expected(total);
    RETURN_IF_ERROR(local->Pull(0, 0, TensorPointers(params, expected.data()), never));
    double diff = 0;
    for (int64_t i = 0; i < total; ++i) {
      diff = std::max<double>(diff, std::fabs(expected[i] - pulled[0][i]));
    }
    result.max_abs_diff_vs_local = diff;
  }
  RETURN_IF_ERROR(st.cluster->coordinator().StopJob(job_id).status());
  return result;
}

}  // namespace bench
}  // namespace downpour
