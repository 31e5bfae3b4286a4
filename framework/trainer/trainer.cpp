#include "framework/trainer/trainer.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <thread>


#include "hp/comm/context.h"
#include "hp/comm/env.h"
#include "hp/comm/flight_recorder.h"
#include "hp/fault/stop.h"
#include "hp/profile/trace.h"
#include "checkpoint/reader.h"
#include "checkpoint/safetensors.h"
#include "hp/data/dataset.h"
#include "hp/data/tokenizer.h"
#include "hp/data/tokens.h"
#include "hp/logging/logging.h"
#include "hp/memory/allocator.h"
#include "hp/memory/large_pool.h"
#include "hp/model/dropout.h"
#include "hp/model/kv_cache.h"
#include "hp/model/extensions.h"
#include "hp/model/model.h"
#include "hp/model/precision.h"
#include "framework/model/packed_gemm.h"
#include "framework/model/registry.h"
#include "framework/model/tensor_dump.h"
#include "hp/optim/grad_sync.h"
#include "hp/optim/optimizer.h"
#include "hp/plugin/feature_runtime.h"
#include "framework/runtime/setup.h"
#include "hp/trainer/checkpoint_adapter.h"
#include "hp/trainer/executor.h"
#include "framework/trainer/checkpoint_run.h"
#include "framework/trainer/grad_dump.h"
#include "framework/trainer/options.h"
#include "framework/trainer/profiling.h"
#include "framework/trainer/resume_check.h"
#include "framework/trainer/run_report.h"
#include "framework/trainer/throughput.h"
#include "hp/trainer/training_metrics.h"
#include "framework/util/blas_check.h"
#include "framework/util/strings.h"

namespace hp {

Trainer::Trainer(RawConfig raw) : raw_(std::move(raw)) {}

Trainer Trainer::from_file(const std::string& path, const std::vector<std::string>& overrides) {
  RawConfig raw = RawConfig::parse_file(path);
  for (const auto& o : overrides) raw.apply_override(o);
  return Trainer(std::move(raw));
}

Trainer Trainer::from_yaml(const std::string& yaml) { return Trainer(RawConfig::parse_string(yaml, "<yaml>")); }

Trainer& Trainer::set(const std::string& key, const std::string& yaml_value) {
  raw_.set(key, yaml_value);
  return *this;
}

Trainer& Trainer::enable(const std::string& feature, const std::map<std::string, std::string>& options) {
  raw_.set("features." + feature + ".enabled", "true");
  for (const auto& [k, v] : options) raw_.set("features." + feature + "." + k, v);
  return *this;
}

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }


/// What one step produced, global figures.
struct StepResult {
  double loss = 0, lr = 0, grad_norm = 0, seconds = 0;
  std::map<std::string, double> figures;  ///< executor, hooks and auxiliary losses
};

/// One fit: everything it owns, destroyed in reverse order of declaration
/// (the model, which may hold plugin code, before the runtime that keeps
/// the plugins loaded).
class TrainingRun {
 public:
  explicit TrainingRun(const RawConfig& raw);
  ~TrainingRun();
  FitResult fit();
  EvalResult evaluate_checkpoint();
  /// Builds the model and loads checkpoint.resume (hp::Generator).
  void load_for_generation();
  /// Generation on the model as it is (loaded or being trained).
  GenerateResult generate_loaded(const GenerateOptions& o);
  /// training.sample_interval: continue the sample prompt with the model as
  /// it is after `step` steps; rank 0 logs it and writes it to metrics.jsonl.
  void sample(std::int64_t step);
  std::unique_ptr<Tokenizer> sample_tokenizer_;
  std::vector<std::int64_t> sample_ids_;
  void check_prompts(const GenerateOptions& o) const;
  /// Writes this rank's flight record after a failure; logs where.
  void record_failure(const std::string& reason);

 private:
  void setup_process();
  void setup_model();
  void setup_throughput();
  void resume();
  /// Resolves every parameter's optimizer group (weight decay, lr scale)
  /// into optim_ before the optimizer is built.
  void set_param_groups(const Config& c);
  StepResult step(std::int64_t step);
  void cadence(std::int64_t step, const StepResult& r, FitResult& result);
  double evaluate();
  void save(std::int64_t step);
  /// Sums `values` over the replicas, then the partitions, so every rank
  /// gets the global figure.
  void sum_globally(at::Tensor& values);
  /// The batch cut to the sequence positions this rank holds (unchanged
  /// without a sequence layout).
  Batch local_positions(Batch batch) const;
  StepContext context(std::int64_t step, double loss, std::map<std::string, double>* figures);
  bool rank0() const { return env_.rank == 0; }
  /// Parameters and buffers: what a checkpoint holds of the model.
  std::vector<ParamEntry> model_tensors() const {
    auto all = model_.params;
    all.insert(all.end(), model_.buffers.begin(), model_.buffers.end());
    return all;
  }

  Setup setup_;
  dist::DistEnv env_;
  RunOptions run_;
  TrainingOptions train_;
  ScheduleOptions schedule_;
  OptimizerOptions optim_;
  double training_peak_ = 0;  ///< resident peak after the last step, before its save
  /// The large block pool's figures at the same point (zero without it).
  memory::LargePoolStats training_pool_;
  double start_resident_ = 0;  ///< resident memory when fit() began
  std::string policy_text_;  ///< GroupPolicy::describe() of the run, recorded in checkpoints
  CheckpointOptions ckpt_;
  std::shared_ptr<dist::DistributedContext> ctx_;
  std::unique_ptr<dist::flight::Watchdog> watchdog_;
  // What a SIGTERM's line says about this rank (include/hp/fault/stop.h):
  // the action, then where the flight record went. Removed before what
  // they read.
  std::unique_ptr<stop::Note> action_note_, flight_note_;
  std::unique_ptr<TrainingMetrics> metrics_;
  std::unique_ptr<RunProfiler> profiler_;
  std::unique_ptr<Throughput> throughput_;
  std::unique_ptr<FeatureRuntime> runtime_;
  std::shared_ptr<StepExecutor> executor_;  // may hold plugin code: after runtime
  std::shared_ptr<Dataset> data_;
  ModelDescription desc_;
  BuiltModel model_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<GradReducer> reducer_;
  std::unique_ptr<CheckpointIO> checkpoint_;
  std::int64_t start_ = 0;
  double tokens_total_ = 0, samples_total_ = 0;
};

TrainingRun::TrainingRun(const RawConfig& raw) {
  env_ = dist::read_dist_env();
  setup_ = prepare(raw, env_.world_size);  // throws ConfigException, before any group
  const Config& c = setup_.config;
  run_ = RunOptions::from(c);
  train_ = TrainingOptions::from(c);
  schedule_ = ScheduleOptions::from(c);
  optim_ = OptimizerOptions::from(c);
  ckpt_ = CheckpointOptions::from(c);
}

TrainingRun::~TrainingRun() {
  flight_note_.reset();
  action_note_.reset();
  watchdog_.reset();
  checkpoint_.reset();
  reducer_.reset();
  optimizer_.reset();
  model_ = BuiltModel();
  desc_ = ModelDescription();
  executor_.reset();
  runtime_.reset();
}

void TrainingRun::setup_process() {
  const Config& c = setup_.config;
  log::init(env_.rank, setup_.mesh.tag(env_.rank), c.get_string("logging.level"), c.get_string("logging.file"));
  auto log = log::logger();
  // A launcher's SIGTERM ends this rank promptly in every state, a
  // background save in flight included (abandoned, never committed).
  stop::install(env_.rank);
  action_note_ = std::make_unique<stop::Note>([] { return "at " + dist::flight::describe(dist::flight::current_action()); });
  // A launcher gives each rank its share of the cores (hp-launch's
  // HP_INTRA_OP_THREADS, OMP_NUM_THREADS from torchrun or the user); else the
  // cores are split among the local ranks (LibTorch's default counts physical
  // cores only, often half of them, and ignores the other ranks).
  const dist::IntraOpThreads intra = dist::choose_intra_op_threads(env_, dist::usable_cores());
  const int threads = intra.threads;
  at::set_num_threads(threads);
  set_blas_threads(threads);
  if (rank0()) {
    warn_if_reference_blas(*log);
    note_openblas_kernels(*log);
    log->info("packed expert products: {}", packed_gemm::describe_best_kernel());
  }
  // glibc returns a freed block above its (adaptive, at most 32 MiB) mmap
  // threshold to the system, and trims the heap's top once 2x that is free;
  // mimalloc decommits freed pages after 25 ms: a step's large buffers
  // (gradient buckets, gathered slices) were then unmapped and page-faulted
  // back every step (zero at dp=2: 4.3k -> 5.6k tokens/s with them kept,
  // RFC 0006). Kept for reuse instead.
  // Large tensors from one best-fit pool: under mimalloc they shared 32 MiB
  // segments with every thread's small pages, and the same run peaked 20
  // MiB apart from one launch to the next (RFC 0002).
  const bool keep = setup_.config.get_bool("run.keep_freed_memory");
  const bool pool = keep && setup_.config.get_bool("run.large_block_pool");
  if (keep) memory::keep_freed_memory();
  if (pool) memory::use_large_block_pool(memory::kLargeBlockMin);
  if (rank0())
    log->info("memory: {}{}{}", memory::allocator_name(), keep ? ", freed memory kept for the next step" : "",
              pool ? ", tensors of 64 KiB and more from one best-fit pool" : "");

  // Data first: a missing or empty corpus is refused before anything starts.
  data_ = make_dataset(c);
  const dist::ContextOptions opts = context_options(c);
  dist::flight::set_action({});
  ctx_ = dist::DistributedContext::create(env_, setup_.mesh, opts);
  if (ctx_->recorder()) {
    dist::flight::WatchOptions wo;
    wo.dir = run_.output_dir + "/flight";
    wo.heartbeat_seconds = c.get_float("distributed.heartbeat_seconds");
    wo.stall_seconds = c.get_float("distributed.stall_seconds");
    wo.abort_on_stall = c.get_string("distributed.on_stall") == "abort";
    watchdog_ = std::make_unique<dist::flight::Watchdog>(ctx_->recorder(), wo,
                                                         [log](const std::string& line) { log->warn("{}", line); });
    flight_note_ = std::make_unique<stop::Note>([this] {
      const std::string path = watchdog_->dump("terminated by SIGTERM from " + stop::sender());
      return path.empty() ? std::string("no flight record (it could not be written)") : "flight record written to " + path;
    });
  }
  if (rank0()) {
    std::filesystem::create_directories(run_.output_dir);
    std::ofstream(run_.output_dir + "/config.yaml") << c.to_yaml();
    log->info("{}", data_->describe());
    std::string shm;
    for (const auto& g : ctx_->shm_groups()) shm += (shm.empty() ? "" : ", ") + g;
    if (!shm.empty()) log->info("sums and gathers through shared memory in group(s) {} (distributed.shm_collectives)", shm);
    for (const auto& why : ctx_->shm_fallbacks()) {
      log->info("sums and gathers through Gloo in group {} (distributed.shm_collectives asked for shared memory)", why);
    }
    log->info("launch: {}", dist::describe_launch(env_));
    log->info("mesh {} over {} ranks ({} backend, intra-op threads: {} ({}))", setup_.mesh.shape(),
              env_.world_size, opts.backend, at::get_num_threads(), intra.why);
    if (env_.world_size > 1 && opts.init_method != "file") {
      log->info("ranks from {} variables; store at {}:{} ({})", env_.source, env_.master_addr,
                env_.master_port, env_.master_from);
    }
  }
  metrics_ = std::make_unique<TrainingMetrics>(c, env_.rank, env_.local_rank, rank0());
  if (!metrics_->url().empty()) log->info("metrics at {}", metrics_->url());
  profiler_ = std::make_unique<RunProfiler>(c, env_.rank,
                                            "rank " + std::to_string(env_.rank) + " " + setup_.mesh.tag(env_.rank));
  runtime_ = std::make_unique<FeatureRuntime>(c, *ctx_, &metrics_->registry());
  runtime_->install(setup_.features);
  executor_ = runtime_->executor();
  if (!executor_) executor_ = make_sequential_executor();
}

void TrainingRun::setup_model() {
  const Config& c = setup_.config;
  at::manual_seed(run_.seed);
  desc_ = describe_model(c);
  // Layers are wrapped to record their outputs only when a step asks for them.
  tensor_dump::configure((train_.dump_routing_at.empty() ? 0u : unsigned{tensor_dump::kRouting}) |
                         (train_.dump_activations_at.empty() ? 0u : unsigned{tensor_dump::kActivations}));
  BuildContext bctx(c, *ctx_, runtime_->model().layers(), run_.seed);
  runtime_->model().apply_to(bctx);
  model_ = build_model(desc_, bctx, executor_->place(desc_), executor_->computes_loss());
  for (auto& b : model_.blocks) b->train();
  // Global parameter count: this partition's parameters at their full
  // shapes, summed over the partitions.
  double global = 0;
  for (const auto& p : model_.params) {
    double n = 1;
    for (auto d : p.spec.global_shape) n *= static_cast<double>(d);
    global += n;
  }
  at::Tensor g = at::full({1}, global, at::kDouble);
  ctx_->group(dist::MeshRole::kPartition).all_reduce(g);
  if (rank0()) {
    log::logger()->info("model {}: {} blocks, {:.0f} parameters", desc_.name, desc_.blocks.size(), g.item<double>());
  }
  set_param_groups(c);
  const auto& opt = runtime_->optimizer_factory();
  optimizer_ = opt ? opt(optim_, model_.params, *ctx_) : make_optimizer(optim_, model_.params);
  ReducerOptions ro;
  ro.bucket_bytes = c.get_float("distributed.bucket_size_mb") * 1024 * 1024;
  ro.overlap = c.get_bool("distributed.overlap");
  ro.rebuild_buckets = c.get_bool("distributed.rebuild_buckets");
  ro.reduce_dtype = runtime_->model().precision().reduce_dtype;
  ro.param_dtype = runtime_->model().precision().param_dtype;
  const auto& red = runtime_->grad_reducer_factory();
  reducer_ = red ? red(ro, model_.params, *ctx_) : make_bucketed_reducer(ro, model_.params, *ctx_);
  const auto& io = runtime_->checkpoint_io_factory();
  checkpoint_ = io ? io(ckpt_, c, *ctx_) : make_gathered_checkpoint_io(ckpt_, c, *ctx_);
  setup_throughput();
  // What the model's construction cost before any step (a feature that
  // shards parameters only from the first step still built them whole).
  const auto [rss, peak] = resident_memory_bytes();
  log::logger()->info("this rank: after setup, resident memory {:.1f} MiB, peak so far {:.1f} MiB",
                      rss / (1024.0 * 1024.0), peak / (1024.0 * 1024.0));
}

void TrainingRun::setup_throughput() {
  const Config& c = setup_.config;
  double peak = c.get_float("metrics.peak_flops");
  // MFU is held against the peak of the type the products run in: under
  // mixed precision the probe measures both, and the bf16 one counts.
  const at::ScalarType compute = runtime_->model().precision().param_dtype;
  const std::string what = dtype_name(compute);
  if (peak <= 0) {
    // Every rank probes at once, so ranks sharing a machine measure their share.
    dist::Group& world = ctx_->group("world");
    world.barrier();
    const auto t0 = Clock::now();
    at::Tensor mine = at::full({2}, 0.0, at::kDouble);
    mine[0] = measure_matmul_flops();
    if (compute != at::kFloat) mine[1] = measure_matmul_flops(0.15, compute);
    const double secs = seconds_since(t0);
    world.all_reduce(mine);
    mine.div_(env_.world_size);
    const double fp32 = mine[0].item<double>(), narrow = mine[1].item<double>();
    peak = compute != at::kFloat ? narrow : fp32;
    if (rank0() && compute != at::kFloat) {
      log::logger()->info(
          "peak {:.1f} GFLOP/s per rank for MFU: {} matmul probe ({} products; fp32 probe {:.1f} GFLOP/s), {:.0f} ms, "
          "{} threads per rank, mean of {} ranks (metrics.peak_flops sets the {} peak instead)",
          peak / 1e9, what, precision::to_string(precision::product_kernel()), fp32 / 1e9, secs * 1e3,
          at::get_num_threads(), env_.world_size, what);
    } else if (rank0()) {
      log::logger()->info(
          "peak {:.1f} GFLOP/s per rank for MFU: fp32 matmul probe, {:.0f} ms, {} threads per rank, mean of {} "
          "ranks (metrics.peak_flops sets it instead)",
          peak / 1e9, secs * 1e3, at::get_num_threads(), env_.world_size);
    }
  } else if (rank0()) {
    log::logger()->info("peak {:.1f} GFLOP/s per rank for MFU (metrics.peak_flops: the {} peak)", peak / 1e9, what);
  }
  throughput_ = std::make_unique<Throughput>(model_info(c).train_flops_per_token, peak, env_.world_size,
                                             &metrics_->registry());
}

StepContext TrainingRun::context(std::int64_t step, double loss, std::map<std::string, double>* figures) {
  StepContext s;
  s.step = step;
  s.loss = loss;
  s.params = &model_.params;
  s.optimizer = optimizer_.get();
  s.dist = ctx_.get();
  s.metrics = &metrics_->registry();
  s.figures = figures;
  return s;
}

void TrainingRun::set_param_groups(const Config& c) {
  GroupPolicy policy = GroupPolicy::from(c);
  // A checkpoint written before groups existed decayed every parameter:
  // its run continues so, unless this run names the rule itself.
  const std::string dir = ckpt_.resume_dir();
  if (!dir.empty() && !c.is_set("optimizer.weight_decay_on") &&
      predates_weight_decay_groups(ckpt::CheckpointReader(dir).config_text())) {
    policy.on = DecayOn::kAll;
    if (rank0()) {
      log::logger()->info(
          "checkpoint {} was written before weight-decay groups existed: resuming with weight decay on every "
          "parameter, as it was trained (set optimizer.weight_decay_on to change it)",
          dir);
    }
  }
  auto table = std::make_shared<std::map<std::string, ParamHyper>>(resolve_param_groups(policy, model_.params));
  std::map<std::string, std::pair<int, double>> groups;  // name -> tensors, values
  for (const auto& p : model_.params) {
    auto& g = groups[table->at(p.spec.name).group];
    double n = 1;
    for (auto d : p.spec.global_shape) n *= static_cast<double>(d);
    ++g.first;
    g.second += n;
  }
  if (rank0()) {
    std::string line;
    for (const auto& [name, g] : groups) {
      line += (line.empty() ? "" : ", ") + name + " " + std::to_string(g.first) + " tensors (" +
              std::to_string(static_cast<long long>(g.second)) + " values)";
    }
    log::logger()->info("optimizer groups ({}): {}{}", policy.describe(), line,
                        ctx_->group(dist::MeshRole::kPartition).size() > 1 ? " on this rank's stage" : "");
  }
  optim_.param_hypers = std::move(table);
  policy_text_ = policy.describe();
}

void TrainingRun::resume() {
  const std::string dir = ckpt_.resume_dir();
  if (dir.empty()) return;
  const auto t0 = Clock::now();
  SavedState s = checkpoint_->load(dir, model_tensors(), optimizer_->state());
  // The checkpoint's stored config against this run's (a changed model key
  // was refused before start, unless free or the load is partial).
  if (rank0()) {
    const PrecisionPolicy& policy = runtime_->model().precision();
    const std::string now = describe_precision(hp::dtype_name(policy.param_dtype),
                                               hp::dtype_name(policy.reduce_dtype));
    for (const auto& line :
         resume_config_notes(s.config_text, setup_.config, dir, describe_precision(s.param_dtype, s.reduce_dtype), now))
      log::logger()->info("{}", line);
  }
  start_ = s.step;
  optimizer_->set_steps_taken(s.optimizer_steps);
  if (!s.rng_hex.empty()) set_rng_state_hex(s.rng_hex);
  tokens_total_ = s.tokens_total;
  samples_total_ = s.samples_total;
  const double secs = seconds_since(t0);
  metrics_->on_checkpoint("load", secs);
  StepContext hc = context(start_, 0.0, nullptr);
  runtime_->run_hooks(StepEvent::kLoad, hc);
  if (rank0()) log::logger()->info("resumed from {} at step {} ({:.3f} s)", dir, start_, secs);
}

void TrainingRun::sum_globally(at::Tensor& values) {
  ctx_->group(dist::MeshRole::kReplicate).all_reduce(values);
  // Ranks along a sequence dimension hold different positions of the same
  // samples: their loss sums and token counts add up too.
  for (const auto& dim : setup_.mesh.dims_with(dist::MeshRole::kSequence)) ctx_->group(dim).all_reduce(values);
  ctx_->group(dist::MeshRole::kPartition).all_reduce(values);
}

Batch TrainingRun::local_positions(Batch batch) const {
  const auto& layout = runtime_->model().sequence_layout();
  if (!layout) return batch;
  // Every input and target laid out [samples, seq, ...] keeps the positions
  // this rank holds.
  const auto pieces = layout->pieces(train_.seq_len);
  for (auto* part : {&batch.inputs, &batch.targets}) {
    for (auto& item : *part) {
      at::Tensor& t = item.value();
      if (t.dim() >= 2 && t.size(1) == train_.seq_len) t = take_pieces(t, 1, pieces);
    }
  }
  return batch;
}

void TrainingRun::record_failure(const std::string& reason) {
  if (!watchdog_) return;
  const std::string path = watchdog_->dump(reason.substr(0, reason.find('\n')));
  if (!path.empty()) log::logger()->error("flight record written to {}", path);
}

StepResult TrainingRun::step(std::int64_t step) {
  namespace flight = dist::flight;
  const auto t0 = Clock::now();
  profile::Span span("step", "step");
  span.arg("step", step + 1);
  flight::set_step(step);
  flight::set_phase(flight::Phase::kForward);
  StepResult r;
  StepContext hc = context(step, 0.0, &r.figures);
  runtime_->run_hooks(StepEvent::kStepBegin, hc);
  optimizer_->zero_grad();
  const int replicas = setup_.mesh.replicas(), replica = setup_.mesh.replica_rank(env_.rank);
  const std::int64_t per_rank = train_.global_batch / replicas;
  const double global_tokens = static_cast<double>(train_.global_batch * train_.seq_len);
  StepWork work;
  work.micro_batches = per_rank / train_.micro_batch;
  reducer_->begin_step(static_cast<int>(work.micro_batches));
  work.loss_scale = 1.0 / global_tokens;
  // The global batch is laid out the same on every layout: replica d takes
  // samples [d * per_rank, (d + 1) * per_rank).
  work.batch = [&](std::int64_t mb) {
    return local_positions(make_batch(*data_, Split::kTrain, step, replica * per_rank + mb * train_.micro_batch,
                                      train_.micro_batch, train_.seq_len));
  };
  work.after_forward = [&] { runtime_->run_hooks(StepEvent::kAfterForward, hc); };
  work.weight_ready = [&](const at::Tensor& param) { reducer_->accumulated(param); };
  work.step = step;
  work.first_sample = [&](std::int64_t mb) { return replica * per_rank + mb * train_.micro_batch; };
  if (train_.document_attention) {
    work.documents = [&](std::int64_t mb) {
      return data_->documents(Split::kTrain, step, work.first_sample(mb), train_.micro_batch, train_.seq_len);
    };
  }
  const unsigned dumps = train_.dumps_at(step + 1);
  if (dumps) tensor_dump::begin_step(dumps);
  if (dumps & tensor_dump::kActivations) {
    // The step's data too, whole sequences of this rank's micro-batches
    // ("batch:tokens@s0", "batch:labels@s0"), so a step can be reproduced
    // outside (the tests' PyTorch reference does).
    for (std::int64_t mb = 0; mb < work.micro_batches; ++mb) {
      const std::int64_t first = work.first_sample(mb);
      DropoutSiteGuard site({step, first});
      const Batch b = make_batch(*data_, Split::kTrain, step, first, train_.micro_batch, train_.seq_len);
      for (const auto& part : {&b.inputs, &b.targets})
        for (const auto& item : *part) tensor_dump::record("batch", item.key(), item.value());
    }
  }
  StepReport report = executor_->run(model_, work);
  if (dumps) {
    // One file per rank: an activation dump holds the routing too.
    const std::string kind = (dumps & tensor_dump::kActivations) ? "activations" : "routing";
    write_tensor_dump(run_.output_dir + "/" + kind + "_step" + std::to_string(step + 1), kind, step + 1,
                      tensor_dump::end_step(), setup_.mesh, env_.rank,
                      "OpenBLAS " + openblas_kernels() + "; packed expert products " +
                          packed_gemm::describe_best_kernel());
  }
  // Reductions launched during backward are joined by the rest now, before
  // any hook or collective of the step's end.
  reducer_->backward_done();
  runtime_->run_hooks(StepEvent::kAfterBackward, hc);
  flight::set_phase(flight::Phase::kGradSync);
  profile::Span sync("comm", "grad_sync");
  reducer_->reduce();
  sync.end();
  reducer_->report(r.figures);
  if (step + 1 == train_.dump_grads_at) {
    write_grad_dump(run_.output_dir + "/grads_step" + std::to_string(step + 1), step + 1, reducer_->gradients(),
                    setup_.mesh, env_.rank);
  }
  // The main loss and every declared auxiliary loss in one collective.
  std::vector<double> sums{report.loss_sum};
  for (const auto& name : desc_.aux_losses) sums.push_back(report.aux_sums.count(name) ? report.aux_sums[name] : 0.0);
  at::Tensor l = at::tensor(sums, at::kDouble);
  sum_globally(l);
  r.loss = l[0].item<double>() / global_tokens;
  for (std::size_t i = 0; i < desc_.aux_losses.size(); ++i) {
    r.figures["aux_loss_" + desc_.aux_losses[i]] = l[static_cast<std::int64_t>(i + 1)].item<double>() / global_tokens;
  }
  for (const auto& [k, v] : report.figures) r.figures[k] = v;
  profile::Span clip("optimizer", "grad_clip");
  r.grad_norm = reducer_->clip(optim_.grad_clip);
  clip.end();
  r.lr = learning_rate(schedule_, step);
  hc.loss = r.loss;
  runtime_->run_hooks(StepEvent::kBeforeOptimizerStep, hc);
  flight::set_phase(flight::Phase::kOptimizer);
  profile::Span opt("optimizer", "optimizer_step");
  optimizer_->step(r.lr);
  opt.end();
  for (const auto& fn : model_.step_end) fn(hc);
  runtime_->run_hooks(StepEvent::kStepEnd, hc);
  flight::set_phase(flight::Phase::kIdle);
  r.seconds = seconds_since(t0);
  return r;
}

double TrainingRun::evaluate() {
  dist::flight::set_phase(dist::flight::Phase::kEval);
  profile::Span span("eval", "evaluate");
  const int replicas = setup_.mesh.replicas(), replica = setup_.mesh.replica_rank(env_.rank);
  for (auto& b : model_.blocks) b->eval();
  // The same validation samples at every layout: replica d takes samples
  // [d * per_rank, (d + 1) * per_rank) of the eval_samples.
  const std::int64_t per_rank = train_.eval_samples / replicas;
  StepWork work;
  work.micro_batches = per_rank / train_.micro_batch;
  reducer_->begin_step(static_cast<int>(work.micro_batches));
  work.backward = false;
  work.first_sample = [&](std::int64_t mb) { return replica * per_rank + mb * train_.micro_batch; };
  work.batch = [&](std::int64_t mb) {
    return local_positions(
        make_batch(*data_, Split::kValid, 0, work.first_sample(mb), train_.micro_batch, train_.seq_len));
  };
  if (train_.document_attention) {
    work.documents = [&](std::int64_t mb) {
      return data_->documents(Split::kValid, 0, work.first_sample(mb), train_.micro_batch, train_.seq_len);
    };
  }
  StepReport rep = executor_->run(model_, work);
  for (auto& b : model_.blocks) b->train();
  at::Tensor t = at::tensor({rep.loss_sum, rep.tokens}, at::kDouble);
  sum_globally(t);
  return t[0].item<double>() / t[1].item<double>();
}

void TrainingRun::save(std::int64_t step) {
  std::map<std::string, double> none;
  StepContext hc = context(step - 1, 0.0, &none);
  runtime_->run_hooks(StepEvent::kSave, hc);
  dist::flight::set_phase(dist::flight::Phase::kCheckpoint);
  profile::Span span("checkpoint", "checkpoint_save");
  span.arg("step", step);
  const double rss_before = reset_peak_resident_memory();
  const auto t0 = Clock::now();
  SavedState s{step, rng_state_hex(), optimizer_->steps_taken(), tokens_total_, samples_total_};
  const PrecisionPolicy& policy = runtime_->model().precision();
  s.param_dtype = hp::dtype_name(policy.param_dtype);
  s.reduce_dtype = hp::dtype_name(policy.reduce_dtype);
  s.optimizer_groups = policy_text_;
  checkpoint_->save(step, model_tensors(), optimizer_->state(), s);
  const double secs = seconds_since(t0);
  const double rise = std::max(0.0, peak_resident_memory_since_reset() - rss_before);
  metrics_->on_checkpoint("save", secs);
  if (rank0()) log::logger()->info("checkpoint step {} saved to {} ({:.3f} s)", step, ckpt_.root, secs);
  // Every rank: what holding its part of the save cost it (gathered copies,
  // background copies).
  log::logger()->info("checkpoint step {}: resident memory rose {:.1f} MiB during the save on this rank", step,
                      rise / (1024.0 * 1024.0));
}

void TrainingRun::cadence(std::int64_t step, const StepResult& r, FitResult& result) {
  const double global_tokens = static_cast<double>(train_.global_batch * train_.seq_len);
  tokens_total_ += global_tokens;
  samples_total_ += static_cast<double>(train_.global_batch);
  StepFigures f{step + 1, r.loss, r.lr, r.grad_norm, global_tokens / r.seconds, r.seconds, global_tokens,
                static_cast<double>(train_.global_batch)};
  metrics_->on_step(f, ctx_.get());
  throughput_->on_step(global_tokens, r.seconds);
  const double model_flops = throughput_->flops_per_second(global_tokens, r.seconds);
  metrics_->on_figures(r.figures);
  result.losses.push_back(r.loss);
  const bool last = step + 1 == train_.max_steps;
  std::map<std::string, double> extra = r.figures;
  extra["optimizer_state_bytes"] = static_cast<double>(optimizer_->state_bytes());
  extra["model_flops_per_second"] = model_flops;
  extra["mfu"] = throughput_->mfu(model_flops);
  if (train_.eval_interval > 0 && ((step + 1) % train_.eval_interval == 0 || last)) {
    StepContext hc = context(step, r.loss, &extra);
    runtime_->run_hooks(StepEvent::kEval, hc);
    result.last_eval_loss = evaluate();
    metrics_->on_eval(step + 1, result.last_eval_loss);
    extra["eval_loss"] = result.last_eval_loss;
    if (rank0()) log::logger()->info("step {} | eval loss {:.4f}", step + 1, result.last_eval_loss);
  }
  if (train_.sample_interval > 0 && ((step + 1) % train_.sample_interval == 0 || last)) sample(step + 1);
  if ((step + 1) % train_.log_interval == 0 || last || step == start_) {
    metrics_->log_step(f, extra);
    if (rank0()) {
      const double eta = r.seconds * static_cast<double>(train_.max_steps - step - 1);
      log::logger()->info(
          "step {}/{} | loss {:.4f} | lr {:.2e} | grad norm {:.3f} | {:.0f} tokens/s | {:.2f} GFLOP/s | MFU {:.1f}% | "
          "ETA {}",
          step + 1, train_.max_steps, r.loss, r.lr, r.grad_norm, f.tokens_per_second, model_flops / 1e9,
          100 * throughput_->mfu(model_flops), format_hms(eta));
    }
  }
  // Each rank's training peak, before the final save gathers anything.
  if (last) {
    training_peak_ = resident_memory_bytes().second;
    training_pool_ = memory::large_block_pool_stats();
  }
  if ((ckpt_.interval > 0 && (step + 1) % ckpt_.interval == 0) || last) save(step + 1);
}

void TrainingRun::sample(std::int64_t step) {
  profile::Span span("eval", "sample");
  GenerateOptions o;
  o.prompts = {sample_ids_};
  o.max_new_tokens = train_.sample_tokens;
  o.stop_token = sample_tokenizer_->eos_id();
  o.vocab_limit = sample_tokenizer_->vocab_size();
  const auto t0 = Clock::now();
  const GenerateResult r = generate_loaded(o);
  if (!rank0()) return;
  const std::vector<std::int32_t> ids(r.tokens[0].begin(), r.tokens[0].end());
  const std::string text = train_.sample_prompt + sample_tokenizer_->decode(ids);
  log::logger()->info("step {} | sample ({} tokens, {:.2f} s): {}", step, ids.size(),
                      std::chrono::duration<double>(Clock::now() - t0).count(), text);
  metrics_->log_text(step, "sample", text);
}

FitResult TrainingRun::fit() {
  // This rank before it builds anything: LibTorch and the plugins loaded.
  start_resident_ = resident_memory_bytes().first;
  setup_process();
  if (train_.sample_interval > 0) {
    sample_tokenizer_ = run_tokenizer(setup_.config);
    for (const auto id : sample_tokenizer_->encode(train_.sample_prompt)) sample_ids_.push_back(id);
    if (static_cast<std::int64_t>(sample_ids_.size()) >= train_.seq_len)
      throw std::invalid_argument("training.sample_prompt is " + std::to_string(sample_ids_.size()) +
                                  " tokens; model.seq_len " + std::to_string(train_.seq_len) + " holds at most " +
                                  std::to_string(train_.seq_len - 1) + ": shorten the prompt");
  }
  setup_model();
  resume();
  FitResult result;
  result.first_step = start_;
  double timed_seconds = 0, timed_tokens = 0;
  for (std::int64_t s = start_; s < train_.max_steps; ++s) {
    profiler_->begin_step(s + 1);
    StepResult r = step(s);
    cadence(s, r, result);
    profiler_->end_step();
    if (s > start_) {
      timed_seconds += r.seconds;
      timed_tokens += static_cast<double>(train_.global_batch * train_.seq_len);
    }
  }
  // A save still being written in the background commits before the run ends.
  checkpoint_->flush();
  result.last_step = train_.max_steps;
  result.tokens_per_second = timed_seconds > 0 ? timed_tokens / timed_seconds : 0;
  // Every rank says what it holds, so sharding is visible per rank.
  const auto [anon, file] = resident_anon_and_file_bytes();
  std::string pool;
  if (memory::large_block_pool_installed()) {
    char text[160];
    std::snprintf(text, sizeof text, "; large block pool after the last step: %.1f MiB at most in use, extent %.1f MiB",
                  training_pool_.peak_in_use_bytes / (1024.0 * 1024.0), training_pool_.touched_bytes / (1024.0 * 1024.0));
    pool = text;
  }
  log::logger()->info("this rank: optimizer state {} bytes, peak resident memory {:.1f} MiB (now {:.1f} MiB "
                      "anonymous, {:.1f} MiB file-backed){}",
                      optimizer_->state_bytes(), resident_memory_bytes().second / (1024.0 * 1024.0),
                      anon / (1024.0 * 1024.0), file / (1024.0 * 1024.0), pool);
  if (profiler_->enabled()) profiler_->write_rank_file();
  {
    // Every rank's training peak in one file (hp-plan --measure reads it).
    // With the large block pool, its most in use and its extent (the
    // bytes it ever handed out at once plus the gaps between them: what
    // it holds resident) at the same point.
    at::Tensor mine = at::tensor({training_peak_, start_resident_, static_cast<double>(training_pool_.peak_in_use_bytes),
                                  static_cast<double>(training_pool_.touched_bytes)},
                                 at::kDouble);
    const at::Tensor all = ctx_->group("world").all_gather(mine).view({-1, 4});
    if (rank0()) {
      std::string columns[4];
      for (std::int64_t r = 0; r < all.size(0); ++r) {
        for (int k = 0; k < 4; ++k)
          columns[k] += (r ? ", " : "") + std::to_string(static_cast<long long>(all[r][k].item<double>()));
      }
      const bool pool = memory::large_block_pool_installed();
      const std::string path = run_.output_dir + "/peaks.json";
      std::ofstream out(path + ".tmp");
      out << "{\"peak_resident_memory_bytes\": [" << columns[0] << "], \"start_resident_memory_bytes\": ["
          << columns[1] << "], ";
      if (pool) {
        out << "\"large_block_pool_peak_in_use_bytes\": [" << columns[2] << "], \"large_block_pool_extent_bytes\": ["
            << columns[3] << "], ";
      }
      out << "\"what\": \"each rank's peak resident memory after its last step (before the final save), and its "
             "resident memory when it started (LibTorch and the plugins loaded, nothing built)"
          << (pool ? "; the large block pool's most bytes in use at once and its extent (in use, freed and gaps "
                     "between: what it holds resident) at the same point"
                   : "")
          << "\"}\n";
      out.close();
      std::filesystem::rename(path + ".tmp", path);
    }
  }
  ctx_->group("world").barrier();
  if (profiler_->enabled() && rank0()) {
    std::string missing;
    const std::string path = profiler_->merge(env_.world_size, &missing);
    log::logger()->info("profile of steps {} written to {}", hp::to_string(setup_.config.value("run.profile.steps")),
                        path);
    if (!missing.empty()) log::logger()->warn("profile: no trace from {} (left out of {})", missing, path);
  }
  if (rank0() && setup_.config.get_bool("run.report")) write_run_report(run_.output_dir);
  return result;
}

/// Stands in for the loss during generation: from the rows of the logits
/// at the wanted global positions (any number per sample), the
/// log-probabilities over the whole vocabulary (a collective over a split
/// vocabulary), kept for the rows this rank holds.
class LogitsProbe : public LossBlock {
 public:
  /// `want`: per sample of this rank, from global sample `first` on, the
  /// global positions wanted; micro-batches of `micro` samples.
  LogitsProbe(std::shared_ptr<LossBlock> inner, std::vector<std::vector<std::int64_t>> want, std::int64_t first,
              std::int64_t micro, const SequenceLayout* layout)
      : inner_(std::move(inner)), want_(std::move(want)), first_(first), micro_(micro), layout_(layout) {}
  LossOutput forward(const Activations& out, const Activations& targets) override {
    (void)targets;
    const at::Tensor& z = out[inner_->logits_name()];  // [samples, local positions, local vocabulary]
    // This micro-batch's samples: from its first global sample on.
    const std::int64_t mine = current_dropout_site().first_sample - first_;
    if (rows_.empty()) rows_.assign(want_.size(), {});
    // The wanted positions and global sample numbers of every sample the
    // logits hold (an LM head may hold other ranks' samples too): this
    // micro-batch's are those of the samples the stream holds.
    const std::int64_t own = micro_;
    if (mine < 0 || mine + own > static_cast<std::int64_t>(want_.size()))
      throw std::invalid_argument("generation: a micro-batch of samples [" + std::to_string(mine + first_) + ", " +
                                  std::to_string(mine + first_ + own) + ") is not this rank's");
    std::int64_t K = 1;
    for (const auto& w : want_) K = std::max<std::int64_t>(K, static_cast<std::int64_t>(w.size()));
    at::Tensor want = at::full({own, K}, -1, at::kLong), ids = at::arange(first_ + mine, first_ + mine + own, at::kLong);
    for (std::int64_t b = 0; b < own; ++b) {
      const auto& w = want_[static_cast<std::size_t>(mine + b)];
      for (std::size_t j = 0; j < w.size(); ++j) want[b][static_cast<std::int64_t>(j)] = w[j];
    }
    want = inner_->gather_samples(want);
    ids = inner_->gather_samples(ids);
    const std::int64_t G = z.size(0), T = z.size(1);
    if (G != want.size(0))
      throw std::invalid_argument("generation: the logits hold " + std::to_string(G) + " samples, the step " +
                                  std::to_string(want.size(0)));
    const at::Tensor pos = layout_ ? piece_positions(layout_->local_pieces(T)) : at::arange(T, at::kLong);
    const auto* p = pos.data_ptr<std::int64_t>();
    std::map<std::int64_t, std::int64_t> local;  // global position -> local
    for (std::int64_t t = 0; t < T; ++t) local[p[t]] = t;
    std::vector<std::int64_t> flat;
    std::vector<std::pair<std::int64_t, std::int64_t>> slot;  // (own sample, row in flat) per wanted row
    const auto* w = want.data_ptr<std::int64_t>();
    const auto* id = ids.data_ptr<std::int64_t>();
    for (std::int64_t b = 0; b < G; ++b) {
      const std::int64_t s = id[b] - first_;  // this rank's sample, or outside [0, samples)
      const bool is_mine = s >= mine && s < mine + own;
      for (std::int64_t j = 0; j < K && w[b * K + j] >= 0; ++j) {
        const auto it = local.find(w[b * K + j]);
        if (is_mine) slot.emplace_back(s, it == local.end() ? -1 : static_cast<std::int64_t>(flat.size()));
        if (it != local.end()) flat.push_back(b * T + it->second);
      }
    }
    // Every rank of a split vocabulary takes part in the collective, even
    // with no row of its own.
    const at::Tensor rows = z.detach().reshape({G * T, z.size(2)}).index_select(0, at::tensor(flat, at::kLong));
    const at::Tensor lp = inner_->log_probs(rows);  // [rows, vocabulary]
    for (const auto& [s, r] : slot) rows_[static_cast<std::size_t>(s)].push_back(r < 0 ? at::Tensor() : lp[r]);
    return {at::zeros({}, at::kFloat), 0};
  }
  /// The log-probabilities of the j-th wanted position of sample b, or an
  /// undefined tensor when this rank does not hold it.
  at::Tensor row(std::size_t b, std::size_t j) const {
    if (b >= rows_.size() || j >= rows_[b].size()) return {};
    return rows_[b][j];
  }

 private:
  std::shared_ptr<LossBlock> inner_;
  std::vector<std::vector<std::int64_t>> want_;
  std::int64_t first_, micro_;
  const SequenceLayout* layout_;
  std::vector<std::vector<at::Tensor>> rows_;
};

/// The token `o` picks from log-probabilities `lp` ([vocabulary], fp32) of
/// prompt `g` at new token `s`: argmax, or a draw by the uniform number
/// mix(seed, g, s) (the same on every rank and layout).
std::int64_t pick_token(const at::Tensor& lp_in, const GenerateOptions& o, std::size_t g, std::int64_t s) {
  at::Tensor lp = lp_in.to(at::kDouble);
  if (o.vocab_limit > 0 && o.vocab_limit < lp.size(0)) lp = lp.narrow(0, 0, o.vocab_limit);
  const auto* v = lp.data_ptr<double>();
  const std::int64_t V = lp.size(0);
  if (o.temperature <= 0) {
    std::int64_t best = 0;
    for (std::int64_t i = 1; i < V; ++i)
      if (v[i] > v[best]) best = i;
    return best;
  }
  std::vector<std::pair<double, std::int64_t>> c;  // (probability, id), most likely first
  double m = -std::numeric_limits<double>::infinity();
  for (std::int64_t i = 0; i < V; ++i) m = std::max(m, v[i] / o.temperature);
  for (std::int64_t i = 0; i < V; ++i) c.emplace_back(std::exp(v[i] / o.temperature - m), i);
  std::sort(c.begin(), c.end(), [](const auto& a, const auto& b) { return a.first != b.first ? a.first > b.first : a.second < b.second; });
  if (o.top_k > 0 && static_cast<std::size_t>(o.top_k) < c.size()) c.resize(static_cast<std::size_t>(o.top_k));
  double total = 0;
  for (const auto& e : c) total += e.first;
  if (o.top_p < 1.0) {
    double acc = 0;
    std::size_t keep = 0;
    while (keep < c.size() && acc < o.top_p * total) acc += c[keep++].first;
    c.resize(std::max<std::size_t>(1, keep));
    total = acc;
  }
  const double u = static_cast<double>(mix(o.seed, static_cast<std::uint64_t>(g), static_cast<std::uint64_t>(s)) >> 11) /
                   9007199254740992.0 * total;
  double acc = 0;
  for (const auto& e : c) {
    acc += e.first;
    if (u < acc) return e.second;
  }
  return c.back().second;
}

void TrainingRun::load_for_generation() {
  if (ckpt_.resume_dir().empty())
    throw std::runtime_error("generate: no checkpoint (checkpoint.resume names none, or the root has no committed step)");
  setup_process();
  setup_model();
  resume();
}

void TrainingRun::check_prompts(const GenerateOptions& o) const {
  const std::int64_t T = train_.seq_len;
  if (o.prompts.empty()) throw std::invalid_argument("generate: no prompt");
  for (std::size_t g = 0; g < o.prompts.size(); ++g) {
    const auto len = static_cast<std::int64_t>(o.prompts[g].size());
    if (len == 0) throw std::invalid_argument("generate: prompt " + std::to_string(g) + " is empty");
    if (len >= T)
      throw std::invalid_argument("generate: prompt " + std::to_string(g) + " has " + std::to_string(len) +
                                  " tokens; model.seq_len " + std::to_string(T) + " leaves room for at most " +
                                  std::to_string(T - 1));
  }
}

GenerateResult TrainingRun::generate_loaded(const GenerateOptions& o) {
  const std::int64_t T = train_.seq_len;
  const std::size_t n = o.prompts.size();
  if (model_.loss && model_.loss->logits_name().empty())
    throw std::invalid_argument("generate: model '" + desc_.name + "' predicts no tokens");
  GenerationScope generating;
  std::vector<bool> was_training;
  for (auto& b : model_.blocks) {
    was_training.push_back(b->is_training());
    b->eval();
  }
  {
    std::map<std::string, double> figures;
    StepContext hc = context(start_, 0.0, &figures);
    runtime_->run_hooks(StepEvent::kEval, hc);
  }
  const int replicas = setup_.mesh.replicas(), replica = setup_.mesh.replica_rank(env_.rank);
  // Requests spread over the replicas, in micro-batches of `micro` (a
  // pipeline's stages pass them along); the last ones padded with copies
  // of the first prompt.
  const std::int64_t micro_batches = std::max<std::int64_t>(1, o.micro_batches);
  std::int64_t per_rank = (static_cast<std::int64_t>(n) + replicas - 1) / replicas;
  per_rank = (per_rank + micro_batches - 1) / micro_batches * micro_batches;
  const std::int64_t micro = per_rank / micro_batches;
  const std::int64_t total = per_rank * replicas, first = replica * per_rank;
  std::vector<std::vector<std::int64_t>> seqs(static_cast<std::size_t>(total));
  for (std::int64_t g = 0; g < total; ++g)
    seqs[static_cast<std::size_t>(g)] = o.prompts[static_cast<std::size_t>(g) < n ? static_cast<std::size_t>(g) : 0];
  std::vector<bool> active(n, true);
  GenerateResult result;
  result.step = start_;
  result.tokens.resize(n);
  result.log_probs.resize(n);
  result.top2_gaps.resize(n);
  const SequenceLayout* layout = runtime_->model().sequence_layout() ? &*runtime_->model().sequence_layout() : nullptr;
  const std::shared_ptr<LossBlock> inner = model_.loss;
  // One forward of `tokens` ([per_rank, width]) at this layout, the loss
  // replaced by a probe of the rows at `want` (global positions per sample).
  auto forward = [&](const at::Tensor& tokens, const std::vector<std::vector<std::int64_t>>& want,
                     const SequenceLayout* layout) {
    const at::Tensor labels = at::zeros_like(tokens);
    std::shared_ptr<LogitsProbe> probe;
    if (inner) model_.loss = probe = std::make_shared<LogitsProbe>(inner, want, first, micro, layout);
    StepWork work;
    work.micro_batches = micro_batches;
    work.backward = false;
    work.step = 0;
    work.first_sample = [&](std::int64_t mb) { return first + mb * micro; };
    work.batch = [&](std::int64_t mb) {
      return local_positions(Batch{make_activations({{"tokens", tokens.narrow(0, mb * micro, micro)}}),
                                   make_activations({{"labels", labels.narrow(0, mb * micro, micro)}})});
    };
    reducer_->begin_step(1);
    try {
      executor_->run(model_, work);
    } catch (...) {
      model_.loss = inner;
      throw;
    }
    model_.loss = inner;
    return probe;
  };
  // The key/value cache: a prefill of the prompts (right-padded to the
  // longest; under a sequence layout, to model.seq_len, laid over the
  // layout's ranks, which then all hold the whole cache), then one position
  // per sample per step without the layout.
  const bool use_cache = o.kv_cache;
  KvCache cache(T, first);
  std::optional<KvCacheScope> cache_scope;
  if (use_cache) cache_scope.emplace(&cache);
  std::int64_t longest = 0;
  for (const auto& q : o.prompts) longest = std::max<std::int64_t>(longest, static_cast<std::int64_t>(q.size()));
  auto bytes_sent = [&] {  // by this rank, over every group (the generator's own token exchange included)
    std::uint64_t b = 0;
    for (const auto& [name, g] : ctx_->groups())
      for (const auto& [op, st] : g->stats()) b += st.bytes;
    return b;
  };
  const auto started = std::chrono::steady_clock::now();
  std::uint64_t bytes_after_prefill = 0;
  for (std::int64_t s = 0; s < o.max_new_tokens; ++s) {
    if (std::none_of(active.begin(), active.end(), [](bool a) { return a; })) break;
    // This step's tokens: the whole context padded to model.seq_len (no
    // cache), the prompts padded to the longest (prefill), or each sample's
    // last token at its own position (decode).
    const bool decode = use_cache && s > 0;
    const std::int64_t width = decode ? 1 : !use_cache || layout ? T : longest;
    at::Tensor tokens = at::zeros({per_rank, width}, at::kLong), positions = at::zeros({per_rank, width}, at::kLong);
    std::vector<std::vector<std::int64_t>> want(static_cast<std::size_t>(per_rank));
    for (std::int64_t r = 0; r < per_rank; ++r) {
      const auto& q = seqs[static_cast<std::size_t>(first + r)];
      const auto len = static_cast<std::int64_t>(q.size());
      if (decode) {
        tokens[r][0] = q.back();
        positions[r][0] = std::min(len - 1, T - 1);
        want[static_cast<std::size_t>(r)] = {0};
      } else {
        for (std::int64_t t = 0; t < len; ++t) tokens[r][t] = q[static_cast<std::size_t>(t)];
        positions[r] = at::arange(width, at::kLong);
        want[static_cast<std::size_t>(r)] = {len - 1};
      }
    }
    if (use_cache) cache.set_positions(positions, decode);
    const std::shared_ptr<LogitsProbe> probe = forward(tokens, want, decode ? nullptr : layout);
    at::Tensor chosen = at::full({total}, -1.0, at::kDouble);
    at::Tensor chosen_lp = at::full({total}, -std::numeric_limits<double>::infinity(), at::kDouble);
    at::Tensor gap = at::full({total}, -1.0, at::kDouble);
    for (std::int64_t r = 0; probe && r < per_rank; ++r) {
      const std::size_t g = static_cast<std::size_t>(first + r);
      const at::Tensor lp = probe->row(static_cast<std::size_t>(r), 0);
      if (g >= n || !active[g] || !lp.defined()) continue;
      const std::int64_t tok = pick_token(lp, o, g, s);
      chosen[static_cast<std::int64_t>(g)] = static_cast<double>(tok);
      chosen_lp[static_cast<std::int64_t>(g)] = lp[tok].item<double>();
      const auto top2 = std::get<0>(lp.to(at::kDouble).topk(2));
      gap[static_cast<std::int64_t>(g)] = (top2[0] - top2[1]).item<double>();
    }
    ctx_->group("world").all_reduce(chosen, dist::ReduceKind::kMax);
    ctx_->group("world").all_reduce(chosen_lp, dist::ReduceKind::kMax);
    ctx_->group("world").all_reduce(gap, dist::ReduceKind::kMax);
    for (std::size_t g = 0; g < n; ++g) {
      if (!active[g]) continue;
      const auto tok = static_cast<std::int64_t>(chosen[static_cast<std::int64_t>(g)].item<double>());
      if (tok < 0) throw std::runtime_error("generate: no rank computed the logits of prompt " + std::to_string(g));
      seqs[g].push_back(tok);
      result.tokens[g].push_back(tok);
      result.log_probs[g].push_back(chosen_lp[static_cast<std::int64_t>(g)].item<double>());
      result.top2_gaps[g].push_back(gap[static_cast<std::int64_t>(g)].item<double>());
      if (rank0() && o.on_token) o.on_token(g, tok);
      if (tok == o.stop_token || static_cast<std::int64_t>(seqs[g].size()) >= T) active[g] = false;
    }
    const double at = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    if (s == 0) {
      result.prefill_seconds = at;
      bytes_after_prefill = bytes_sent();
    } else {
      ++result.decode_steps;
    }
    result.decode_seconds = at - result.prefill_seconds;
    result.decode_bytes = bytes_sent() - bytes_after_prefill;
  }
  if (use_cache) {
    result.kv_bytes = cache.bytes();
    result.kv_bytes_per_token = cache.bytes_per_token();
    const KvCache::Shape sh = cache.shape();
    result.kv_layers = sh.layers;
    result.kv_heads = sh.kv_heads;
    result.kv_head_dim = sh.head_dim;
    result.kv_element_bytes = sh.element_bytes;
  }
  cache_scope.reset();
  for (const auto& p : model_.params) {
    if (!p.spec.sharded()) continue;
    ++result.split_params;
    std::int64_t whole = 1;
    for (const auto d : p.spec.global_shape) whole *= d;
    if (p.tensor.numel() == whole) ++result.split_params_held_whole;
  }
  {
    at::Tensor held = at::tensor({static_cast<double>(result.split_params_held_whole)}, at::kDouble);
    ctx_->group("world").all_reduce(held, dist::ReduceKind::kMax);
    result.split_params_held_whole = static_cast<std::int64_t>(held.item<double>());
  }
  if (o.teacher_forcing) {
    // The trainer's forward over each whole sequence (prompt and generated
    // tokens, padded to model.seq_len, no cache): the log-probability of
    // every generated token given all before it, summed per prompt.
    at::Tensor tokens = at::zeros({per_rank, T}, at::kLong);
    std::vector<std::vector<std::int64_t>> want(static_cast<std::size_t>(per_rank));
    for (std::int64_t r = 0; r < per_rank; ++r) {
      const std::size_t g = static_cast<std::size_t>(first + r);
      const auto& q = seqs[g];
      for (std::size_t t = 0; t < q.size(); ++t) tokens[r][static_cast<std::int64_t>(t)] = q[t];
      const std::size_t made = g < n ? result.tokens[g].size() : 0;
      for (std::size_t j = 0; j < made; ++j) want[static_cast<std::size_t>(r)].push_back(static_cast<std::int64_t>(q.size() - made + j) - 1);
    }
    const std::shared_ptr<LogitsProbe> probe = forward(tokens, want, layout);
    const std::int64_t most = o.max_new_tokens;
    at::Tensor lp_at = at::full({total, std::max<std::int64_t>(most, 1)}, -std::numeric_limits<double>::infinity(), at::kDouble);
    for (std::int64_t r = 0; probe && r < per_rank; ++r) {
      const std::size_t g = static_cast<std::size_t>(first + r);
      if (g >= n) continue;
      for (std::size_t j = 0; j < result.tokens[g].size(); ++j) {
        const at::Tensor lp = probe->row(static_cast<std::size_t>(r), j);
        if (lp.defined()) lp_at[static_cast<std::int64_t>(g)][static_cast<std::int64_t>(j)] = lp[result.tokens[g][j]].item<double>();
      }
    }
    ctx_->group("world").all_reduce(lp_at, dist::ReduceKind::kMax);
    result.teacher_forced.assign(n, 0.0);
    for (std::size_t g = 0; g < n; ++g) {
      for (std::size_t j = 0; j < result.tokens[g].size(); ++j)
        result.teacher_forced[g] += lp_at[static_cast<std::int64_t>(g)][static_cast<std::int64_t>(j)].item<double>();
    }
  }
  for (std::size_t i = 0; i < model_.blocks.size(); ++i) {
    if (was_training[i]) model_.blocks[i]->train();
  }
  ctx_->group("world").barrier();
  return result;
}

EvalResult TrainingRun::evaluate_checkpoint() {
  if (ckpt_.resume_dir().empty())
    throw std::runtime_error("evaluate: no checkpoint to evaluate (checkpoint.resume names none, or the root has "
                             "no committed step)");
  setup_process();
  setup_model();
  resume();
  std::map<std::string, double> figures;
  StepContext hc = context(start_, 0.0, &figures);
  runtime_->run_hooks(StepEvent::kEval, hc);
  EvalResult r;
  r.step = start_;
  r.loss = evaluate();
  r.samples = train_.eval_samples;
  r.seq = train_.seq_len;
  ctx_->group("world").barrier();
  return r;
}

}  // namespace

GenerateResult Trainer::generate(const GenerateOptions& options) { return Generator(raw_).generate(options); }

struct Generator::Impl {
  explicit Impl(const RawConfig& raw) : run(raw), config(raw) {}
  TrainingRun run;
  RawConfig config;
  bool loaded = false;
  std::unique_ptr<Tokenizer> tokenizer;
};

Generator::Generator(RawConfig raw) : impl_(std::make_unique<Impl>(raw)) {}
Generator::~Generator() = default;
Generator::Generator(Generator&&) noexcept = default;
Generator& Generator::operator=(Generator&&) noexcept = default;

Generator Generator::from_checkpoint(const std::string& path, const std::vector<std::string>& overrides) {
  const std::string step = checkpoint_step_dir(path);
  const std::string yaml = ckpt::CheckpointReader(step).config_text();
  if (yaml.empty())
    throw std::invalid_argument(step + " stores no config (an imported checkpoint): build a Generator from a "
                                "config whose checkpoint.resume names it");
  char tmpl[] = "/tmp/hp-generator.XXXXXX";
  if (!::mkdtemp(tmpl)) throw std::runtime_error("cannot create a temporary directory for the generator's files");
  RawConfig raw = RawConfig::parse_string(yaml, step + "/config.yaml");
  for (const auto& o : checkpoint_run_overrides(step, tmpl)) raw.apply_override(o);
  for (const auto& o : overrides) raw.apply_override(o);
  return Generator(std::move(raw));
}

GenerateResult Generator::generate(const GenerateOptions& options) {
  try {
    impl_->run.check_prompts(options);
    if (!impl_->loaded) {
      impl_->run.load_for_generation();
      impl_->loaded = true;
    }
    return impl_->run.generate_loaded(options);
  } catch (const std::exception& e) {
    impl_->run.record_failure(std::string("exception: ") + e.what());
    throw;
  }
}

const Tokenizer& Generator::tokenizer() {
  if (!impl_->tokenizer) impl_->tokenizer = run_tokenizer(prepare(impl_->config, dist::read_dist_env().world_size).config);
  return *impl_->tokenizer;
}

std::vector<std::string> Generator::generate_text(const std::vector<std::string>& prompts, GenerateOptions options) {
  const Tokenizer& tok = tokenizer();
  options.prompts.clear();
  for (const auto& p : prompts) {
    std::vector<std::int64_t> ids;
    for (const auto id : tok.encode(p)) ids.push_back(id);
    options.prompts.push_back(std::move(ids));
  }
  options.stop_token = tok.eos_id();
  options.vocab_limit = tok.vocab_size();
  const GenerateResult r = generate(options);
  std::vector<std::string> out;
  for (const auto& ids : r.tokens) out.push_back(tok.decode(std::vector<std::int32_t>(ids.begin(), ids.end())));
  return out;
}

EvalResult Trainer::evaluate() {
  TrainingRun run(raw_);
  try {
    return run.evaluate_checkpoint();
  } catch (const std::exception& e) {
    run.record_failure(std::string("exception: ") + e.what());
    throw;
  }
}

FitResult Trainer::fit() {
  TrainingRun run(raw_);
  try {
    return run.fit();
  } catch (const std::exception& e) {
    run.record_failure(std::string("exception: ") + e.what());
    throw;
  }
}

}  // namespace hp
