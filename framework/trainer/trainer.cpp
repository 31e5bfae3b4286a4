#include "framework/trainer/trainer.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <thread>

#include "backends/dist/context.h"
#include "checkpoint/safetensors.h"
#include "framework/data/dataset.h"
#include "framework/logging/logging.h"
#include "framework/model/extensions.h"
#include "framework/optim/grad_sync.h"
#include "framework/optim/optimizer.h"
#include "framework/plugin/feature_runtime.h"
#include "framework/runtime/setup.h"
#include "framework/trainer/checkpoint_adapter.h"
#include "framework/trainer/executor.h"
#include "framework/trainer/training_metrics.h"
#include "framework/util/blas_check.h"

namespace hp {

Trainer::Trainer(RawConfig raw) : raw_(std::move(raw)) {}

Trainer Trainer::from_file(const std::string& path, const std::vector<std::string>& overrides) {
  RawConfig raw = RawConfig::parse_file(path);
  for (const auto& o : overrides) raw.apply_override(o);
  return Trainer(std::move(raw));
}

Trainer Trainer::from_yaml(const std::string& yaml) {
  return Trainer(RawConfig::parse_string(yaml, "<yaml>"));
}

Trainer& Trainer::set(const std::string& key, const std::string& yaml_value) {
  raw_.set(key, yaml_value);
  return *this;
}

Trainer& Trainer::enable(const std::string& feature,
                         const std::map<std::string, std::string>& options) {
  raw_.set("features." + feature + ".enabled", "true");
  for (const auto& [k, v] : options) raw_.set("features." + feature + "." + k, v);
  return *this;
}

FitResult Trainer::fit() {
  return fit(ModelProvider(describe_model), nullptr);
}

namespace {

std::string format_eta(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) seconds = 0;
  auto s = static_cast<long long>(seconds);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%02lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
  return buf;
}

/// Everything one fit owns, destroyed in reverse: the model (which may hold
/// plugin code) goes before the runtime that keeps the plugins loaded.
struct Run {
  Setup setup;
  dist::DistEnv env;
  std::shared_ptr<dist::DistributedContext> ctx;
  std::unique_ptr<FeatureRuntime> runtime;
  std::shared_ptr<StepExecutor> executor;  // may hold plugin code: after runtime
  std::unique_ptr<TrainingMetrics> metrics;
  std::shared_ptr<Dataset> data;
  BuiltModel model;
  std::unique_ptr<Optimizer> optimizer;
  std::unique_ptr<GradSync> sync;

  ~Run() {
    sync.reset();
    optimizer.reset();
    model = BuiltModel();
    executor.reset();
  }
};

/// Sums `values` over data parallel and then over the pipeline (where only
/// the last stage holds a loss), so every rank gets the global figure.
void sum_over_dp_and_pp(Run& r, at::Tensor& values) {
  r.ctx->group("dp").all_reduce(values);
  if (r.setup.mesh.pp_size() > 1) r.ctx->group("pp").all_reduce(values);
}

double eval_loss(Run& r, std::int64_t micro_batches) {
  const auto& c = r.setup.config;
  const auto M = c.get_int("training.micro_batch_size");
  const auto seq = c.get_int("model.seq_len");
  const int dp_rank = r.ctx->coord().dp, dp = r.setup.mesh.dp_size();
  for (auto& b : r.model.blocks) b->eval();
  StepWork work;
  work.micro_batches = micro_batches;
  work.backward = false;
  work.batch = [&](std::int64_t mb) {
    return make_batch(*r.data, Split::kValid, 0, (mb * dp + dp_rank) * M, M, seq);
  };
  StepReport rep = r.executor->run(r.model, work);
  for (auto& b : r.model.blocks) b->train();
  at::Tensor t = at::tensor({rep.loss_sum, rep.tokens}, at::kDouble);
  sum_over_dp_and_pp(r, t);
  return t[0].item<double>() / t[1].item<double>();
}

/// Full gradients by global name, after data-parallel sync and before
/// clipping, one file per writing rank (see CheckpointAdapter).
void dump_gradients(Run& r, std::int64_t step) {
  const std::string dir = r.setup.config.get_string("run.output_dir") + "/grads_step" + std::to_string(step);
  std::vector<std::pair<std::string, at::Tensor>> full;
  for (const auto& p : r.model.params) {
    full.emplace_back(p.spec.name, gather_full(r.ctx.get(), p.spec, p.tensor.grad()).contiguous());
  }
  const auto c = r.ctx->coord();
  if (c.dp == 0 && c.tp == 0) {
    std::filesystem::create_directories(dir);
    char name[64];
    std::snprintf(name, sizeof name, "/grads-rank%05d.safetensors", r.env.rank);
    ckpt::write_safetensors(dir + name, full);
  }
}

}  // namespace

FitResult Trainer::fit(const ModelProvider& provider, std::shared_ptr<Dataset> data) {
  Run r;
  r.env = dist::read_dist_env();
  r.setup = prepare(raw_, r.env.world_size);  // throws ConfigException, before any group
  const Config& c = r.setup.config;
  log::init(r.env.rank, r.setup.mesh.tag(r.env.rank), c.get_string("logging.level"),
            c.get_string("logging.file"));
  auto log = log::logger();
  // A launcher gives each rank its share of the cores; alone, take them all
  // (LibTorch's default counts physical cores only, often half of them).
  const int threads = r.env.threads > 0 ? r.env.threads
                                        : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  at::set_num_threads(threads);
  set_blas_threads(threads);
  if (r.env.rank == 0) warn_if_reference_blas(*log);

  // Data first: a missing or empty corpus is refused before anything starts.
  r.data = data ? data : make_dataset(c);

  dist::ContextOptions opts;
  const std::string& backend = c.get_string("distributed.backend");
  // NCCL is not wired yet (no CUDA LibTorch to build it against): auto means gloo.
  opts.backend = backend == "auto" ? "gloo" : backend;
  opts.init_method = c.get_string("distributed.init_method");
  opts.init_file = c.get_string("distributed.init_file");
  opts.gloo_hostname = c.get_string("distributed.gloo_hostname");
  opts.timeout = std::chrono::milliseconds(
      static_cast<long long>(c.get_float("distributed.timeout_seconds") * 1000));
  r.ctx = dist::DistributedContext::create(r.env, r.setup.mesh, opts);
  const bool rank0 = r.env.rank == 0;
  if (rank0) {
    std::filesystem::create_directories(c.get_string("run.output_dir"));
    std::ofstream(c.get_string("run.output_dir") + "/config.yaml") << c.to_yaml();
    log->info("{}", r.data->describe());
    log->info("mesh {} over {} ranks ({} backend, {} threads per rank)", r.setup.mesh.shape(),
              r.env.world_size, opts.backend, at::get_num_threads());
  }

  r.runtime = std::make_unique<FeatureRuntime>(c, r.ctx.get());
  r.runtime->install(r.setup.features);
  r.executor = r.runtime->executor();
  if (!r.executor) r.executor = make_sequential_executor();
  r.metrics = std::make_unique<TrainingMetrics>(c, r.env.rank, r.env.local_rank, rank0);
  if (!r.metrics->url().empty()) log->info("metrics at {}", r.metrics->url());

  const auto seed = static_cast<std::uint64_t>(c.get_int("run.seed"));
  at::manual_seed(seed);
  ModelDescription desc = provider(c);
  BuildContext bctx(c, r.ctx.get(), r.runtime->model().layers(), seed);
  r.runtime->model().apply_to(bctx);
  r.model = build_model(desc, bctx, r.executor->place(desc), r.executor->computes_loss());
  for (auto& b : r.model.blocks) b->train();
  {
    // Global parameter count: this stage's parameters at their full shapes,
    // summed over the pipeline stages.
    double global = 0;
    for (const auto& p : r.model.params) {
      double n = 1;
      for (auto d : p.spec.global_shape) n *= static_cast<double>(d);
      global += n;
    }
    at::Tensor g = at::full({1}, global, at::kDouble);
    if (r.setup.mesh.pp_size() > 1) r.ctx->group("pp").all_reduce(g);
    if (rank0) {
      log->info("model {}: {} blocks, {:.0f} parameters", desc.name, desc.blocks.size(), g.item<double>());
    }
  }
  r.optimizer = std::make_unique<Optimizer>(OptimizerOptions::from(c), r.model.params);
  r.sync = std::make_unique<GradSync>(r.ctx.get(), r.model.params,
                                      c.get_float("distributed.bucket_size_mb") * 1024 * 1024);

  CheckpointAdapter ckpt(c, r.ctx.get());
  std::int64_t start = 0;
  double tokens_total = 0, samples_total = 0;
  if (std::string dir = ckpt.resume_dir(); !dir.empty()) {
    const auto t0 = std::chrono::steady_clock::now();
    SavedState s = ckpt.load(dir, r.model.params, r.optimizer->state());
    start = s.step;
    r.optimizer->set_steps_taken(s.optimizer_steps);
    set_rng_state_hex(s.rng_hex);
    tokens_total = s.tokens_total;
    samples_total = s.samples_total;
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    r.metrics->on_checkpoint("load", secs);
    r.runtime->run_hooks(StepEvent::kLoad, StepInfo{start, 0.0});
    if (rank0) log->info("resumed from {} at step {} ({:.2f} s)", dir, start, secs);
  }

  const auto max_steps = c.get_int("training.max_steps");
  const auto G = c.get_int("training.global_batch_size");
  const auto M = c.get_int("training.micro_batch_size");
  const auto seq = c.get_int("model.seq_len");
  const int dp = r.setup.mesh.dp_size(), dp_rank = r.ctx->coord().dp;
  const std::int64_t per_rank = G / dp, micro_batches = per_rank / M;
  const double global_tokens = static_cast<double>(G * seq);
  const auto log_every = c.get_int("training.log_interval");
  const auto eval_every = c.get_int("training.eval_interval");
  const auto ckpt_every = c.get_int("checkpoint.interval");
  const auto dump_grads_at = c.get_int("training.dump_grads_at_step");

  FitResult result;
  result.first_step = start;
  double timed_seconds = 0, timed_tokens = 0;
  const auto fit_start = std::chrono::steady_clock::now();
  for (std::int64_t step = start; step < max_steps; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    StepInfo info{step, 0.0};
    r.runtime->run_hooks(StepEvent::kStepBegin, info);
    r.optimizer->zero_grad();
    StepWork work;
    work.micro_batches = micro_batches;
    work.loss_scale = 1.0 / global_tokens;
    // The global batch is laid out the same on every layout: rank d takes
    // samples [d * per_rank, (d + 1) * per_rank).
    work.batch = [&](std::int64_t mb) {
      return make_batch(*r.data, Split::kTrain, step, dp_rank * per_rank + mb * M, M, seq);
    };
    work.after_forward = [&] { r.runtime->run_hooks(StepEvent::kAfterForward, info); };
    StepReport report = r.executor->run(r.model, work);
    r.runtime->run_hooks(StepEvent::kAfterBackward, info);
    r.sync->all_reduce();
    if (step + 1 == dump_grads_at) dump_gradients(r, step + 1);
    at::Tensor l = at::full({1}, report.loss_sum, at::kDouble);
    sum_over_dp_and_pp(r, l);
    const double loss = l.item<double>() / global_tokens;
    const double grad_norm = r.sync->clip(c.get_float("optimizer.grad_clip"));
    const double lr = learning_rate(c, step);
    info.loss = loss;
    r.runtime->run_hooks(StepEvent::kBeforeOptimizerStep, info);
    r.optimizer->step(lr);
    r.runtime->run_hooks(StepEvent::kStepEnd, info);

    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    tokens_total += global_tokens;
    samples_total += static_cast<double>(G);
    StepFigures f{step + 1, loss, lr, grad_norm, global_tokens / secs, secs, global_tokens,
                  static_cast<double>(G)};
    r.metrics->on_step(f, r.ctx.get());
    r.metrics->on_figures(report.figures);
    result.losses.push_back(loss);
    if (step > start) {
      timed_seconds += secs;
      timed_tokens += global_tokens;
    }
    const bool last = step + 1 == max_steps;
    std::map<std::string, double> extra(report.figures.begin(), report.figures.end());
    if (eval_every > 0 && ((step + 1) % eval_every == 0 || last)) {
      r.runtime->run_hooks(StepEvent::kEval, info);
      result.last_eval_loss = eval_loss(r, c.get_int("training.eval_steps"));
      r.metrics->on_eval(step + 1, result.last_eval_loss);
      extra["eval_loss"] = result.last_eval_loss;
      if (rank0) log->info("step {} | eval loss {:.4f}", step + 1, result.last_eval_loss);
    }
    if ((step + 1) % log_every == 0 || last || step == start) {
      r.metrics->log_step(f, extra);
      if (rank0) {
        const double elapsed =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - fit_start).count();
        const double eta = elapsed / static_cast<double>(step + 1 - start) *
                           static_cast<double>(max_steps - step - 1);
        log->info("step {}/{} | loss {:.4f} | lr {:.2e} | grad norm {:.3f} | {:.0f} tokens/s | ETA {}",
                  step + 1, max_steps, loss, lr, grad_norm, f.tokens_per_second, format_eta(eta));
      }
    }
    if ((ckpt_every > 0 && (step + 1) % ckpt_every == 0) || last) {
      r.runtime->run_hooks(StepEvent::kSave, info);
      SavedState s{step + 1, rng_state_hex(), r.optimizer->steps_taken(), tokens_total,
                   samples_total};
      const double secs_saved = ckpt.save(step + 1, r.model.params, r.optimizer->state(), s);
      r.metrics->on_checkpoint("save", secs_saved);
      if (rank0) log->info("checkpoint step {} saved to {} ({:.2f} s)", step + 1, ckpt.root(), secs_saved);
    }
  }
  result.last_step = max_steps;
  result.tokens_per_second = timed_seconds > 0 ? timed_tokens / timed_seconds : 0;
  r.ctx->group("world").barrier();
  return result;
}

}  // namespace hp
