#include "bench/sparse_bench.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/barrier.h"
#include "absl/time/clock.h"
#include "bench/bench_cluster.h"
#include "common/status.h"
#include "data/example.h"
#include "proto/parameter_server.pb.h"
#include "rpc/remote_coordinator.h"
#include "rpc/remote_parameter_shard.h"
#include "spec/job_validation.h"
#include "spec/model_shape.h"
#include "tests/local_cluster.h"
#include "worker/param_exchange.h"
#include "worker/sparse_batch.h"
#include "worker/sparse_exchange.h"

namespace downpour {
namespace bench {
namespace {

RemoteParameterShard::Options RemoteOptions(const SparseConfig& config) {
  RemoteParameterShard::Options options;
  options.use_shared_memory = config.shared_memory;
  return options;
}

double Percentile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t i = std::min(values.size() - 1, static_cast<size_t>(q * values.size()));
  return values[i];
}

// Runs body(worker) on `workers` threads started together.
template <typename Body>
void RunWorkers(int workers, Body body) {
  absl::Barrier* ready = new absl::Barrier(workers);
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      if (ready->Block()) delete ready;
      body(w);
    });
  }
  for (std::thread& t : threads) t.join();
}

// CPU seconds (user + system) process `pid` has used; 0 when unreadable.
double ProcessCpuSeconds(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // Fields after the command name, which is in parentheses and may hold
  // spaces: state is field 3, utime 14, stime 15.
  const size_t close = text.rfind(')');
  if (close == std::string::npos) return 0;
  std::vector<std::string> fields = absl::StrSplit(text.substr(close + 2), ' ');
  if (fields.size() < 13) return 0;
  double utime = 0, stime = 0;
  if (!absl::SimpleAtod(fields[11], &utime) || !absl::SimpleAtod(fields[12], &stime)) return 0;
  return (utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

double SelfCpuSeconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_utime.tv_sec + usage.ru_utime.tv_usec * 1e-6 + usage.ru_stime.tv_sec +
         usage.ru_stime.tv_usec * 1e-6;
}

// The sum over a scrape of `metric`'s samples (those of job `job` where it
// is not empty).
double SumOf(const std::string& scrape, const std::string& metric, const std::string& job) {
  const std::string label = absl::StrCat("job=\"", job, "\"");
  double sum = 0;
  for (absl::string_view line : absl::StrSplit(scrape, '\n')) {
    if (!absl::StartsWith(line, metric) || line.size() <= metric.size()) continue;
    const char next = line[metric.size()];
    if (next != '{' && next != ' ') continue;
    if (!job.empty() && !absl::StrContains(line, label)) continue;
    double value = 0;
    if (absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &value)) sum += value;
  }
  return sum;
}

// Ids of one worker's batch: one InputBatch per table (the model's inputs
// are the tables' SPARSE inputs, in order), `batch` examples each.
std::vector<data::InputBatch> DrawBatch(const SparseConfig& config,
                                        const std::vector<ZipfSampler>& zipf,
                                        std::vector<std::mt19937_64>* rngs) {
  std::vector<data::InputBatch> inputs(config.tables);
  for (int t = 0; t < config.tables; ++t) {
    const int per_example = config.features / config.tables + (t < config.features % config.tables);
    data::InputBatch& input = inputs[t];
    input.ids.resize(static_cast<size_t>(config.batch) * per_example);
    input.offsets.resize(config.batch + 1);
    for (int b = 0; b <= config.batch; ++b) input.offsets[b] = int64_t{b} * per_example;
    for (int64_t& id : input.ids) id = zipf[t]((*rngs)[t]) - 1;
  }
  return inputs;
}

std::vector<std::mt19937_64> Rngs(const SparseConfig& config, int worker) {
  std::vector<std::mt19937_64> rngs;
  for (int t = 0; t < config.tables; ++t) {
    std::seed_seq seq{static_cast<uint64_t>(config.seed), static_cast<uint64_t>(worker),
                      static_cast<uint64_t>(t)};
    rngs.emplace_back(seq);
  }
  return rngs;
}

// One worker's prepared step: the batch's plan and its rows' gradients.
struct PreparedBatch {
  std::unique_ptr<SparseBatch> plan;
  std::vector<std::vector<std::vector<float>>> grads;  // [table][shard].
};

// The protobuf bytes of the exchange that pushes `pushed`'s gradients and
// pulls `next`'s rows, all shards, built as SparseExchange builds them, plus
// the rows' bytes both ways; *id_bytes: the ids' part (out twice, back once).
double ExchangeBytes(const SparseConfig& config, const std::string& job_id,
                     const SparseBatch& pushed, const SparseBatch& next, int64_t step,
                     double* id_bytes) {
  double bytes = 0;
  *id_bytes = 0;
  for (int s = 0; s < pushed.num_shards(); ++s) {
    PushPullRequest request;
    PushRequest* push = request.mutable_push();
    push->set_job_id(job_id);
    push->set_worker_rank(config.workers - 1);
    push->set_step(step);
    push->mutable_request_id()->set_worker_id("sparse-bench-worker-00#sparse");
    push->mutable_request_id()->set_incarnation(1);
    push->mutable_request_id()->set_sequence(step * pushed.num_shards() + s + 1);
    PullRequest* pull = request.mutable_pull();
    pull->set_job_id(job_id);
    pull->set_worker_rank(config.workers - 1);
    pull->set_min_version(config.sync ? step + 1 : 0);
    pull->set_dtype(FLOAT32);
    PushPullResponse response;
    int64_t rows_out = 0, rows_back = 0;
    for (int t = 0; t < pushed.num_tables(); ++t) {
      SparseRows* out = push->add_sparse();
      out->set_table(t);
      out->set_dtype(FLOAT32);
      out->mutable_ids()->Assign(pushed.rows(t, s).begin(), pushed.rows(t, s).end());
      SparseRows* asked = pull->add_sparse();
      asked->set_table(t);
      asked->mutable_ids()->Assign(next.rows(t, s).begin(), next.rows(t, s).end());
      SparseRows* back = response.mutable_pull()->add_sparse();
      *back = *asked;
      back->set_dtype(FLOAT32);
      rows_out += static_cast<int64_t>(pushed.rows(t, s).size());
      rows_back += static_cast<int64_t>(next.rows(t, s).size());
    }
    const double row_bytes = 4.0 * config.dim * (rows_out + rows_back);
    bytes += static_cast<double>(request.ByteSizeLong() + response.ByteSizeLong()) + row_bytes;
    *id_bytes += 8.0 * (rows_out + 2 * rows_back);
  }
  return bytes;
}

std::vector<ZipfSampler> Samplers(const SparseConfig& config) {
  return std::vector<ZipfSampler>(config.tables, ZipfSampler(config.vocab, config.skew));
}

// The model's head over `input` (`width` values per example): a hidden
// dense layer of `hidden` units, relu, a dense layer of 2 units, the loss.
// Never exchanged by the benchmark; it exists because a model needs one, and
// its hidden weight has at least 256 x shards elements so that the job can
// be placed on every shard at 1 KiB partitions.
void AddHead(ModelSpec* model, const std::string& input, int64_t width, int shards) {
  const int64_t hidden = std::max<int64_t>(64, (int64_t{256} * shards + width - 1) / width);
  LayerSpec* layer = model->add_layer();
  layer->set_name("hidden");
  if (!input.empty()) layer->add_inputs(input);
  layer->mutable_dense()->set_units(static_cast<int32_t>(hidden));
  model->add_layer()->mutable_relu();
  model->add_layer()->mutable_dense()->set_units(2);
  model->add_layer()->mutable_softmax_cross_entropy();
}

// What both jobs share: no data read (the benchmark draws its own ids),
// Adam, ASYNC unless the config says SYNC.
void SetJobCommon(const SparseConfig& config, JobSpec* spec) {
  spec->mutable_dataset()->set_train_files("unused/train-*");
  spec->mutable_dataset()->set_test_files("unused/test-*");
  spec->mutable_dataset()->set_batch_size(config.batch);
  spec->mutable_optimizer()->set_kind(OptimizerSpec::ADAM);
  spec->mutable_optimizer()->set_learning_rate(1e-3f);
  spec->mutable_consistency()->set_mode(config.sync ? ConsistencySpec::SYNC
                                                    : ConsistencySpec::ASYNC);
  spec->set_num_workers(config.workers);
  spec->set_num_shards(config.shards);
  spec->set_steps(1'000'000'000);
  spec->set_seed(7);
  ApplyJobDefaults(spec);
}

ExchangeOptions WorkerExchangeOptions(const std::string& job_id, const Task& task) {
  ExchangeOptions options;
  options.job_id = job_id;
  options.rank = task.rank();
  // The node the coordinator placed at the rank: shards take the rank's
  // pushes from it alone.
  options.worker_id = task.placement().worker_nodes(task.rank());
  options.incarnation = 1;
  options.pull_timeout = absl::Seconds(120);
  return options;
}

}  // namespace

// ------------------------------------------------------------ Zipf

namespace {
// log1p(x) / x and expm1(x) / x, exact near 0 (Apache Commons RNG's helpers).
double Helper1(double x) {
  return std::fabs(x) > 1e-8 ? std::log1p(x) / x : 1 - x * (0.5 - x * (1.0 / 3 - 0.25 * x));
}
double Helper2(double x) {
  return std::fabs(x) > 1e-8 ? std::expm1(x) / x : 1 + x * 0.5 * (1 + x / 3 * (1 + 0.25 * x));
}
}  // namespace

ZipfSampler::ZipfSampler(int64_t n, double s) : n_(n), s_(s) {
  h_integral_x1_ = H(1.5) - 1;
  h_integral_n_ = H(static_cast<double>(n) + 0.5);
  squeeze_ = 2 - HInverse(H(2.5) - h(2));
}

// The integral of x^-s from 1 to x (log x where s == 1).
double ZipfSampler::H(double x) const {
  const double log_x = std::log(x);
  return Helper2((1 - s_) * log_x) * log_x;
}

double ZipfSampler::HInverse(double x) const {
  double t = x * (1 - s_);
  if (t < -1) t = -1;
  return std::exp(Helper1(t) * x);
}

double ZipfSampler::h(double x) const { return std::exp(-s_ * std::log(x)); }

int64_t ZipfSampler::operator()(std::mt19937_64& rng) const {
  std::uniform_real_distribution<double> uniform(0, 1);
  while (true) {
    const double u = h_integral_n_ + uniform(rng) * (h_integral_x1_ - h_integral_n_);
    const double x = HInverse(u);
    int64_t k = static_cast<int64_t>(x + 0.5);
    k = std::clamp<int64_t>(k, 1, n_);
    if (k - x <= squeeze_ || u >= H(k + 0.5) - h(static_cast<double>(k))) return k;
  }
}

// ------------------------------------------------------------ specs

JobSpec SparseJobSpec(const SparseConfig& config) {
  JobSpec spec;
  spec.set_name("sparse-bench");
  ModelSpec* model = spec.mutable_model();
  model->set_num_classes(2);
  for (int t = 0; t < config.tables; ++t) {
    InputSpec* input = model->add_inputs();
    input->set_name(absl::StrCat("c", t));
    input->set_kind(InputSpec::SPARSE);
    input->set_max_ids(config.features / config.tables + 1);
  }
  for (int t = 0; t < config.tables; ++t) {
    LayerSpec* layer = model->add_layer();
    layer->set_name(absl::StrCat("e", t));
    layer->add_inputs(absl::StrCat("c", t));
    EmbeddingLayer* embedding = layer->mutable_embedding();
    embedding->set_sparse(true);
    embedding->set_vocab_size(config.vocab);
    embedding->set_dim(config.dim);
  }
  std::string head_input = "e0";
  if (config.tables > 1) {
    LayerSpec* joined = model->add_layer();
    joined->set_name("joined");
    for (int t = 0; t < config.tables; ++t) joined->add_inputs(absl::StrCat("e", t));
    joined->mutable_concat();
    head_input = "joined";
  }
  AddHead(model, head_input, int64_t{config.tables} * config.dim, config.shards);
  SetJobCommon(config, &spec);
  spec.set_partition_bytes(1024);
  return spec;
}

JobSpec DenseJobSpec(const SparseConfig& config, int64_t vocab) {
  JobSpec spec;
  spec.set_name("sparse-bench-dense");
  ModelSpec* model = spec.mutable_model();
  model->set_num_classes(2);
  model->add_input_shape(config.features);
  EmbeddingLayer* embedding = model->add_layer()->mutable_embedding();
  embedding->set_vocab_size(vocab);
  embedding->set_dim(config.dim);
  model->add_layer()->mutable_flatten();
  AddHead(model, "", int64_t{config.features} * config.dim, config.shards);
  SparseConfig async = config;
  async.sync = false;
  SetJobCommon(async, &spec);
  return spec;
}

DrawStats CountDistinctRows(const SparseConfig& config, int batches) {
  const std::vector<ZipfSampler> zipf = Samplers(config);
  std::vector<std::mt19937_64> rngs = Rngs(config, 0);
  DrawStats stats;
  absl::flat_hash_set<int64_t> seen;
  for (int i = 0; i < batches; ++i) {
    const std::vector<data::InputBatch> inputs = DrawBatch(config, zipf, &rngs);
    for (const data::InputBatch& input : inputs) {
      seen.clear();
      seen.insert(input.ids.begin(), input.ids.end());
      stats.rows_per_step += static_cast<double>(seen.size());
      stats.ids_per_step += static_cast<double>(input.ids.size());
    }
  }
  stats.rows_per_step /= batches;
  stats.ids_per_step /= batches;
  return stats;
}

std::string ToJson(const SparseResult& r) {
  const SparseConfig& c = r.config;
  return absl::StrFormat(
      "{\"mode\": \"%s\", \"skew\": %.2f, \"workers\": %d, \"shards\": %d, \"batch\": %d, "
      "\"features\": %d, \"tables\": %d, \"dim\": %d, \"vocab\": %d, \"steps\": %d, "
      "\"batches_drawn\": %d, "
      "\"ids_per_step\": %.0f, \"rows_per_step\": %.1f, \"plan_us\": %.0f, "
      "\"step_p50_ms\": %.3f, \"step_p99_ms\": %.3f, \"wall_s\": %.3f, "
      "\"pulled_rows_per_s_worker\": %.0f, \"pushed_rows_per_s_worker\": %.0f, "
      "\"pulled_rows_per_s_shard\": %.0f, \"pushed_rows_per_s_shard\": %.0f, "
      "\"max_rows_per_s_shard\": %.0f, \"shard_cpu_us_per_row\": %.3f, "
      "\"worker_cpu_us_per_row\": %.3f, \"sparse_bytes_per_step\": %.0f, "
      "\"id_bytes_per_step\": %.0f, \"dense_bytes_per_step\": %.0f, \"rows_held\": %d, "
      "\"bytes_per_row\": %.1f, \"dense_vocab\": %d, \"dense_step_p50_ms\": %.3f, "
      "\"dense_measured_bytes_per_step\": %.0f, \"dense_step_ms_scaled\": %.3f, "
      "\"sparse_over_dense_time\": %.5f, \"max_shard_bytes\": %.0f, "
      "\"total_shard_bytes\": %.0f, \"evictions\": %.0f, \"refusals\": %.0f}",
      c.sync ? "SYNC" : "ASYNC", c.skew, c.workers, c.shards, c.batch, c.features, c.tables, c.dim,
      c.vocab, c.steps, r.batches_drawn, r.ids_per_step, r.rows_per_step, r.plan_us, r.step_p50_ms,
      r.step_p99_ms, r.wall_s, r.pulled_rows_per_s_worker, r.pushed_rows_per_s_worker,
      r.pulled_rows_per_s_shard, r.pushed_rows_per_s_shard, r.max_rows_per_s_shard,
      r.shard_cpu_us_per_row, r.worker_cpu_us_per_row, r.sparse_bytes_per_step, r.id_bytes_per_step,
      r.dense_bytes_per_step, r.rows_held, r.bytes_per_row, r.dense_vocab, r.dense_step_p50_ms,
      r.dense_measured_bytes_per_step, r.dense_step_ms_scaled,
      r.dense_step_ms_scaled > 0 ? r.step_p50_ms / r.dense_step_ms_scaled : 0.0, r.max_shard_bytes,
      r.total_shard_bytes, r.evictions, r.refusals);
}

// --------------------------------------------------------- the real cluster

struct SparseBench::State {
  std::unique_ptr<BenchCluster> cluster;
  int jobs = 0;

  // Each shard's /metrics.
  absl::StatusOr<std::vector<std::string>> Scrape(int shards) {
    std::vector<std::string> out;
    for (int s = 0; s < shards; ++s) {
      ASSIGN_OR_RETURN(
          std::string text,
          testing::HttpGet(cluster->processes().MetricsAddressOf(absl::StrCat("ps", s)),
                           "/metrics"));
      out.push_back(std::move(text));
    }
    return out;
  }
  // Waits (20 s at most) until no shard hosts a job; returns the bytes the
  // shards' memory budgets then hold.
  absl::StatusOr<double> AwaitIdleShards(int shards) {
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (true) {
      ASSIGN_OR_RETURN(std::vector<std::string> scrapes, Scrape(shards));
      double jobs = 0, used = 0;
      for (const std::string& scrape : scrapes) {
        jobs += SumOf(scrape, "downpour_ps_jobs", "");
        used += SumOf(scrape, "downpour_shard_memory_used_bytes", "");
      }
      if (jobs == 0) return used;
      if (absl::Now() > deadline) {
        return absl::DeadlineExceededError("the shards still host a stopped job after 20 s");
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
  }
  double ShardCpuSeconds(int shards) {
    double sum = 0;
    for (int s = 0; s < shards; ++s) {
      sum += ProcessCpuSeconds(cluster->processes().shard(s)->pid());
    }
    return sum;
  }
};

SparseBench::SparseBench(const Options& options)
    : options_(options), state_(std::make_unique<State>()) {}

SparseBench::~SparseBench() = default;

std::string SparseBench::Logs() const { return state_->cluster ? state_->cluster->Logs() : ""; }

absl::StatusOr<std::unique_ptr<SparseBench>> SparseBench::Start(const Options& options) {
  std::unique_ptr<SparseBench> bench(new SparseBench(options));
  BenchCluster::Options cluster;
  cluster.shards = options.max_shards;
  cluster.workers = options.max_workers;
  if (options.shard_memory_limit > 0) {
    cluster.shard_flags = {absl::StrCat("--memory_limit=", options.shard_memory_limit)};
  }
  cluster.worker_id_prefix = "sparse-bench-worker-";
  ASSIGN_OR_RETURN(bench->state_->cluster, BenchCluster::Start(cluster));
  return bench;
}

absl::StatusOr<SparseResult> SparseBench::Run(const SparseConfig& config) {
  if (config.workers > options_.max_workers || config.shards > options_.max_shards) {
    return absl::InvalidArgumentError("configuration larger than the started cluster");
  }
  if (config.tables < 1 || config.features < config.tables || config.batch < 1 ||
      config.steps < 1 || config.warmup < 0 || config.vocab < 1 || config.dim < 1 ||
      config.skew <= 0) {
    return absl::InvalidArgumentError(
        "need tables >= 1, features >= tables, batch, steps, vocab, dim >= 1 and skew > 0");
  }
  State& st = *state_;
  SparseResult result;
  result.config = config;
  const JobSpec spec = SparseJobSpec(config);
  RETURN_IF_ERROR(ValidateJobSpec(spec).status());
  ASSIGN_OR_RETURN(const ModelShape shape, InferModel(spec.model()));
  // The shards' memory before the job, once they have dropped the last
  // job (they do on a heartbeat after StopJob).
  ASSIGN_OR_RETURN(const double used_before, st.AwaitIdleShards(config.shards));

  const std::string job_id = absl::StrCat("sparse-", ++st.jobs);
  ASSIGN_OR_RETURN(JobStatus submitted, st.cluster->coordinator().SubmitJob(spec, job_id));
  (void)submitted;
  ASSIGN_OR_RETURN(std::vector<Task> tasks, st.cluster->AwaitTasks(job_id, config.workers));

  // Every worker's batches, drawn and planned before timing: the steps
  // cycle through them where they would not all fit in 1 GiB.
  const int needed = config.warmup + config.steps + 1;
  int drawn = needed;
  {
    const double per_batch = 1.0 * config.batch * config.features * (8 + 8 + 4 * config.dim);
    drawn =
        static_cast<int>(std::clamp<double>((1 << 30) / (per_batch * config.workers), 4, needed));
  }
  std::vector<std::vector<PreparedBatch>> batches(config.workers);
  std::vector<double> plan_seconds(config.workers, 0);
  std::vector<absl::Status> errors(config.workers);
  RunWorkers(config.workers, [&](int w) {
    const std::vector<ZipfSampler> zipf = Samplers(config);
    std::vector<std::mt19937_64> rngs = Rngs(config, w);
    std::mt19937 grad_rng(99 + w);
    std::uniform_real_distribution<float> grad(-1e-3f, 1e-3f);
    for (int i = 0; i < drawn; ++i) {
      const std::vector<data::InputBatch> inputs = DrawBatch(config, zipf, &rngs);
      const absl::Time t0 = absl::Now();
      absl::StatusOr<SparseBatch> plan =
          SparseBatch::Plan(shape, inputs, config.batch, config.shards);
      plan_seconds[w] += absl::ToDoubleSeconds(absl::Now() - t0);
      if (!plan.ok()) {
        errors[w] = plan.status();
        return;
      }
      PreparedBatch prepared;
      prepared.plan = std::make_unique<SparseBatch>(std::move(*plan));
      prepared.grads.resize(config.tables);
      for (int t = 0; t < config.tables; ++t) {
        for (int s = 0; s < config.shards; ++s) {
          std::vector<float> g(prepared.plan->rows(t, s).size() * config.dim);
          for (float& x : g) x = grad(grad_rng);
          prepared.grads[t].push_back(std::move(g));
        }
      }
      batches[w].push_back(std::move(prepared));
    }
  });
  for (const absl::Status& s : errors) RETURN_IF_ERROR(s);
  auto batch_of = [&](int w, int i) -> PreparedBatch& { return batches[w][i % drawn]; };

  // Ids, rows and bytes of the timed steps (the same for every worker in
  // expectation; averaged over all).
  double ids = 0, rows = 0, bytes = 0, id_bytes = 0;
  for (int w = 0; w < config.workers; ++w) {
    for (int i = config.warmup; i < config.warmup + config.steps; ++i) {
      const SparseBatch& pushed = *batch_of(w, i).plan;
      const SparseBatch& next = *batch_of(w, i + 1).plan;
      ids += static_cast<double>(pushed.ids_read());
      rows += static_cast<double>(next.distinct_rows());
      double ids_part = 0;
      bytes += ExchangeBytes(config, job_id, pushed, next, i, &ids_part);
      id_bytes += ids_part;
    }
  }
  const double worker_steps = static_cast<double>(config.workers) * config.steps;
  result.ids_per_step = ids / worker_steps;
  result.rows_per_step = rows / worker_steps;
  result.sparse_bytes_per_step = bytes / worker_steps;
  result.id_bytes_per_step = id_bytes / worker_steps;
  double plan_total = 0;
  for (double seconds : plan_seconds) plan_total += seconds;
  result.plan_us = 1e6 * plan_total / (static_cast<double>(config.workers) * drawn);
  result.batches_drawn = drawn;
  result.dense_bytes_per_step = 2.0 * config.tables * config.vocab * config.dim * 4;

  // Each worker's shard clients and exchange.
  std::vector<std::vector<std::unique_ptr<RemoteParameterShard>>> remotes(config.workers);
  std::vector<std::unique_ptr<SparseExchange>> exchanges;
  for (int w = 0; w < config.workers; ++w) {
    std::vector<ParameterShard*> shards;
    for (const std::string& address : tasks[w].shard_addresses()) {
      remotes[w].push_back(RemoteParameterShard::Create(address, RemoteOptions(config)));
      shards.push_back(remotes[w].back().get());
    }
    exchanges.push_back(std::make_unique<SparseExchange>(
        shape, WorkerExchangeOptions(job_id, tasks[w]), std::move(shards)));
  }
  const auto never = [] { return false; };
  auto min_version = [&](int64_t step) -> int64_t { return config.sync ? step : 0; };
  auto step = [&](int w, int i) {
    PreparedBatch& pushed = batch_of(w, i);
    exchanges[w]->Begin(i, pushed.plan.get(), &pushed.grads, &batch_of(w, i + 1).plan->row_ids(),
                        min_version(i + 1), 0, never);
    return exchanges[w]->Finish();
  };
  // Warm-up: the first pull (the shards host the job by then), a few steps.
  RunWorkers(config.workers, [&](int w) {
    exchanges[w]->Begin(0, nullptr, nullptr, &batch_of(w, 0).plan->row_ids(), 0, 0, never);
    errors[w] = exchanges[w]->Finish();
    for (int i = 0; i < config.warmup && errors[w].ok(); ++i) errors[w] = step(w, i);
  });
  for (const absl::Status& s : errors) RETURN_IF_ERROR(s);

  ASSIGN_OR_RETURN(std::vector<std::string> start_scrape, st.Scrape(config.shards));
  const double shard_cpu0 = st.ShardCpuSeconds(config.shards);
  const double self_cpu0 = SelfCpuSeconds();
  std::vector<int64_t> pulled0(config.workers), pushed0(config.workers);
  for (int w = 0; w < config.workers; ++w) {
    pulled0[w] = exchanges[w]->rows_pulled();
    pushed0[w] = exchanges[w]->rows_pushed();
  }
  std::vector<std::vector<double>> step_ms(config.workers);
  const absl::Time started = absl::Now();
  RunWorkers(config.workers, [&](int w) {
    for (int i = config.warmup; i < config.warmup + config.steps; ++i) {
      const absl::Time t0 = absl::Now();
      errors[w] = step(w, i);
      if (!errors[w].ok()) return;
      step_ms[w].push_back(absl::ToDoubleMilliseconds(absl::Now() - t0));
    }
  });
  const double wall = absl::ToDoubleSeconds(absl::Now() - started);
  for (const absl::Status& s : errors) RETURN_IF_ERROR(s);
  const double shard_cpu = st.ShardCpuSeconds(config.shards) - shard_cpu0;
  const double self_cpu = SelfCpuSeconds() - self_cpu0;
  ASSIGN_OR_RETURN(std::vector<std::string> end_scrape, st.Scrape(config.shards));

  result.wall_s = wall;
  std::vector<double> all_ms;
  double worker_pulled = 0, worker_pushed = 0;
  for (int w = 0; w < config.workers; ++w) {
    all_ms.insert(all_ms.end(), step_ms[w].begin(), step_ms[w].end());
    worker_pulled += static_cast<double>(exchanges[w]->rows_pulled() - pulled0[w]);
    worker_pushed += static_cast<double>(exchanges[w]->rows_pushed() - pushed0[w]);
  }
  result.step_p50_ms = Percentile(all_ms, 0.5);
  result.step_p99_ms = Percentile(all_ms, 0.99);
  result.pulled_rows_per_s_worker = worker_pulled / config.workers / wall;
  result.pushed_rows_per_s_worker = worker_pushed / config.workers / wall;
  double shard_pulled = 0, shard_pushed = 0;
  for (int s = 0; s < config.shards; ++s) {
    const double pulled = SumOf(end_scrape[s], "downpour_shard_sparse_rows_pulled_total", job_id) -
                          SumOf(start_scrape[s], "downpour_shard_sparse_rows_pulled_total", job_id);
    const double pushed = SumOf(end_scrape[s], "downpour_shard_sparse_rows_pushed_total", job_id) -
                          SumOf(start_scrape[s], "downpour_shard_sparse_rows_pushed_total", job_id);
    shard_pulled += pulled;
    shard_pushed += pushed;
    result.max_rows_per_s_shard = std::max(result.max_rows_per_s_shard, (pulled + pushed) / wall);
  }
  result.pulled_rows_per_s_shard = shard_pulled / config.shards / wall;
  result.pushed_rows_per_s_shard = shard_pushed / config.shards / wall;
  if (shard_pulled + shard_pushed > 0) {
    result.shard_cpu_us_per_row = 1e6 * shard_cpu / (shard_pulled + shard_pushed);
    result.worker_cpu_us_per_row = 1e6 * self_cpu / (shard_pulled + shard_pushed);
  }

  // The rows' gauge follows the shards' heartbeats (100 ms here).
  absl::SleepFor(absl::Milliseconds(600));
  ASSIGN_OR_RETURN(std::vector<std::string> after, st.Scrape(config.shards));
  double used_after = 0, held = 0;
  for (const std::string& scrape : after) {
    const double used = SumOf(scrape, "downpour_shard_memory_used_bytes", "");
    used_after += used;
    result.max_shard_bytes = std::max(result.max_shard_bytes, used);
    held += SumOf(scrape, "downpour_shard_sparse_rows", job_id);
    result.evictions += SumOf(scrape, "downpour_shard_sparse_evictions_total", job_id);
    result.refusals += SumOf(scrape, "downpour_shard_memory_refusals_total", "");
  }
  result.total_shard_bytes = used_after;
  result.rows_held = static_cast<int64_t>(held);
  if (held > 0) result.bytes_per_row = (used_after - used_before) / held;
  exchanges.clear();
  RETURN_IF_ERROR(st.cluster->coordinator().StopJob(job_id).status());
  return result;
}

absl::StatusOr<DenseResult> SparseBench::RunDense(const SparseConfig& config, int64_t vocab,
                                                  int steps) {
  if (config.workers > options_.max_workers || config.shards > options_.max_shards) {
    return absl::InvalidArgumentError("configuration larger than the started cluster");
  }
  State& st = *state_;
  const JobSpec spec = DenseJobSpec(config, vocab);
  ASSIGN_OR_RETURN(std::vector<ParamInfo> params, ValidateJobSpec(spec));
  int64_t total = 0;
  for (const ParamInfo& p : params) total += p.num_elements;
  const std::string job_id = absl::StrCat("dense-", ++st.jobs);
  ASSIGN_OR_RETURN(JobStatus submitted, st.cluster->coordinator().SubmitJob(spec, job_id));
  (void)submitted;
  ASSIGN_OR_RETURN(std::vector<Task> tasks, st.cluster->AwaitTasks(job_id, config.workers));
  const std::vector<PartitionPlacement> placement(tasks[0].placement().partitions().begin(),
                                                  tasks[0].placement().partitions().end());
  auto pointers = [&](float* base) {
    std::vector<float*> out;
    int64_t offset = 0;
    for (const ParamInfo& p : params) {
      out.push_back(base + offset);
      offset += p.num_elements;
    }
    return out;
  };
  std::vector<std::vector<std::unique_ptr<RemoteParameterShard>>> remotes(config.workers);
  std::vector<std::unique_ptr<ParameterExchange>> exchanges;
  std::vector<std::vector<float>> grads(config.workers), values(config.workers);
  const auto never = [] { return false; };
  for (int w = 0; w < config.workers; ++w) {
    std::vector<ParameterShard*> shards;
    for (const std::string& address : tasks[w].shard_addresses()) {
      remotes[w].push_back(RemoteParameterShard::Create(address, RemoteOptions(config)));
      shards.push_back(remotes[w].back().get());
    }
    exchanges.push_back(std::make_unique<ParameterExchange>(WorkerExchangeOptions(job_id, tasks[w]),
                                                            placement, std::move(shards)));
    grads[w].assign(total, 1e-4f * (w + 1));
    values[w].resize(total);
    RETURN_IF_ERROR(exchanges[w]->Pull(0, 0, pointers(values[w].data()), never));
  }
  std::vector<std::vector<double>> step_ms(config.workers);
  std::vector<absl::Status> errors(config.workers);
  RunWorkers(config.workers, [&](int w) {
    std::vector<float*> params_out = pointers(values[w].data());
    std::vector<const float*> grads_in;
    for (float* p : pointers(grads[w].data())) grads_in.push_back(p);
    for (int i = -1; i < steps; ++i) {  // Step -1 is the warm-up.
      const absl::Time t0 = absl::Now();
      errors[w] = exchanges[w]->PushPull(i + 1, grads_in, 0, 0, params_out, never);
      if (!errors[w].ok()) return;
      if (i >= 0) step_ms[w].push_back(absl::ToDoubleMilliseconds(absl::Now() - t0));
    }
  });
  for (const absl::Status& s : errors) RETURN_IF_ERROR(s);
  std::vector<double> all;
  for (const auto& ms : step_ms) all.insert(all.end(), ms.begin(), ms.end());
  DenseResult result;
  result.vocab = vocab;
  result.bytes_per_step = 2 * total * static_cast<int64_t>(sizeof(float));
  result.step_p50_ms = Percentile(all, 0.5);
  result.step_p99_ms = Percentile(all, 0.99);
  exchanges.clear();
  RETURN_IF_ERROR(st.cluster->coordinator().StopJob(job_id).status());
  return result;
}

}  // namespace bench
}  // namespace downpour
