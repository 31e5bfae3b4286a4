// Framework overhead, MFU and recompute cost, side by side in one run:
//   1. the matmul peak of this machine (same threads as the training runs),
//   2. hp::Trainer on a GPT,
//   3. a bare LibTorch loop training the same GPT (same sizes, data, AdamW,
//      same kernels), and the same loop through torch::nn::Linear's forward,
//   4. hp::Trainer with recompute (full and selective).
// Prints tokens/s, MFU against the measured peak, and peak memory growth.
// Figures are printed, never asserted.
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>

#include "hp/comm/env.h"
#include "hp/data/dataset.h"
#include "framework/trainer/trainer.h"
#include "hp/trainer/training_metrics.h"
#include "framework/util/blas_check.h"

namespace {

struct Size {
  std::int64_t layers = 4, hidden = 256, heads = 4, seq = 128, vocab = 256, batch = 16, micro = 8;
  int steps = 30;
};

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// Resets the kernel's peak-RSS mark to the current RSS; returns current RSS.
double reset_peak() {
  std::ofstream("/proc/self/clear_refs") << "5";
  return hp::resident_memory_bytes().first;
}
double peak_growth_mb(double base) { return (hp::resident_memory_bytes().second - base) / 1048576.0; }

double matmul_peak_gflops() {
  auto a = torch::randn({1024, 1024}), b = torch::randn({1024, 1024});
  for (int i = 0; i < 3; ++i) torch::mm(a, b);
  const int reps = 20;
  double t0 = now();
  for (int i = 0; i < reps; ++i) torch::mm(a, b);
  return 2.0 * 1024 * 1024 * 1024 * reps / (now() - t0) / 1e9;
}

/// Training FLOPs per token: 6 x parameters in matmuls + attention scores.
double flops_per_token(const Size& s) {
  const double H = s.hidden, L = s.layers;
  const double matmul_params = L * 12 * H * H + s.vocab * H;
  return 6 * matmul_params + 6 * L * s.seq * H;  // causal: half of 2 x 2 x T x H, x3 for backward
}

std::string yaml(const Size& s) {
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "run: {output_dir: /tmp/hp_bench_run, seed: 1}\n"
                "model: {type: gpt, layers: %lld, hidden: %lld, heads: %lld, seq_len: %lld, vocab_size: %lld}\n"
                "data: {type: text}\n"
                "training: {max_steps: %d, global_batch_size: %lld, micro_batch_size: %lld, log_interval: 1000}\n"
                "optimizer: {type: adamw, lr: 0.001, schedule: constant, grad_clip: 1.0}\n"
                "checkpoint: {interval: 0, resume: never}\n"
                "metrics: {jsonl: false}\n",
                (long long)s.layers, (long long)s.hidden, (long long)s.heads, (long long)s.seq,
                (long long)s.vocab, s.steps, (long long)s.batch, (long long)s.micro);
  return buf;
}

// ---- the bare LibTorch twin ------------------------------------------------
/// `module_forward`: call torch::nn::Linear's own forward, which for 3-D
/// input is a matmul plus a separate bias add; otherwise at::linear (one
/// addmm), the kernel the framework's layers use.
struct BareBlockImpl : torch::nn::Module {
  BareBlockImpl(std::int64_t H, std::int64_t heads, bool module_forward)
      : heads(heads), module_forward(module_forward) {
    ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({H})));
    ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({H})));
    qkv = register_module("qkv", torch::nn::Linear(H, 3 * H));
    proj = register_module("proj", torch::nn::Linear(H, H));
    fc1 = register_module("fc1", torch::nn::Linear(H, 4 * H));
    fc2 = register_module("fc2", torch::nn::Linear(4 * H, H));
  }
  torch::Tensor lin(torch::nn::Linear& l, const torch::Tensor& x) {
    return module_forward ? l(x) : torch::linear(x, l->weight, l->bias);
  }
  torch::Tensor forward(torch::Tensor h) {
    auto B = h.size(0), T = h.size(1), H = h.size(2), d = H / heads;
    auto parts = lin(qkv, ln1(h)).view({B, T, heads, 3, d}).unbind(3);
    auto q = parts[0].transpose(1, 2), k = parts[1].transpose(1, 2), v = parts[2].transpose(1, 2);
    auto sc = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(double(d));
    sc = sc.masked_fill(torch::ones({T, T}, torch::kBool).triu(1), -INFINITY);
    auto ctx = torch::matmul(torch::softmax(sc, -1), v).transpose(1, 2).reshape({B, T, H});
    h = h + lin(proj, ctx);
    return h + lin(fc2, torch::gelu(lin(fc1, ln2(h))));
  }
  std::int64_t heads;
  bool module_forward;
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  torch::nn::Linear qkv{nullptr}, proj{nullptr}, fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(BareBlock);

double bare_loop(const Size& s, const hp::Dataset& data, bool module_forward) {
  torch::manual_seed(1);
  torch::nn::Embedding tok(s.vocab, s.hidden);
  auto pos = torch::randn({s.seq, s.hidden}) * 0.02;
  pos.requires_grad_(true);
  torch::nn::ModuleList blocks;
  for (int i = 0; i < s.layers; ++i) blocks->push_back(BareBlock(s.hidden, s.heads, module_forward));
  torch::nn::LayerNorm ln(torch::nn::LayerNormOptions({s.hidden}));
  torch::nn::Linear head(torch::nn::LinearOptions(s.hidden, s.vocab).bias(false));
  std::vector<torch::Tensor> params{pos};
  for (auto* m : std::initializer_list<torch::nn::Module*>{tok.get(), blocks.get(), ln.get(), head.get()}) {
    for (auto& p : m->parameters()) params.push_back(p);
  }
  {
    // The same initial distribution as the framework's models (normal 0.02
    // for matrices and embeddings; LayerNorm ones/zeros; biases zero), so
    // both loops do arithmetic on the same kind of numbers.
    torch::NoGradGuard no_grad;
    for (auto& p : params) {
      if (p.dim() >= 2) p.normal_(0.0, 0.02);
    }
    for (auto* m : std::initializer_list<torch::nn::Module*>{blocks.get(), head.get()}) {
      for (auto& kv : m->named_parameters()) {
        if (kv.key().find("bias") != std::string::npos) kv.value().zero_();
      }
    }
  }
  torch::optim::AdamW opt(params, torch::optim::AdamWOptions(1e-3).weight_decay(0));
  const double tokens = double(s.batch * s.seq);
  double t_start = 0;
  for (int step = 0; step < s.steps; ++step) {
    if (step == 1) t_start = now();  // the first step warms up allocators
    opt.zero_grad();
    for (std::int64_t mb = 0; mb < s.batch / s.micro; ++mb) {
      auto b = hp::make_batch(data, hp::Split::kTrain, step, mb * s.micro, s.micro, s.seq);
      auto h = tok(b.inputs["tokens"]) + pos;
      for (auto& blk : *blocks) h = blk->as<BareBlockImpl>()->forward(h);
      auto logits = module_forward ? head(ln(h)) : torch::linear(ln(h), head->weight);
      auto loss = torch::nll_loss(torch::log_softmax(logits.view({-1, s.vocab}), -1), b.targets["labels"].view({-1}),
                                  {}, at::Reduction::Sum) / tokens;
      loss.backward();
    }
    torch::nn::utils::clip_grad_norm_(params, 1.0);
    opt.step();
  }
  return tokens * (s.steps - 1) / (now() - t_start);
}

double trainer_run(const Size& s, const std::string& recompute) {
  hp::Trainer t = hp::Trainer::from_yaml(yaml(s));
  if (!recompute.empty()) t.enable("recompute", {{"granularity", recompute}});
  return t.fit().tokens_per_second;
}

}  // namespace

int main(int argc, char** argv) {
  // Same rule as the trainer: HP_INTRA_OP_THREADS, else OMP_NUM_THREADS, else
  // the cores divided by the local ranks.
  const int threads =
      hp::dist::choose_intra_op_threads(hp::dist::read_dist_env(), hp::dist::usable_cores())
          .threads;
  torch::set_num_threads(threads);
  hp::set_blas_threads(threads);
  Size s;
  if (argc > 1) s.hidden = std::stoll(argv[1]);
  if (argc > 2) s.steps = std::stoi(argv[2]);
  std::printf("hp-bench-train: GPT %lld layers x %lld wide, seq %lld, batch %lld (micro %lld), %d steps, "
              "%d intra-op threads\n", (long long)s.layers, (long long)s.hidden, (long long)s.seq,
              (long long)s.batch, (long long)s.micro, s.steps, torch::get_num_threads());
  const double peak = matmul_peak_gflops();
  const double fpt = flops_per_token(s);
  std::printf("matmul peak (1024^3 fp32, measured now): %.1f GFLOP/s\n\n", peak);
  auto data = hp::make_text_dataset("/usr/share/games/fortunes", s.seq, 0.05, 1);
  Size warmup = s;
  warmup.steps = 3;

  struct Row { std::string name; double tps, mem; };
  // Each configuration runs twice, interleaved, after a warm-up run; the
  // better run counts (the first run in a process pays for page faults that
  // later ones do not).
  trainer_run(warmup, "");
  std::vector<Row> rows = {{"bare LibTorch loop", 0, 0},
                           {"bare loop, torch::nn::Linear forward", 0, 0},
                           {"hp::Trainer", 0, 0},
                           {"hp::Trainer + recompute full", 0, 0},
                           {"hp::Trainer + recompute selective", 0, 0}};
  for (int round = 0; round < 2; ++round) {
    for (auto& row : rows) {
      const double base = reset_peak();
      double tps = 0;
      if (row.name == "bare LibTorch loop") tps = bare_loop(s, *data, false);
      else if (row.name == "bare loop, torch::nn::Linear forward") tps = bare_loop(s, *data, true);
      else if (row.name == "hp::Trainer") tps = trainer_run(s, "");
      else if (row.name == "hp::Trainer + recompute full") tps = trainer_run(s, "full");
      else tps = trainer_run(s, "selective");
      row.tps = std::max(row.tps, tps);
      row.mem = round == 0 ? peak_growth_mb(base) : std::min(row.mem, peak_growth_mb(base));
    }
  }

  std::printf("%-36s %12s %8s %16s %14s\n", "run", "tokens/s", "MFU", "vs bare loop", "peak mem +MB");
  for (const auto& r : rows) {
    std::printf("%-36s %12.0f %7.1f%% %+15.1f%% %14.1f\n", r.name.c_str(), r.tps,
                100.0 * r.tps * fpt / (peak * 1e9), 100.0 * (r.tps / rows[0].tps - 1.0), r.mem);
  }
  std::printf("\nframework overhead (tokens/s lost vs the bare loop): %.1f%%\n",
              100.0 * (1.0 - rows[2].tps / rows[0].tps));
  std::printf("(torch::nn::Linear's forward on 3-D input is matmul + separate bias add: %+.1f%% "
              "tokens/s against at::linear)\n", 100.0 * (rows[1].tps / rows[0].tps - 1.0));
  std::printf("recompute full: %.1f%% slower, peak memory %+.1f MB; selective: %.1f%% slower, %+.1f MB\n",
              100.0 * (1.0 - rows[3].tps / rows[2].tps), rows[3].mem - rows[2].mem,
              100.0 * (1.0 - rows[4].tps / rows[2].tps), rows[4].mem - rows[2].mem);
  return 0;
}
