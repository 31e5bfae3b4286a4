#include "framework/plan/plan.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>
#include <nlohmann/json.hpp>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <functional>
#include <fstream>
#include <iomanip>
#include <sstream>
#include <thread>
#include <tuple>

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "framework/model/registry.h"
#include "framework/plan/emulated_slicer.h"
#include "hp/comm/context.h"
#include "hp/comm/group.h"
#include "hp/comm/mesh.h"
#include "hp/data/dataset.h"
#include "hp/memory/allocator.h"
#include "hp/memory/large_pool.h"
#include "hp/memory/block_cache.h"
#include "hp/model/aux_loss.h"
#include "hp/model/block_attention.h"
#include "hp/model/extensions.h"
#include "hp/model/layers.h"
#include "hp/model/model.h"
#include "hp/model/model_info.h"
#include "hp/model/moe.h"
#include "hp/model/precision.h"
#include "hp/profile/trace.h"
#include "hp/optim/buckets.h"
#include "hp/optim/grad_sync.h"
#include "hp/optim/optimizer.h"
#include "hp/plugin/feature_runtime.h"
#include "hp/trainer/executor.h"
#include "hp/trainer/training_metrics.h"
#include "framework/trainer/throughput.h"

namespace hp::plan {

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

constexpr double kMiB = 1024.0 * 1024.0;

double numel(const std::vector<std::int64_t>& shape) {
  double n = 1;
  for (auto d : shape) n *= static_cast<double>(d);
  return n;
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown cpu";
}

int machine_cores() { return std::max(1u, std::thread::hardware_concurrency()); }

/// The median of `v` (the mean of the middle two when their number is
/// even), 0 for none.
double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return (v[(v.size() - 1) / 2] + v[v.size() / 2]) / 2;
}

/// What the layers keep beside their parameters between steps (the packed
/// expert products' copies), fp32.
double kept_copies_bytes(const std::vector<ParamEntry>& params) {
  double n = 0;
  for (const auto& p : params) n += p.kept_copies * static_cast<double>(p.tensor.numel()) * 4;
  return n;
}

/// Column i's median over `samples` (each a row of per-block figures), for
/// i < n; 0 for a column no row reaches.
std::vector<double> column_medians(const std::vector<std::vector<double>>& samples, std::size_t n) {
  std::vector<double> out(n, 0.0);
  for (std::size_t i = 0; i < n; ++i) {
    std::vector<double> v;
    for (const auto& sample : samples)
      if (i < sample.size()) v.push_back(sample[i]);
    out[i] = median(v);
  }
  return out;
}

/// One rank's model built on the meta device in a planning context.
struct RankBuild {
  std::shared_ptr<dist::DistributedContext> ctx;
  std::unique_ptr<FeatureRuntime> runtime;
  std::shared_ptr<StepExecutor> executor;
  ModelDescription desc;
  BuiltModel model;
  std::vector<bool> recomputed;  ///< per built block: its forward is replayed in backward
  ModelStateBytes state;
};

RankBuild build_rank(const Setup& setup, int rank) {
  const Config& c = setup.config;
  RankBuild b;
  b.ctx = dist::DistributedContext::planning(setup.mesh, rank);
  b.runtime = std::make_unique<FeatureRuntime>(c, *b.ctx, nullptr);
  b.runtime->install(setup.features);
  b.executor = b.runtime->executor();
  if (!b.executor) b.executor = make_sequential_executor();
  b.desc = describe_model(c);
  BuildContext bctx(c, *b.ctx, b.runtime->model().layers(), 0);
  bctx.set_meta(true);
  b.runtime->model().apply_to(bctx);
  b.model = build_model(b.desc, bctx, b.executor->place(b.desc), b.executor->computes_loss());
  for (int index : b.model.indices) {
    bctx.set_current_block(index, b.desc.blocks[static_cast<std::size_t>(index)].name);
    b.recomputed.push_back(bctx.wrapper("block") != nullptr);
  }
  bctx.set_current_block(-1);
  const OptimizerOptions opt = OptimizerOptions::from(c);
  const auto& factory = b.runtime->optimizer_factory();
  auto optimizer = factory ? factory(opt, b.model.params, *b.ctx) : make_optimizer(opt, b.model.params);
  // The reducer as the trainer makes it (its options reach a sharding
  // optimizer's buckets).
  ReducerOptions ro;
  ro.bucket_bytes = c.get_float("distributed.bucket_size_mb") * 1024 * 1024;
  ro.overlap = c.get_bool("distributed.overlap");
  ro.rebuild_buckets = c.get_bool("distributed.rebuild_buckets");
  ro.reduce_dtype = b.runtime->model().precision().reduce_dtype;
  ro.param_dtype = b.runtime->model().precision().param_dtype;
  const auto& red = b.runtime->grad_reducer_factory();
  auto reducer = red ? red(ro, b.model.params, *b.ctx) : make_bucketed_reducer(ro, b.model.params, *b.ctx);
  b.state = optimizer->model_state(b.model.params);
  return b;
}

/// A view that refactors a base split dimension together with replicate
/// ones, its split dimensions larger than the base split they cover: its
/// members gather the samples of their replicate neighbours and split the
/// weights over more ranks than the stream (a module above the stream's
/// tensor-parallel degree). Its covered base split and the samples gathered.
struct Gathering {
  const dist::MeshView* view = nullptr;
  int covered = 1;  ///< the base split ranks the view covers (the stream's degree)
  int samples = 1;  ///< the micro-batches each member computes on (its split over covered)
};
Gathering gathering_of(const std::string& dim, const dist::ProcessMesh& mesh) {
  for (const auto& v : mesh.views()) {
    bool in = false;
    for (const auto& d : v.dims) in = in || d.name == dim;
    if (!in) continue;
    Gathering g;
    bool covers_split = false;
    for (const auto& o : v.over)
      for (const auto& d : mesh.dims())
        if (d.name == o && d.role == dist::MeshRole::kSplit) {
          covers_split = true;
          g.covered *= std::max(1, d.size);
        }
    int split = 1;
    for (const auto& d : v.dims)
      if (d.role == dist::MeshRole::kSplit) split *= std::max(1, d.size);
    if (!covers_split || split <= g.covered) return {};
    g.view = &v;
    g.samples = split / g.covered;
    return g;
  }
  return {};
}

/// The gathering views a block's parameters are split over.
std::vector<Gathering> gatherings(const std::vector<const ParamEntry*>& params, const dist::ProcessMesh& mesh) {
  std::vector<Gathering> out;
  for (const ParamEntry* p : params)
    for (const auto& pl : p->spec.placements) {
      const Gathering g = gathering_of(pl.dim, mesh);
      if (!g.view) continue;
      bool seen = false;
      for (const auto& o : out) seen = seen || o.view == g.view;
      if (!seen) out.push_back(g);
    }
  return out;
}

/// The share of a block's parameter values a rank holds over the base
/// mesh's split dimensions (tensor parallel): its share of the block's
/// work. Splits over other dimensions (experts over ep) leave each rank the
/// same work (its experts take more tokens); a gathering view's members the
/// stream's share (1 / covered).
double split_share(const std::vector<const ParamEntry*>& params, const dist::ProcessMesh& mesh) {
  double global = 0, mine = 0;
  for (const ParamEntry* p : params) {
    const double n = numel(p->spec.global_shape);
    double share = 1;
    // A gathering view's members each take 1 / covered of its work (1 /
    // split of the weights over `samples` micro-batches), once per view.
    std::vector<const dist::MeshView*> views;
    for (const auto& pl : p->spec.placements) {
      if (!pl.placement.shards()) continue;
      const Gathering g = gathering_of(pl.dim, mesh);
      if (g.view) {
        if (std::find(views.begin(), views.end(), g.view) == views.end()) {
          views.push_back(g.view);
          share /= g.covered;
        }
        continue;
      }
      bool base_split = false;
      for (const auto& d : mesh.dims()) {
        if (d.name == pl.dim && d.role == dist::MeshRole::kSplit && d.size > 1) base_split = true;
      }
      if (base_split) share /= mesh.group_size(pl.dim);
    }
    global += n;
    mine += n * share;
  }
  return global > 0 ? mine / global : 1.0;
}

/// The share of a block's parameter values a rank holds, over every
/// dimension its parameters are split along (experts over an expert group
/// too): what a layer redoes once a step over its weights scales with it.
double held_share(const std::vector<const ParamEntry*>& params) {
  double global = 0, mine = 0;
  for (const ParamEntry* p : params) {
    global += numel(p->spec.global_shape);
    mine += static_cast<double>(p->tensor.numel());
  }
  return global > 0 ? mine / global : 1.0;
}

/// The product of the sizes of the base dimensions with `role`.
int role_size(const dist::ProcessMesh& mesh, dist::MeshRole role) {
  int n = 1;
  for (const auto& d : mesh.dims()) {
    if (d.role == role) n *= std::max(1, d.size);
  }
  return n;
}

/// The largest split group a rank's block is cut over (tensor parallel), 1 when none.
int split_group(const std::vector<const ParamEntry*>& params, const dist::ProcessMesh& mesh) {
  int out = 1;
  for (const ParamEntry* p : params) {
    for (const auto& pl : p->spec.placements) {
      for (const auto& d : mesh.dims()) {
        if (d.name == pl.dim && d.role == dist::MeshRole::kSplit) out = std::max(out, d.size);
      }
      // A gathering view's members sum over the stream's split too.
      const Gathering g = gathering_of(pl.dim, mesh);
      if (g.view) out = std::max(out, g.covered);
    }
  }
  return out;
}

/// The group a block's experts are split over (a shard over a dimension
/// of another factoring of the ranks, not a base one), 1 when none.
int expert_group(const std::vector<const ParamEntry*>& params, const dist::ProcessMesh& mesh) {
  int out = 1;
  for (const ParamEntry* p : params) {
    for (const auto& pl : p->spec.placements) {
      if (!pl.placement.shards()) continue;
      bool base = false;
      for (const auto& d : mesh.dims())
        if (d.name == pl.dim) base = true;
      if (!base && !gathering_of(pl.dim, mesh).view) out = std::max(out, mesh.group_size(pl.dim));
    }
  }
  return out;
}

std::string cache_dir() {
  if (const char* p = std::getenv("HP_PLAN_CACHE")) return p;
  if (const char* x = std::getenv("XDG_CACHE_HOME")) return std::string(x) + "/hyperparallel/plan";
  if (const char* h = std::getenv("HOME")) return std::string(h) + "/.cache/hyperparallel/plan";
  return "/tmp/hyperparallel-plan";
}

}  // namespace

double current_resident_bytes() { return resident_memory_bytes().first; }

bool gathers_samples(const dist::MeshView& view, const dist::ProcessMesh& mesh) {
  return !view.dims.empty() && gathering_of(view.dims.front().name, mesh).view != nullptr;
}

std::vector<int> planned_ranks(const dist::ProcessMesh& mesh) {
  std::vector<int> out;
  const int world = mesh.world_size();
  for (int r = 0; r < world; ++r) {
    bool first = true;
    if (world > dist::ProcessMesh::kRankLines) {
      // Large worlds: the first member of each data and sequence group
      // stands for the others (the same blocks at the same shapes). The
      // rank's base coordinates from its tag ("<dim><index>" each).
      std::istringstream tag(mesh.tag(r));
      for (std::string item; tag >> item;) {
        for (const auto& d : mesh.dims()) {
          if (d.role != dist::MeshRole::kReplicate && d.role != dist::MeshRole::kSequence) continue;
          if (item.size() > d.name.size() && item.compare(0, d.name.size(), d.name) == 0 &&
              std::isdigit(static_cast<unsigned char>(item[d.name.size()])) && std::stoi(item.substr(d.name.size())) != 0)
            first = false;
        }
      }
    }
    if (first) out.push_back(r);
  }
  return out;
}

/// The precision the setup's features set on a rank's model (mixed
/// precision's policy and the product kernel it picks), as the key names it.
std::string precision_of(const Setup& setup) {
  auto ctx = dist::DistributedContext::planning(setup.mesh, 0);
  FeatureRuntime rt(setup.config, *ctx, nullptr);
  rt.install(setup.features);
  const PrecisionPolicy& p = rt.model().precision();
  std::string out = "precision " + dtype_name(p.param_dtype) + ", sums " + dtype_name(p.reduce_dtype);
  if (p.mixed()) out += std::string(", products ") + precision::to_string(precision::product_kernel());
  return out;
}

std::string calibration_key(const Setup& setup) {
  const Config& c = setup.config;
  std::ostringstream k;
  // The model's own options, the micro-batch it runs, the data's shape and this machine.
  const std::string yaml = c.to_yaml();
  std::istringstream in(yaml);
  std::string line;
  bool in_model = false;
  while (std::getline(in, line)) {
    if (!line.empty() && line[0] != ' ') in_model = line.rfind("model:", 0) == 0;
    if (in_model) k << line << "\n";
  }
  k << "micro_batch_size " << c.get_int("training.micro_batch_size") << "\n";
  k << precision_of(setup) << "\n";
  k << "cpu " << cpu_model() << " x" << machine_cores() << "\n";
  // What the calibration measures; a new version measures afresh.
  k << "calibration 16 (a bf16 sum against an fp32 one; blocks built under the features one rank installs; a micro-batch of half the positions timed; buckets cut by the reducers' rule; the slowest of the processes timed together; the attention core and attention by blocks timed apart; released gradients reduced by buckets as ZeRO 2-3 do, two in flight; gradients released after each update; all-reduce speed at 64 MiB; four steps warm up; the step's end timed; the layers' kept copies apart; peaks at half the micro-batch; experts timed, routing loads; timed processes start together and stay busy until all are done; a ring step between products; peaks over 4 steps of 4 micro-batches of other samples; "
       "times the median of 5 steps in each of two processes, the second of two micro-batches; two per core over "
       "3 steps, the mean micro-batch, the mean over the processes)\n";
  const bool keep = c.get_bool("run.keep_freed_memory");
  k << "allocator " << memory::allocator_name() << (keep ? " keeping freed memory" : "")
    << (keep && c.get_bool("run.large_block_pool") ? ", large blocks from one best-fit pool" : "") << "\n";
  return k.str();
}

std::string calibration_path(const Setup& setup) {
  const std::string key = calibration_key(setup);
  std::ostringstream name;
  name << std::hex << std::setw(16) << std::setfill('0') << XXH64(key.data(), key.size(), 0);
  return cache_dir() + "/" + name.str() + ".json";
}

std::string Calibration::to_json() const {
  nlohmann::json j;
  j["key"] = key;
  j["baseline_bytes"] = baseline_bytes;
  j["collective_latency_s"] = collective_latency_s;
  j["collective_bytes_per_s"] = collective_bytes_per_s;
  j["collective_large_bytes_per_s"] = collective_large_bytes_per_s;
  j["collective_in_step_s"] = collective_in_step_s;
  j["p2p_latency_s"] = p2p_latency_s;
  j["p2p_bytes_per_s"] = p2p_bytes_per_s;
  j["shared_core_collective_s"] = shared_core_collective_s;
  j["ring_step_s"] = ring_step_s;
  j["collective_bf16_sum_factor"] = collective_bf16_sum_factor;
  j["ring_step_bytes"] = ring_step_bytes;
  j["attention_core_seconds_per_token_1"] = attention_core_seconds_per_token_1;
  j["attention_core_seconds_per_token_all"] = attention_core_seconds_per_token_all;
  j["attention_block_seconds_1"] = attention_block_seconds_1;
  j["attention_block_seconds_all"] = attention_block_seconds_all;
  j["gemm_flops_per_s_1"] = gemm_flops_per_s_1;
  j["gemm_flops_per_s_all"] = gemm_flops_per_s_all;
  j["cores"] = cores;
  j["act_bytes_per_token"] = act_bytes_per_token;
  j["seconds_per_token_1"] = seconds_per_token_1;
  j["seconds_per_token_half_positions_1"] = seconds_per_token_half_positions_1;
  j["seconds_per_token_all"] = seconds_per_token_all;
  j["backward_extra_per_token"] = backward_extra_per_token;
  j["grad_pass_seconds_per_byte_1"] = grad_pass_seconds_per_byte_1;
  j["grad_pass_seconds_per_byte_all"] = grad_pass_seconds_per_byte_all;
  j["update_seconds_per_byte_1"] = update_seconds_per_byte_1;
  j["update_seconds_per_byte_all"] = update_seconds_per_byte_all;
  j["expert_seconds_per_token_1"] = expert_seconds_per_token_1;
  j["expert_seconds_per_token_all"] = expert_seconds_per_token_all;
  j["expert_group_imbalance"] = expert_group_imbalance;
  j["first_micro_batch_extra_1"] = first_micro_batch_extra_1;
  j["first_micro_batch_extra_all"] = first_micro_batch_extra_all;
  j["two_per_core_factor"] = two_per_core_factor;
  j["process_extra_bytes"] = process_extra_bytes;
  j["grads_made_whole_factor"] = grads_made_whole_factor;
  j["in_step_points"] = in_step_points;
  j["seconds"] = seconds;
  return j.dump(1);
}

Calibration Calibration::from_json(const std::string& text) {
  const auto j = nlohmann::json::parse(text);
  Calibration c;
  c.key = j.at("key").get<std::string>();
  c.baseline_bytes = j.at("baseline_bytes").get<double>();
  c.collective_latency_s = j.at("collective_latency_s").get<double>();
  c.collective_bytes_per_s = j.at("collective_bytes_per_s").get<double>();
  c.collective_large_bytes_per_s = j.at("collective_large_bytes_per_s").get<double>();
  c.collective_in_step_s = j.at("collective_in_step_s").get<double>();
  c.p2p_latency_s = j.at("p2p_latency_s").get<double>();
  c.p2p_bytes_per_s = j.at("p2p_bytes_per_s").get<double>();
  c.shared_core_collective_s = j.at("shared_core_collective_s").get<double>();
  c.ring_step_s = j.at("ring_step_s").get<double>();
  c.collective_bf16_sum_factor = j.at("collective_bf16_sum_factor").get<double>();
  c.ring_step_bytes = j.at("ring_step_bytes").get<double>();
  c.attention_core_seconds_per_token_1 = j.at("attention_core_seconds_per_token_1").get<double>();
  c.attention_core_seconds_per_token_all = j.at("attention_core_seconds_per_token_all").get<double>();
  c.attention_block_seconds_1 = j.at("attention_block_seconds_1").get<std::vector<std::vector<double>>>();
  c.attention_block_seconds_all = j.at("attention_block_seconds_all").get<std::vector<std::vector<double>>>();
  c.gemm_flops_per_s_1 = j.at("gemm_flops_per_s_1").get<double>();
  c.gemm_flops_per_s_all = j.at("gemm_flops_per_s_all").get<double>();
  c.cores = j.at("cores").get<int>();
  c.act_bytes_per_token = j.at("act_bytes_per_token").get<std::vector<double>>();
  c.seconds_per_token_1 = j.at("seconds_per_token_1").get<std::vector<double>>();
  c.seconds_per_token_half_positions_1 = j.at("seconds_per_token_half_positions_1").get<std::vector<double>>();
  c.seconds_per_token_all = j.at("seconds_per_token_all").get<std::vector<double>>();
  c.backward_extra_per_token = j.at("backward_extra_per_token").get<double>();
  c.grad_pass_seconds_per_byte_1 = j.at("grad_pass_seconds_per_byte_1").get<double>();
  c.grad_pass_seconds_per_byte_all = j.at("grad_pass_seconds_per_byte_all").get<double>();
  c.update_seconds_per_byte_1 = j.at("update_seconds_per_byte_1").get<double>();
  c.update_seconds_per_byte_all = j.at("update_seconds_per_byte_all").get<double>();
  c.expert_seconds_per_token_1 = j.at("expert_seconds_per_token_1").get<std::vector<double>>();
  c.expert_seconds_per_token_all = j.at("expert_seconds_per_token_all").get<std::vector<double>>();
  c.expert_group_imbalance = j.at("expert_group_imbalance").get<std::vector<std::vector<double>>>();
  c.first_micro_batch_extra_1 = j.at("first_micro_batch_extra_1").get<std::vector<double>>();
  c.first_micro_batch_extra_all = j.at("first_micro_batch_extra_all").get<std::vector<double>>();
  c.two_per_core_factor = j.at("two_per_core_factor").get<double>();
  c.process_extra_bytes = j.at("process_extra_bytes").get<double>();
  c.grads_made_whole_factor = j.at("grads_made_whole_factor").get<double>();
  c.in_step_points = j.at("in_step_points").get<std::vector<std::vector<double>>>();
  c.seconds = j.at("seconds").get<double>();
  return c;
}

bool load_calibration(const Setup& setup, Calibration& out) {
  std::ifstream in(calibration_path(setup));
  if (!in) return false;
  std::stringstream s;
  s << in.rdbuf();
  try {
    out = Calibration::from_json(s.str());
  } catch (const std::exception&) {
    return false;  // an unreadable cache is measured again
  }
  return out.key == calibration_key(setup);
}

namespace {

/// Runs `fn` in a forked child (a fresh heap and peak, as a rank starts:
/// LibTorch and the plugins loaded, nothing built) and returns what it
/// wrote. The parent must not have run a parallel region yet (hp-plan
/// calibrates first).
std::vector<std::string> in_children_all(int n, const std::function<std::string(int)>& fn) {
  std::vector<pid_t> pids;
  std::vector<int> reads;
  for (int rank = 0; rank < n; ++rank) {
    int fds[2];
    if (pipe(fds) != 0) throw std::runtime_error("hp-plan calibration: pipe failed");
    const pid_t pid = fork();
    if (pid < 0) throw std::runtime_error("hp-plan calibration: fork failed");
    if (pid == 0) {
      close(fds[0]);
      std::string out;
      int code = 0;
      try {
        out = fn(rank);
      } catch (const std::exception& e) {
        out = std::string("error: ") + e.what();
        code = 1;
      }
      std::size_t at = 0;
      while (at < out.size()) {
        const ssize_t k = write(fds[1], out.data() + at, out.size() - at);
        if (k <= 0) break;
        at += static_cast<std::size_t>(k);
      }
      close(fds[1]);
      _exit(code);
    }
    close(fds[1]);
    pids.push_back(pid);
    reads.push_back(fds[0]);
  }
  std::vector<std::string> outs(static_cast<std::size_t>(n));
  for (int rank = 0; rank < n; ++rank) {
    char buf[4096];
    for (ssize_t k; (k = read(reads[rank], buf, sizeof buf)) > 0;) outs[rank].append(buf, static_cast<std::size_t>(k));
    close(reads[rank]);
  }
  std::string failed;
  for (int rank = 0; rank < n; ++rank) {
    int status = 0;
    waitpid(pids[rank], &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
      failed = outs[rank].empty() ? "a measuring process died" : outs[rank];
  }
  if (!failed.empty()) throw std::runtime_error("hp-plan calibration failed: " + failed);
  return outs;
}

std::string in_children(int n, const std::function<std::string(int)>& fn) { return in_children_all(n, fn).at(0); }

std::string in_child(const std::function<std::string()>& fn) {
  return in_children(1, [&](int) { return fn(); });
}

/// Two processes of one replicate group (shared memory, as ranks on this
/// machine run): an all-reduce's seconds at a small and a large size, the
/// least of five each.
/// Member `rank` of a group of `n` processes meeting at the FileStore
/// `file` (one replicate dimension), one thread each.
std::shared_ptr<dist::DistributedContext> join_group(int rank, int n, const std::string& file) {
  at::set_num_threads(1);
  dist::DistEnv env;
  env.rank = rank;
  env.world_size = n;
  env.source = "hp-plan calibration";
  dist::ProcessMesh mesh({dist::MeshDim{dist::ProcessMesh::data_dim(), n, dist::MeshRole::kReplicate, ""}});
  return dist::DistributedContext::create(
      env, mesh, dist::ContextOptions().with_file(file).with_timeout(std::chrono::seconds(60)));
}

/// Between computations, as a step issues them: an all-reduce of 256 KiB
/// after a product each time, against the products alone; the seconds it
/// adds per all-reduce.
double between_products(dist::Group& g, int iters) {
  at::Tensor a = at::rand({256, 256}), b = at::rand({256, 1024}), t = at::ones({std::int64_t{1} << 16});
  g.all_reduce(t);
  double alone = 0, with = 0;
  for (int pass = 0; pass < 2; ++pass) {
    g.barrier();
    const auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) {
      at::mm(a, b);
      if (pass == 1) g.all_reduce(t);
    }
    g.barrier();
    (pass == 0 ? alone : with) = since(t0);
  }
  return (with - alone) / iters;
}

/// A ring step as context parallelism runs one: the exchange with the next
/// and the previous member posted, a product computed meanwhile, both
/// waited for. What it adds per step beyond the products alone (the
/// median of three passes), for a message of `bytes`.
double ring_between_products(dist::Group& g, std::int64_t bytes, int iters) {
  at::Tensor a = at::rand({256, 256}), b = at::rand({256, 1024});
  at::Tensor out = at::ones({bytes / 4}), in = at::empty_like(out);
  const int n = g.size(), r = g.rank();
  std::vector<double> extra;
  for (int rep = 0; rep < 3; ++rep) {
    double alone = 0, with = 0;
    for (int pass = 0; pass < 2; ++pass) {
      g.barrier();
      const auto t0 = Clock::now();
      for (int i = 0; i < iters; ++i) {
        std::unique_ptr<dist::Work> send, recv;
        if (pass == 1) {
          send = g.isend(out, (r + 1) % n, 7);
          recv = g.irecv(in, (r - 1 + n) % n, 7);
        }
        at::mm(a, b);
        if (pass == 1) {
          recv->wait();
          send->wait();
        }
      }
      g.barrier();
      (pass == 0 ? alone : with) = since(t0);
    }
    extra.push_back((with - alone) / iters);
  }
  return median(extra);
}

std::string store_file(const char* what) {
  const std::string file =
      (std::filesystem::temp_directory_path() / (std::string(what) + std::to_string(::getpid()))).string();
  std::filesystem::remove(file);
  return file;
}

struct CollectiveSpeed {
  double latency_s = 0, bytes_per_s = 0, large_bytes_per_s = 0, in_step_extra_s = 0, p2p_latency_s = 0, p2p_bytes_per_s = 0;
  double ring_step_s = 0;
  double bf16_sum_factor = 1;
};

constexpr std::int64_t kRingMessageBytes = std::int64_t{1} << 19;

/// Floats of the all-reduces timed besides a small one: 4 MiB (in the
/// caches) and 64 MiB (gradient buckets' sizes, out of them).
constexpr std::int64_t kMediumCollective = std::int64_t{1} << 20, kLargeCollective = std::int64_t{1} << 24;
constexpr double kCachedCollectiveBytes = 4.0 * static_cast<double>(kMediumCollective);

CollectiveSpeed collective_speed() {
  const std::string file = store_file("hp_plan_store_");
  const std::string out = in_children(2, [&](int rank) {
    auto ctx = join_group(rank, 2, file);
    dist::Group& g = ctx->group("world");
    std::ostringstream o;
    // And as gradient buckets are (tens of MiB, out of the caches): the
    // pair sums 4 MiB at ~35 GB/s, the bytes beyond it at a few GB/s.
    for (std::int64_t n : {std::int64_t{256}, kMediumCollective, kLargeCollective}) {
      at::Tensor t = at::ones({n});
      g.all_reduce(t);
      double best = 1e30;
      for (int i = 0; i < (n > (1 << 20) ? 3 : 5); ++i) {
        g.barrier();
        const auto t0 = Clock::now();
        g.all_reduce(t);
        best = std::min(best, since(t0));
      }
      o << best << " ";
    }
    // A message between the two (send and receive, as stage messages and
    // the context-parallel ring go): half a round trip at each size.
    for (std::int64_t n : {std::int64_t{256}, std::int64_t{1} << 20}) {
      at::Tensor t = at::ones({n});
      double best = 1e30;
      for (int i = 0; i < 6; ++i) {
        g.barrier();
        const auto t0 = Clock::now();
        if (rank == 0) {
          g.send(t, 1);
          g.recv(t, 1);
        } else {
          g.recv(t, 0);
          g.send(t, 0);
        }
        if (i > 0) best = std::min(best, since(t0) / 2);
      }
      o << best << " ";
    }
    // What the same all-reduce costs issued between products (waiting for
    // the peer, the hand-over to the communication thread).
    o << between_products(g, 40) << " ";
    o << ring_between_products(g, kRingMessageBytes, 40) << " ";
    // A bf16 sum against an fp32 one of as many elements (a tensor-parallel
    // block's output, 128 Ki elements): Gloo has no bf16 sum, so ours
    // exchanges the parts' bf16 bytes and sums them in fp32 on each member.
    for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      at::Tensor t = at::ones({std::int64_t{1} << 17}, at::TensorOptions().dtype(dtype));
      g.all_reduce(t);
      double best = 1e30;
      for (int i = 0; i < 5; ++i) {
        g.barrier();
        const auto t0 = Clock::now();
        g.all_reduce(t);
        best = std::min(best, since(t0));
      }
      o << best << " ";
    }
    g.barrier();
    return o.str();
  });
  std::filesystem::remove(file);
  std::istringstream in(out);
  CollectiveSpeed c;
  double small = 0, large = 0, larger = 0, p2p_small = 0, p2p_large = 0, in_step = 0, ring = 0, f32 = 0, bf16 = 0;
  in >> small >> large >> larger >> p2p_small >> p2p_large >> in_step >> ring >> f32 >> bf16;
  c.bf16_sum_factor = f32 > 0 && bf16 > 0 ? bf16 / f32 : 1.0;
  c.ring_step_s = std::max(0.0, ring);
  c.p2p_latency_s = p2p_small;
  c.p2p_bytes_per_s = (4.0 * (1 << 20) - 4.0 * 256) / std::max(1e-9, p2p_large - p2p_small);
  c.latency_s = small;
  c.bytes_per_s = (4.0 * static_cast<double>(kMediumCollective) - 4.0 * 256) / std::max(1e-9, large - small);
  c.large_bytes_per_s = 4.0 * static_cast<double>(kLargeCollective - kMediumCollective) / std::max(1e-9, larger - large);
  // What one all-reduce of 256 KiB costs between products beyond its own
  // time on an idle pair.
  c.in_step_extra_s = std::max(0.0, in_step - (small + 4.0 * (1 << 16) / c.bytes_per_s));
  return c;
}

/// `n` one-thread processes in one group (more than the cores: ranks
/// sharing them): what an all-reduce of 256 KiB issued between products
/// costs beyond the products alone, each process's products taking their
/// share of the cores in both passes.
double shared_core_in_step(int n) {
  const std::string file = store_file("hp_plan_store_n_");
  const std::string out = in_children(n, [&](int rank) {
    auto ctx = join_group(rank, n, file);
    return std::to_string(between_products(ctx->group("world"), 30));
  });
  std::filesystem::remove(file);
  return std::max(0.0, std::stod(out));
}

/// The model's attention as one process runs it: heads, head width,
/// sequence, and its core (model.attention resolved: eager, or by blocks of
/// model.attention_block). No heads: the model has no attention.
struct AttentionShape {
  std::int64_t heads = 0, head_dim = 0, seq = 0, block = 0;
  bool eager = true;
};

AttentionShape attention_shape(const Config& c) {
  AttentionShape a;
  const ModelInfo info = model_info(c);
  const SplitSize* h = info.size("heads");
  const SplitSize* hidden = info.size("hidden");
  if (!info.uses("attention.heads") || !h || !hidden || h->value <= 0 || !c.has("model.attention")) return a;
  a.heads = h->value;
  a.head_dim = hidden->value / h->value;
  a.seq = c.get_int("model.seq_len");
  a.eager = resolve_attention(c.get_string("model.attention"), a.seq, c.get_int("model.attention_auto_seq")) == "eager";
  a.block = c.get_int("model.attention_block");
  return a;
}

/// The block lengths attention by blocks is timed at: a quarter of the
/// sequence (one chunk of context parallel over 2) and its halvings down
/// to 8, at most five; a length between two is interpolated.
std::vector<std::int64_t> attention_block_lengths(std::int64_t seq) {
  std::vector<std::int64_t> out;
  for (std::int64_t b = seq / 4; b >= 8 && out.size() < 5; b /= 2) out.push_back(b);
  if (out.empty() && seq >= 2) out.push_back(std::max<std::int64_t>(1, seq / 4));
  std::reverse(out.begin(), out.end());
  return out;
}

/// A table of {block length, seconds per block} (lengths ascending) at
/// `length`: linear between two measured lengths; below the first, the
/// first's (a small block costs its operations' overhead); beyond the last,
/// the last's by the square of the lengths (its products). 0 when empty.
double seconds_at_length(const std::vector<std::vector<double>>& table, std::int64_t length) {
  if (table.empty()) return 0;
  const double x = static_cast<double>(length);
  if (x <= table.front().at(0)) return table.front().at(1);
  if (x >= table.back().at(0)) return table.back().at(1) * (x / table.back().at(0)) * (x / table.back().at(0));
  for (std::size_t i = 1; i < table.size(); ++i) {
    const auto& lo = table[i - 1];
    const auto& hi = table[i];
    if (x <= hi.at(0)) return lo.at(1) + (hi.at(1) - lo.at(1)) * (x - lo.at(0)) / (hi.at(0) - lo.at(0));
  }
  return table.back().at(1);
}

/// Forward and backward seconds of attention over q, k, v of `shape`
/// ([batch, seq, heads, head_dim], random) by `attend`.
double time_attention(at::IntArrayRef shape, const std::function<at::Tensor(const at::Tensor&, const at::Tensor&,
                                                                           const at::Tensor&)>& attend) {
  c10::AutoGradMode grad(true);
  auto q = at::randn(shape).requires_grad_(), k = at::randn(shape).requires_grad_(),
       v = at::randn(shape).requires_grad_();
  const auto t0 = Clock::now();
  at::Tensor out = attend(q, k, v);
  out.backward(at::ones_like(out));
  return since(t0);
}

/// The attention's two figures at one step: the model's own core over one
/// micro-batch (seconds per token), then for each of attention_block_lengths
/// the seconds per block of one head, from block attention over four
/// blocks' length (ten blocks a head; heads enough for the threads, the
/// work bounded at about 2^22 scores whatever the length).
std::vector<double> attention_figures(const AttentionShape& a, std::int64_t mbs, int threads) {
  std::vector<double> out;
  const double tokens = static_cast<double>(mbs * a.seq);
  out.push_back(time_attention({mbs, a.seq, a.heads, a.head_dim}, [&](const at::Tensor& q, const at::Tensor& k,
                                                                      const at::Tensor& v) {
                  return a.eager ? causal_attention(q, k, v) : block_causal_attention(q, k, v, a.block);
                }) / tokens);
  for (std::int64_t b : attention_block_lengths(a.seq)) {
    const std::int64_t rows = std::max<std::int64_t>(
        threads, std::min<std::int64_t>(mbs * a.heads, (std::int64_t{1} << 22) / (10 * b * b)));
    const double s = time_attention({1, 4 * b, rows, a.head_dim}, [&](const at::Tensor& q, const at::Tensor& k,
                                                                      const at::Tensor& v) {
      return block_causal_attention(q, k, v, b);
    });
    out.push_back(s / static_cast<double>(10 * rows));
  }
  return out;
}

/// One process of the model at micro-batch `mbs` with `threads` threads:
/// the trainer's own start-up probe, then `steps` training steps (forward,
/// backward, AdamW update). Returns the peak resident memory above the
/// start, the bytes each block's forward keeps (block cache), and the
/// seconds of each block (forward, with backward shared as the forwards).
/// With `finished`, the process goes on with untimed steps after its
/// timed ones until finished() returns true (processes timed together keep
/// their cores busy until the last is done).
nlohmann::json one_process(const Setup& setup, std::int64_t mbs, int threads, bool count_blocks, int micro = 1,
                           int steps = 4, const std::function<void()>& before_timed = {},
                           const std::function<bool()>& finished = {}, bool release_grads = false,
                           bool time_half_positions = false) {
  const Config& c = setup.config;
  at::set_num_threads(threads);
  // The heap as a rank keeps it (run.keep_freed_memory).
  if (c.get_bool("run.keep_freed_memory")) {
    memory::keep_freed_memory();
    if (c.get_bool("run.large_block_pool")) memory::use_large_block_pool(memory::kLargeBlockMin);
  }
  const double start = current_resident_bytes();
  reset_peak_resident_memory();
  const double gemm_rate = measure_matmul_flops();
  auto single = dist::DistributedContext::single();
  // The model as one rank builds it under the setup's features (none of
  // which splits anything here): mixed precision's compute copies and
  // bf16 activations when it is on.
  FeatureRuntime runtime(c, *single, nullptr);
  runtime.install(setup.features);
  BuildContext bctx(c, *single, runtime.model().layers(), 1);
  runtime.model().apply_to(bctx);
  const ModelDescription desc = describe_model(c);
  BuiltModel model = build_model(desc, bctx);
  for (auto& b : model.blocks) b->train();
  auto optimizer = make_optimizer(OptimizerOptions::from(c), model.params);
  const auto data = make_dataset(c);
  const std::int64_t seq = c.get_int("model.seq_len");
  const double tokens = static_cast<double>(mbs * seq);
  const std::size_t nb = model.blocks.size();
  if (count_blocks) memory::use_block_cache(4096, 0);
  std::vector<double> fwd(nb + 1, 0.0), kept(nb + 1, 0.0);
  double bwd = 0;
  // The micro-batches of the steps after the first four are timed; each
  // block's seconds are the median over those steps (a step slowed by
  // another process on its core does not move it). Four steps warm up:
  // with two, a MoE's timed micro-batches still fell step after step (392,
  // 373, 360, 353, 342 us a token in one calibration: the heap still
  // growing to the routing's sizes), so the median sat above training's.
  const int timed_from = 4;
  std::vector<std::vector<double>> samples, first_samples, half_samples;
  // A MoE's layers: each block's routed-expert products timed (their
  // profile spans, forward and backward), and every micro-batch's tokens
  // per expert of each layer (the routing's loads).
  std::vector<std::pair<std::size_t, const MoeLayer*>> moes;  // (block, layer)
  for (std::size_t b = 0; b < nb; ++b)
    for (const auto& m : model.blocks[b]->modules())
      if (const auto* l = dynamic_cast<const MoeLayer*>(m.get())) moes.emplace_back(b, l);
  std::vector<std::vector<double>> routed, expert_samples, routed_before(moes.size());
  std::vector<double> expert(nb + 1, 0.0);
  auto span_seconds = [](const std::vector<profile::Event>& events, const char* name) {
    std::vector<double> out;
    for (const auto& e : events)
      if (e.name == name) out.push_back(static_cast<double>(e.end_ns - e.begin_ns) * 1e-9);
    return out;
  };
  // The step's end as the trainer runs it (the gradients' norm and clip,
  // the update, the next step's zeroing): seconds per step.
  // Two parts: what passes over the gradients (zeroing, norm, clip) and
  // the optimizer's update (over its state).
  std::vector<double> grad_passes, updates;
  const AttentionShape attention = attention_shape(c);
  std::vector<std::vector<double>> attention_samples;
  const double grad_clip = c.get_float("optimizer.grad_clip");
  std::unique_ptr<EmulatedSlicer> slicer;
  if (release_grads)
    slicer = std::make_unique<EmulatedSlicer>(model.params, c.get_float("distributed.bucket_size_mb") * kMiB);
  for (int step = 0; step < steps || (finished && !finished()); ++step) {
   const bool timing = step < steps;
   if (step == timed_from && before_timed) before_timed();
   const auto t_zero = Clock::now();
   if (!release_grads) optimizer->zero_grad();
   if (slicer) slicer->begin_step(micro);
   if (timing && step > timed_from) grad_passes.back() += since(t_zero);
   // Other samples for every micro-batch, as in training: a MoE's expert
   // buffers change size with the routing, which the heap's peak shows.
   // And, when asked, one more after them with half the positions of each
   // sample (a context-parallel rank's share at two): a block's time is
   // not proportional to its tokens (what each call costs whatever its
   // size), so the time per token at half the tokens is timed, in the same
   // steps as the whole micro-batches.
   const bool add_half = time_half_positions && timing && step >= timed_from && seq >= 2;
   for (int mb = 0; mb < micro + (add_half ? 1 : 0); ++mb) {
    const bool half = mb == micro;
    const std::int64_t mb_seq = half ? seq / 2 : seq;
    const double mb_tokens = static_cast<double>(mbs * mb_seq);
    // With two micro-batches or more a step, the first and the second are
    // timed apart: the first after an update pays what a layer redoes once
    // a step (a MoE repacks its experts' weights), the others do not.
    const bool timed = timing && step >= timed_from && (mb < std::min(micro, 2) || half);
    const bool first_of_several = micro >= 2 && mb == 0;
    const bool experts_timed = timed && !half && !moes.empty();
    if (timed) {
      std::fill(fwd.begin(), fwd.end(), 0.0);
      std::fill(expert.begin(), expert.end(), 0.0);
      bwd = 0;
      if (experts_timed) {
        profile::take_events();
        profile::set_recording(true);
      }
    }
    const Batch batch = make_batch(*data, Split::kTrain, step, (half ? 0 : mb) * mbs, mbs, mb_seq);
    c10::AutoGradMode grad(true);
    // Auxiliary losses collected as a training step does (a MoE's
    // balancing losses, and the routing statistics behind them).
    AuxLossScope aux;
    Activations x = batch.inputs;
    double before = count_blocks ? static_cast<double>(memory::block_cache_stats().in_use_bytes) : 0;
    for (std::size_t b = 0; b <= nb; ++b) {
      const auto t0 = Clock::now();
      LossOutput lo;
      if (b < nb) {
        x = model.blocks[b]->forward(x);
      } else {
        lo = model.loss->forward(x, batch.targets);
      }
      if (timed) fwd[b] += since(t0);
      if (experts_timed) {
        for (double v : span_seconds(profile::take_events(), "moe.experts")) expert[b] += v;
      }
      if (count_blocks) {
        const double now = static_cast<double>(memory::block_cache_stats().in_use_bytes);
        kept[b] = now - before;
        before = now;
      }
      if (b == nb) {
        const auto t1 = Clock::now();
        at::Tensor total = lo.sum / mb_tokens;
        const at::Tensor extra = aux.total();
        if (extra.defined()) total = total + extra / mb_tokens;
        total.backward();
        if (timed) bwd += since(t1);
      }
    }
    if (experts_timed && first_of_several) {
      profile::set_recording(false);
      profile::take_events();
    } else if (experts_timed) {
      profile::set_recording(false);
      // The backward runs the layers in reverse order.
      const auto back = span_seconds(profile::take_events(), "moe.experts.backward");
      for (std::size_t i = 0; i < back.size() && i < moes.size(); ++i) expert[moes[moes.size() - 1 - i].first] += back[i];
      std::vector<double> per_block;
      for (double v : expert) per_block.push_back(v / tokens);
      expert_samples.push_back(per_block);
    }
    for (std::size_t i = 0; i < moes.size() && timing && !half; ++i) {
      const auto& now = moes[i].second->stats().tokens_per_expert;
      auto& was = routed_before[i];
      was.resize(now.size(), 0.0);
      std::vector<double> delta;
      for (std::size_t e = 0; e < now.size(); ++e) delta.push_back(now[e] - was[e]);
      if (!delta.empty()) routed.push_back(delta);
      was = now;
    }
    if (timed) {
      // Forward and backward per block (the backward shared as the forwards).
      double fsum = 0;
      for (double f : fwd) fsum += f;
      std::vector<double> per_block;
      for (double f : fwd) per_block.push_back((f + (fsum > 0 ? bwd * f / fsum : 0)) / mb_tokens);
      (half ? half_samples : first_of_several ? first_samples : samples).push_back(per_block);
    }
   }
    if (slicer) {
      slicer->end_backward();
      // The update as a whole process runs it (the optimizer's state
      // made as in the other processes), on zero gradients.
      c10::NoGradGuard no_grad;
      for (auto& p : model.params)
        if (p.tensor.requires_grad() && !p.tensor.grad().defined()) p.tensor.mutable_grad() = at::zeros_like(p.tensor);
    }
    const auto t_clip = Clock::now();
    {
      std::vector<ParamEntry> grads;
      for (const auto& p : model.params) grads.push_back({p.spec, p.tensor.grad()});
      const double norm = global_grad_norm(*single, grads);
      if (grad_clip > 0) clip_to(grads, norm, grad_clip);
    }
    const auto t_update = Clock::now();
    optimizer->step(1e-4);
    // Released as a sharded optimizer releases them: the next backward
    // makes them anew among its activations.
    if (release_grads)
      for (auto& p : model.params) p.tensor.mutable_grad() = at::Tensor();
    if (timing && step >= timed_from) {
      grad_passes.push_back(std::chrono::duration<double>(t_update - t_clip).count());
      updates.push_back(since(t_update));
      // The attention apart, under the same load as the blocks: what a
      // layout computing it by blocks (a sequence layout's) replaces.
      if (attention.heads > 0) attention_samples.push_back(attention_figures(attention, mbs, threads));
    }
  }
  // The last step's zeroing was not timed.
  if (grad_passes.size() > 1) {
    grad_passes.pop_back();
    updates.pop_back();
  }
  nlohmann::json j;
  j["grad_passes"] = grad_passes;
  j["updates"] = updates;
  const ModelStateBytes state = optimizer->model_state(model.params);
  j["grad_bytes"] = state.grads;
  j["kept_copies_bytes"] = kept_copies_bytes(model.params);
  j["optimizer_bytes"] = state.optimizer;
  j["peak_above_start"] = peak_resident_memory_since_reset() - start;
  j["seconds_per_token"] = column_medians(samples, nb + 1);
  j["samples"] = samples;
  j["first_samples"] = first_samples;
  j["half_samples"] = half_samples;
  j["expert_samples"] = expert_samples;
  j["attention_samples"] = attention_samples;
  j["routed"] = routed;
  std::vector<double> per_token;
  for (double k : kept) per_token.push_back(std::max(0.0, k) / tokens);
  j["kept_per_token"] = per_token;
  j["model_state"] = optimizer->model_state(model.params).total();
  j["emulated_slices_bytes"] = slicer ? slicer->half_bytes() : 0.0;
  j["gemm_flops_per_s"] = gemm_rate;
  return j;
}

}  // namespace

std::vector<std::vector<double>> group_imbalance(const std::vector<std::vector<double>>& routed) {
  std::vector<std::vector<double>> out;
  if (routed.empty()) return out;
  const std::size_t E = routed.front().size();
  for (std::size_t G = 2; G <= E; ++G) {
    if (E % G != 0) continue;
    double sum = 0;
    int n = 0;
    for (const auto& r : routed) {
      if (r.size() != E) continue;
      std::vector<double> load(G, 0.0);
      double total = 0;
      for (std::size_t e = 0; e < E; ++e) {
        load[e / (E / G)] += r[e];
        total += r[e];
      }
      if (total <= 0) continue;
      sum += *std::max_element(load.begin(), load.end()) / (total / static_cast<double>(G));
      ++n;
    }
    out.push_back({static_cast<double>(G), n > 0 ? sum / n : 1.0});
  }
  return out;
}

Calibration calibrate(const Setup& setup) {
  const Config& c = setup.config;
  const auto t_start = Clock::now();
  Calibration cal;
  cal.key = calibration_key(setup);
  cal.cores = machine_cores();
  // A rank starts as a fork of its launcher (LibTorch and the plugins
  // loaded, nothing built): what a fork of this process holds at once.
  cal.baseline_bytes = std::stod(in_child([] { return std::to_string(current_resident_bytes()); }));
  const std::int64_t mbs = c.get_int("training.micro_batch_size"), seq = c.get_int("model.seq_len");
  auto child = [&](std::int64_t m, int threads, bool count, int micro) {
    return nlohmann::json::parse(in_child([&] { return one_process(setup, m, threads, count, micro).dump(); }));
  };
  // The bytes each block keeps, counted exactly (block cache), and the
  // peak a process reaches at two micro-batch sizes (glibc's heap, as in
  // training): the slope is what a token of activations costs at the peak,
  // the rest what a process adds besides its model state (code paged in,
  // thread stacks, the start-up probe).
  const nlohmann::json counted = child(mbs, 1, true, 1);
  // Four micro-batches a step for the peaks (the heap after a few routings).
  const nlohmann::json small = child(mbs, 1, false, 4), large = child(2 * mbs, 1, false, 4);
  // And at half the micro-batch when it has one: the peak is not linear in
  // the tokens below the calibrated micro-batch (the heap's size classes;
  // measured 31, 95 and 121 MiB at 256, 512 and 1024 tokens of the GPT
  // 4 x 256), which a layout with fewer tokens per rank (positions split
  // over a sequence group) meets.
  const nlohmann::json half = mbs >= 2 ? child(mbs / 2, 1, false, 4) : nlohmann::json();
  // And with the gradients released after every update (ZeRO stages 2
  // and 3 make them whole in each backward): what a byte of them costs at
  // the peak. Measured on the GPT 4 x 256 at two ranks, stage 2 and 3 peaks
  // sat 3-16 MiB above their bytes in use: gradients made while the
  // activations are freed do not fit the gaps those leave.
  const nlohmann::json released =
      nlohmann::json::parse(in_child([&] { return one_process(setup, mbs, 1, false, 4, 4, {}, {}, true).dump(); }));
  // One-thread ranks run with every core busy: the same process on each
  // core at once (shared caches and memory bandwidth); the first one's
  // times, five timed steps each, twice over: each block's median over the
  // ten (a step or a process the machine slowed does not set the figure).
  constexpr int kTimedSteps = 9;
  // Two micro-batches a step: the second's times are the blocks' (as most
  // micro-batches of a step run), the first's excess what a step adds once.
  // Several processes start their timed steps together (a barrier, as ranks
  // meet at their collectives): every core busy while any is timed.
  // And none stops before all are done timing: a process that did would
  // leave its core to the others and speed up their last timed steps (a
  // count of the finished in memory the children share).
  auto together = [&](int n, int threads, int steps, bool half = false) {
    const std::string file = store_file("hp_plan_store_timed_");
    void* shared = mmap(nullptr, sizeof(std::atomic<int>), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (shared == MAP_FAILED) throw std::runtime_error("hp-plan calibration: mmap of a shared counter failed");
    auto* done = new (shared) std::atomic<int>(0);
    std::vector<std::string> outs;
    try {
      outs = in_children_all(n, [&](int rank) {
        if (n == 1) return one_process(setup, mbs, threads, false, 2, steps, {}, {}, false, half).dump();
        auto ctx = join_group(rank, n, file);
        bool counted = false;
        auto finished = [&] {
          if (!counted) done->fetch_add(1);
          counted = true;
          return done->load() >= n;
        };
        return one_process(setup, mbs, threads, false, 2, steps, [&] { ctx->group("world").barrier(); }, finished, false, half)
            .dump();
      });
    } catch (...) {
      munmap(shared, sizeof(std::atomic<int>));
      std::filesystem::remove(file);
      throw;
    }
    munmap(shared, sizeof(std::atomic<int>));
    std::filesystem::remove(file);
    return outs;
  };
  // The slowest process's times: ranks meet at their collectives every
  // step, so a step goes at the pace of the slowest (on this machine one
  // core runs 5-10 % behind the other: the GPT 6 x 384 at dp=2 had rank 0
  // wait 0.07 s a step for rank 1's last gradients, and the first
  // process's times, taken before, put every dp layout 5-12 % under).
  auto timed = [&](int n, int threads, int steps, bool half = false) {
    nlohmann::json slowest;
    double most = -1;
    for (const auto& o : together(n, threads, steps, half)) {
      nlohmann::json j = nlohmann::json::parse(o);
      double sum = 0;
      for (double v : j["seconds_per_token"].get<std::vector<double>>()) sum += v;
      if (sum > most) {
        most = sum;
        slowest = std::move(j);
      }
    }
    return slowest;
  };
  // Two processes' samples together; each block's seconds their median.
  auto pooled = [](nlohmann::json a, const nlohmann::json& b) {
    for (const char* k :
         {"samples", "first_samples", "half_samples", "expert_samples", "attention_samples", "grad_passes", "updates"})
      for (const auto& v : b[k]) a[k].push_back(v);
    const auto samples = a["samples"].get<std::vector<std::vector<double>>>();
    a["seconds_per_token"] = column_medians(samples, a["seconds_per_token"].size());
    a["gemm_flops_per_s"] = std::max(a["gemm_flops_per_s"].get<double>(), b["gemm_flops_per_s"].get<double>());
    return a;
  };
  // (The one-thread processes also time a micro-batch of half the
  // positions: only a layout of several ranks splits the positions.)
  const nlohmann::json loaded =
      pooled(timed(cal.cores, 1, kTimedSteps, true), timed(cal.cores, 1, kTimedSteps, true));
  const double tokens = static_cast<double>(mbs * seq);
  const double slope = std::max(0.0, (large["peak_above_start"].get<double>() - small["peak_above_start"].get<double>()) / tokens);
  const auto kept = counted["kept_per_token"].get<std::vector<double>>();
  double kept_sum = 0;
  for (double k : kept) kept_sum += k;
  // Each block's share of the slope, as its share of the counted bytes.
  for (double k : kept) cal.act_bytes_per_token.push_back(kept_sum > 0 ? slope * k / kept_sum : 0);
  cal.backward_extra_per_token = 0;
  // (The layers' kept copies are counted per rank from what it builds.)
  cal.process_extra_bytes = std::max(0.0, small["peak_above_start"].get<double>() - slope * tokens -
                                              small["model_state"].get<double>() -
                                              small["kept_copies_bytes"].get<double>());
  {
    const double g = small["grad_bytes"].get<double>();
    const double kept_peak = small["peak_above_start"].get<double>(), released_peak = released["peak_above_start"].get<double>();
    // (Less the rank's half of the gradients the released process keeps:
    // counted with the model state.)
    if (g > 0)
      cal.grads_made_whole_factor =
          std::max(0.0, (released_peak - released["emulated_slices_bytes"].get<double>() - (kept_peak - g)) / g);
  }
  // What a step adds besides the model state and the kept copies, at each
  // measured micro-batch (tokens, bytes).
  auto in_step = [&](const nlohmann::json& j, std::int64_t m) {
    return std::vector<double>{static_cast<double>(m * seq), j["peak_above_start"].get<double>() -
                                                                 j["model_state"].get<double>() -
                                                                 j["kept_copies_bytes"].get<double>()};
  };
  if (!half.is_null()) cal.in_step_points.push_back(in_step(half, mbs / 2));
  cal.in_step_points.push_back(in_step(small, mbs));
  cal.in_step_points.push_back(in_step(large, 2 * mbs));
  cal.seconds_per_token_1 = loaded["seconds_per_token"].get<std::vector<double>>();
  {
    const auto half = loaded["half_samples"].get<std::vector<std::vector<double>>>();
    if (!half.empty()) cal.seconds_per_token_half_positions_1 = column_medians(half, cal.seconds_per_token_1.size());
  }
  // The step's end per byte of the gradients and of the optimizer's state.
  auto per_byte = [](const nlohmann::json& j, const char* what, const char* bytes) {
    const double b = j[bytes].get<double>();
    return b > 0 ? median(j[what].get<std::vector<double>>()) / b : 0.0;
  };
  // A MoE's routed-expert products per block (the median over the timed
  // micro-batches), and how unevenly the routing loads the experts' groups.
  auto expert_per_token = [&](const nlohmann::json& j) {
    return column_medians(j["expert_samples"].get<std::vector<std::vector<double>>>(),
                          cal.seconds_per_token_1.size());
  };
  cal.expert_seconds_per_token_1 = expert_per_token(loaded);
  // What the first micro-batch after an update takes beyond the others, per
  // block (seconds per token of the calibrated micro-batch).
  auto first_extra = [&](const nlohmann::json& j) {
    const auto later = j["seconds_per_token"].get<std::vector<double>>();
    const auto first = j["first_samples"].get<std::vector<std::vector<double>>>();
    std::vector<double> out = column_medians(first, later.size());
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = first.empty() ? 0.0 : std::max(0.0, out[i] - later[i]);
    return out;
  };
  cal.first_micro_batch_extra_1 = first_extra(loaded);
  // The model's attention core per token and a head's block at each timed
  // length (the medians over the timed steps).
  auto attention_of = [&](const nlohmann::json& j, double& core, std::vector<std::vector<double>>& blocks) {
    const auto samples = j["attention_samples"].get<std::vector<std::vector<double>>>();
    const auto lengths = attention_block_lengths(seq);
    if (samples.empty()) return;
    const auto med = column_medians(samples, 1 + lengths.size());
    core = med[0];
    blocks.clear();
    for (std::size_t i = 0; i < lengths.size(); ++i) blocks.push_back({static_cast<double>(lengths[i]), med[i + 1]});
  };
  attention_of(loaded, cal.attention_core_seconds_per_token_1, cal.attention_block_seconds_1);
  cal.expert_group_imbalance = group_imbalance(small["routed"].get<std::vector<std::vector<double>>>());
  cal.grad_pass_seconds_per_byte_1 = per_byte(loaded, "grad_passes", "grad_bytes");
  cal.update_seconds_per_byte_1 = per_byte(loaded, "updates", "optimizer_bytes");
  {
    // Two one-thread processes per core (more ranks than cores): the time
    // against one per core (time slicing, caches shared by twice as many).
    // The processes start their timed steps together (a barrier, as ranks
    // meet at their collectives) and stay busy until all are done (one
    // timed while the others were starting or done measured 1.70-2.16 for
    // the same model).
    const auto outs = together(2 * cal.cores, 1, 7);
    double one = 0;
    for (double v : cal.seconds_per_token_1) one += v;
    // Each process's mean micro-batch over its timed ones, the mean over
    // the processes: time slicing stretches a block when the process is
    // switched out, and a median per block (summed) leaves those out
    // (measured 1.71-2.06 that way against 2.17 for four hp-train runs of
    // the GPT 4 x 256 side by side).
    std::vector<double> ratios;
    for (const auto& o : outs) {
      const auto samples = nlohmann::json::parse(o)["samples"].get<std::vector<std::vector<double>>>();
      double two = 0;
      for (const auto& s : samples)
        for (double v : s) two += v / static_cast<double>(samples.size());
      if (one > 0 && !samples.empty()) ratios.push_back(two / one);
    }
    double mean = 0;
    for (double r : ratios) mean += r / static_cast<double>(ratios.size());
    cal.two_per_core_factor = ratios.empty() ? 2.0 : mean;
  }
  cal.gemm_flops_per_s_1 = loaded["gemm_flops_per_s"].get<double>();
  if (cal.cores > 1) {
    const nlohmann::json all = pooled(timed(1, cal.cores, kTimedSteps), timed(1, cal.cores, kTimedSteps));
    cal.seconds_per_token_all = all["seconds_per_token"].get<std::vector<double>>();
    cal.grad_pass_seconds_per_byte_all = per_byte(all, "grad_passes", "grad_bytes");
    cal.expert_seconds_per_token_all = expert_per_token(all);
    cal.first_micro_batch_extra_all = first_extra(all);
    attention_of(all, cal.attention_core_seconds_per_token_all, cal.attention_block_seconds_all);
    cal.update_seconds_per_byte_all = per_byte(all, "updates", "optimizer_bytes");
    cal.gemm_flops_per_s_all = all["gemm_flops_per_s"].get<double>();
  } else {
    cal.seconds_per_token_all = cal.seconds_per_token_1;
    cal.grad_pass_seconds_per_byte_all = cal.grad_pass_seconds_per_byte_1;
    cal.expert_seconds_per_token_all = cal.expert_seconds_per_token_1;
    cal.first_micro_batch_extra_all = cal.first_micro_batch_extra_1;
    cal.attention_core_seconds_per_token_all = cal.attention_core_seconds_per_token_1;
    cal.attention_block_seconds_all = cal.attention_block_seconds_1;
    cal.update_seconds_per_byte_all = cal.update_seconds_per_byte_1;
    cal.gemm_flops_per_s_all = cal.gemm_flops_per_s_1;
  }
  // A sum between two ranks: its latency and bytes per second.
  const CollectiveSpeed speed = collective_speed();
  cal.collective_latency_s = speed.latency_s;
  cal.collective_bytes_per_s = speed.bytes_per_s;
  cal.collective_large_bytes_per_s = speed.large_bytes_per_s;
  cal.collective_in_step_s = speed.in_step_extra_s;
  cal.p2p_latency_s = speed.p2p_latency_s;
  cal.p2p_bytes_per_s = speed.p2p_bytes_per_s;
  cal.ring_step_s = speed.ring_step_s;
  cal.collective_bf16_sum_factor = speed.bf16_sum_factor;
  cal.ring_step_bytes = static_cast<double>(kRingMessageBytes);
  // Twice as many ranks as cores.
  cal.shared_core_collective_s = shared_core_in_step(2 * cal.cores);
  cal.seconds = since(t_start);
  const std::string path = calibration_path(setup);
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  const std::string tmp = path + ".tmp";
  std::ofstream(tmp) << cal.to_json();
  std::filesystem::rename(tmp, path);
  return cal;
}

std::vector<RankEstimate> model_state(const Setup& setup) {
  std::vector<RankEstimate> out;
  for (int r : planned_ranks(setup.mesh)) {
    const RankBuild b = build_rank(setup, r);
    RankEstimate e;
    e.rank = r;
    e.coords = setup.mesh.tag(r);
    e.blocks = static_cast<int>(b.model.blocks.size());
    e.params = b.state.params;
    e.grads = b.state.grads;
    e.optimizer = b.state.optimizer;
    out.push_back(e);
  }
  return out;
}

double LayoutEstimate::peak_bytes() const {
  double m = 0;
  for (const auto& r : ranks) m = std::max(m, r.peak());
  return m;
}

LayoutEstimate estimate(const Setup& setup, const Calibration& cal) {
  const Config& c = setup.config;
  const auto& mesh = setup.mesh;
  const int world = mesh.world_size();
  LayoutEstimate out;
  out.world = world;
  out.threads_per_rank = std::max(1, cal.cores / world);
  // More single-thread ranks than cores share them.
  const double oversubscribed = std::max(1.0, static_cast<double>(world * out.threads_per_rank) / cal.cores);
  // Compute slows by the calibrated factor at two ranks per core, in
  // proportion between one and two, and beyond as the ranks per core.
  const double f2 = cal.two_per_core_factor;
  const double slowdown = oversubscribed <= 2 ? 1 + (f2 - 1) * (oversubscribed - 1) : f2 * oversubscribed / 2;
  const std::int64_t mbs = c.get_int("training.micro_batch_size"), seq = c.get_int("model.seq_len");
  const std::int64_t gbs = c.get_int("training.global_batch_size");
  const int replicas = role_size(mesh, dist::MeshRole::kReplicate);
  const int positions = role_size(mesh, dist::MeshRole::kSequence);
  const double tokens = static_cast<double>(mbs * seq) / positions;  // per micro-batch on a rank
  const double calibrated_tokens = static_cast<double>(mbs * seq);  // per micro-batch at one process
  const int micro_batches = static_cast<int>(std::max<std::int64_t>(1, gbs / (replicas * mbs)));
  out.tokens_per_step = static_cast<double>(gbs * seq);
  const ModelInfo info = model_info(c);
  const double hidden = info.size("hidden") ? static_cast<double>(info.size("hidden")->value) : 0.0;
  const std::int64_t heads = info.uses("attention.heads") && info.size("heads") ? info.size("heads")->value : 0;
  const double bucket = c.get_float("distributed.bucket_size_mb") * kMiB;
  const bool overlap = c.get_bool("distributed.overlap");
  const auto& per_token = out.threads_per_rank > 1 ? cal.seconds_per_token_all : cal.seconds_per_token_1;
  // A collective over n ranks: the calibrated pair's latency, and its bytes
  // (times a ring's 2 (n - 1) / n over n = 2's 1) at the pair's speed: the
  // first 4 MiB at the cached speed, the rest at the large one; ranks
  // sharing cores share that speed too.
  auto collective = [&](double bytes, double n) {
    const double b = bytes * (n - 1) / (n / 2), cached = std::min(b, kCachedCollectiveBytes);
    const double beyond = cal.collective_large_bytes_per_s > 0 ? (b - cached) / cal.collective_large_bytes_per_s
                                                               : (b - cached) / cal.collective_bytes_per_s;
    return cal.collective_latency_s + (cached / cal.collective_bytes_per_s + beyond) * oversubscribed;
  };
  // What a collective issued between computations adds: measured on an
  // idle pair, and with two ranks per core (in proportion between).
  const double in_step = oversubscribed <= 1 ? cal.collective_in_step_s
                         : cal.collective_in_step_s + (cal.shared_core_collective_s - cal.collective_in_step_s) *
                                                          std::min(1.0, oversubscribed - 1);

  // A block's seconds per token on a rank holding `share` of its weights:
  // its products (3x its forward FLOPs at the calibrated product rate)
  // take that share; the rest of its measured time (norms, element-wise
  // ops, softmax) stays whole.
  const double rate = out.threads_per_rank > 1 ? cal.gemm_flops_per_s_all : cal.gemm_flops_per_s_1;
  // Fewer tokens a micro-batch than calibrated (positions split over a
  // sequence group): a block's seconds per micro-batch on the line through
  // the whole micro-batch's and the half-positions one's (a part per call,
  // a part per token), never under the whole's per token. Measured on the
  // GPT 4 x 256 (micro-batch 2, 128 positions), dp=2 against the same at
  // 64 positions: 0.303-0.320 s a step against 0.164-0.169 for half the
  // tokens, and 4 micro-batches of 128 tokens 0.009-0.014 s more than 2
  // of 256 (calibrated: 5-14 % more a token at half the positions).
  const bool fewer_tokens = positions > 1 && out.threads_per_rank == 1 &&
                            cal.seconds_per_token_half_positions_1.size() == per_token.size() && seq >= 2;
  const double half_tokens = static_cast<double>(mbs * (seq / 2));
  auto per_token_at = [&](std::size_t index) {
    const double whole = per_token.at(index);
    if (!fewer_tokens || tokens >= calibrated_tokens) return whole;
    const double at_whole = whole * calibrated_tokens,
                 at_half = cal.seconds_per_token_half_positions_1.at(index) * half_tokens;
    const double t = at_half + (at_whole - at_half) * (tokens - half_tokens) / (calibrated_tokens - half_tokens);
    return std::max(whole, t / tokens);
  };
  auto block_seconds = [&](std::size_t index, double share) {
    const double measured = per_token_at(index);
    const double flops = index < info.block_flops.size() ? info.block_flops[index] : info.loss_flops;
    const double products = std::min(measured, rate > 0 ? 3 * flops / rate : measured);
    return products * share + (measured - products);
  };
  // A sum over n ranks of `elements`: an fp32 one's time, times the
  // calibrated factor of a bf16 sum over an fp32 one of as many elements.
  auto sum_seconds = [&](double elements, double n, bool bf16) {
    const double t = collective(elements * 4, n);
    return bf16 ? t * cal.collective_bf16_sum_factor : t;
  };
  auto message = [&](double bytes) {
    return cal.p2p_latency_s + in_step + bytes / cal.p2p_bytes_per_s * oversubscribed;
  };
  // Activation bytes per token of the whole model at one process.
  double slope = 0;
  for (double v : cal.act_bytes_per_token) slope += v;
  for (int r : planned_ranks(setup.mesh)) {
    const RankBuild b = build_rank(setup, r);
    // Bytes an element of the activations (and of what crosses ranks with
    // them) and of the gradients' sums take under the rank's precision.
    const PrecisionPolicy& precision = b.runtime->model().precision();
    const double act_elem = static_cast<double>(c10::elementSize(precision.param_dtype));
    const double sum_elem = static_cast<double>(c10::elementSize(precision.reduce_dtype));
    RankEstimate e;
    e.rank = r;
    e.coords = mesh.tag(r);
    e.blocks = static_cast<int>(b.model.blocks.size());
    e.params = b.state.params;
    e.grads = b.state.grads;
    e.optimizer = b.state.optimizer;
    e.baseline = cal.baseline_bytes;
    const StepShape shape = b.executor->shape(micro_batches);
    e.in_flight = std::min<double>(shape.in_flight, micro_batches);

    // Each built block's parameters (and the loss's: those of no block).
    std::map<int, std::vector<const ParamEntry*>> by_block;
    for (const auto& p : b.model.params) by_block[p.block].push_back(&p);
    double act = 0, recompute_inputs = 0, largest_block = 0, seconds = 0, once = 0;
    double act_comm = 0, act_bytes_sent = 0;
    // The largest message of each kind of group the rank's collectives
    // run over, with the group's size: its shared-memory pages (below).
    double split_message = 0, split_n = 1, expert_message = 0, expert_n = 1;
    // A zero-bubble schedule's W queue: a micro-batch whose B ran and
    // whose W waits holds, of its activations, what each split layer's W
    // reads, per token its input and its output's gradient (a product's
    // two widths as this rank holds it, a norm's width twice, an
    // embedding's row; biases share their weight's), and frees the rest
    // in B. Its activations count whole among those in flight; what W
    // holds beyond them is added. (Counting the output gradients on top of
    // whole activations put zb_h1 at +12 to +16 % at two stages of the GPT
    // 4 x 256: its last stage measured 26 MiB above 1f1b's, that estimate
    // 44.) Expert FFNs left out (their W runs in B).
    double w_queue_per_token = 0;
    if (shape.weight_pending > 0) {
      for (const auto& p : b.model.params) {
        const auto g = p.tensor.sizes();
        const std::string& n = p.spec.name;
        if (n.size() >= 5 && n.compare(n.size() - 5, 5, ".bias") == 0) continue;
        if (g.size() == 2) w_queue_per_token += static_cast<double>(p.embedding ? g[1] : g[0] + g[1]) * act_elem;
        if (g.size() == 1) w_queue_per_token += static_cast<double>(2 * g[0]) * act_elem;
      }
    }
    // Modules above the stream's tensor-parallel degree (gathering views):
    // per micro-batch each gathers its input from the `samples` members
    // forward and reduce-scatters its output to them, and backward the
    // reverse (four collectives of a micro-batch's activations each way),
    // and keeps the gathered input for backward. Returns those bytes.
    std::map<const dist::MeshView*, std::pair<double, double>> gather_groups;  // view: largest piece, members
    auto gather_modules = [&](const std::vector<const ParamEntry*>& ps) {
      double kept_bytes = 0;
      for (const auto& g : gatherings(ps, mesh)) {
        if (g.samples <= 1) continue;
        const double piece = hidden * act_elem * tokens, n = g.samples;
        // An all-gather of `piece` from each of n members moves (n - 1)
        // pieces a rank: an all-reduce of piece n / 2 in collective()'s terms.
        act_comm += 4 * (collective(piece * n / 2, n) + in_step);
        act_bytes_sent += 4 * piece * (n - 1);
        kept_bytes += piece * (n - 1);
        auto& group = gather_groups[g.view];
        group = {std::max(group.first, piece), n};
      }
      return kept_bytes;
    };
    for (std::size_t i = 0; i < b.model.indices.size(); ++i) {
      const int index = b.model.indices[i];
      const auto& ps = by_block[index];
      const double share = split_share(ps, mesh);
      const double bytes = cal.act_bytes_per_token.at(static_cast<std::size_t>(index)) * share * tokens +
                           gather_modules(ps);
      largest_block = std::max(largest_block, bytes);
      if (b.recomputed[i]) {
        recompute_inputs += hidden * act_elem * tokens;
      } else {
        act += bytes;
      }
      seconds += block_seconds(static_cast<std::size_t>(index), share) * tokens * (b.recomputed[i] ? 4.0 / 3 : 1.0);
      const auto& first = out.threads_per_rank > 1 ? cal.first_micro_batch_extra_all : cal.first_micro_batch_extra_1;
      if (static_cast<std::size_t>(index) < first.size())
        once += first[static_cast<std::size_t>(index)] * calibrated_tokens * held_share(ps);
      // Experts split over a group of their own (not a base split: each
      // rank runs its experts on the rows routed to them): per micro-batch
      // the forward exchanges counts, rows out and results back, the
      // backward the two rows' gradients; each rows exchange moves a
      // token's top-k rows, the share bound for other ranks.
      const int experts_over = expert_group(ps, mesh);
      if (experts_over > 1 && info.expert_rows_per_token > 0) {
        const double out_bytes = tokens * info.expert_rows_per_token * hidden * act_elem * (experts_over - 1) / experts_over;
        act_comm += 5 * (cal.collective_latency_s + in_step) + 4 * out_bytes / cal.p2p_bytes_per_s * oversubscribed;
        expert_message = std::max(expert_message, out_bytes);
        expert_n = std::max<double>(expert_n, experts_over);
        act_bytes_sent += 4 * out_bytes;
        // Each exchange waits for the group's most loaded rank: its experts
        // take more rows than the mean by the calibrated routing's factor.
        const auto& ex = out.threads_per_rank > 1 ? cal.expert_seconds_per_token_all : cal.expert_seconds_per_token_1;
        double factor = 1;
        for (const auto& g : cal.expert_group_imbalance)
          if (static_cast<int>(g.at(0)) == experts_over) factor = g.at(1);
        if (static_cast<std::size_t>(index) < ex.size())
          act_comm += (factor - 1) * ex[static_cast<std::size_t>(index)] * tokens * slowdown;
      }
      const int t = split_group(ps, mesh);
      if (t > 1 && share < 1) {
        // A split block sums its output in forward and its input's gradient
        // in backward (two of each for a transformer block).
        act_comm += 4 * (sum_seconds(hidden * tokens, t, act_elem < 4) + in_step);
        act_bytes_sent += 4 * hidden * act_elem * tokens * 2.0 * (t - 1) / t;
        split_message = std::max(split_message, hidden * act_elem * tokens);
        split_n = std::max<double>(split_n, t);
      }
    }
    if (b.model.loss) {
      const std::size_t li = cal.act_bytes_per_token.size() - 1;
      const double share = split_share(by_block[-1], mesh);
      act += cal.act_bytes_per_token[li] * share * tokens + gather_modules(by_block[-1]);
      seconds += block_seconds(li, share) * tokens;
    }
    // Stage messages: a stage sends its activations on and their gradient
    // back, per micro-batch and chunk.
    const int stages = role_size(mesh, dist::MeshRole::kPartition);
    if (stages > 1) {
      // The rank's chunks: its runs of consecutive blocks.
      double chunks = b.model.indices.empty() ? 0 : 1;
      for (std::size_t i = 1; i < b.model.indices.size(); ++i)
        if (b.model.indices[i] != b.model.indices[i - 1] + 1) ++chunks;
      act_comm += 2 * chunks * message(hidden * act_elem * tokens);
      act_bytes_sent += 2 * chunks * hidden * act_elem * tokens;
    }
    // Positions split over a sequence group: each layer's attention passes
    // its keys and values around the ring (c - 1 steps) in forward, and
    // keys, values and their gradients in backward (4 pairs in all).
    if (positions > 1) {
      int layers = 0;
      for (int index : b.model.indices)
        if (b.desc.blocks[static_cast<std::size_t>(index)].name.rfind("blocks.", 0) == 0) ++layers;
      // Each exchange costs what the calibrated ring step added between
      // products (its message in flight while a product runs, both
      // members waiting for each other), in proportion to its bytes above
      // a message's latency.
      const double pair = 2 * tokens * hidden * act_elem;
      const double ring_step =
          cal.p2p_latency_s + std::max(0.0, cal.ring_step_s - cal.p2p_latency_s) * pair / std::max(1.0, cal.ring_step_bytes);
      act_comm += layers * 4.0 * (positions - 1) * std::max(message(pair), ring_step * oversubscribed);
      act_bytes_sent += layers * 4.0 * (positions - 1) * pair;
    }
    // Attention computed by blocks under the rank's sequence layout (context
    // parallel's ring): its blocks, at the calibrated seconds of a head's
    // block of their length, replace the model's own attention in each
    // attention layer's seconds (counted there per token). Measured on the
    // GPT 4 x 256 at cp=2, micro-batch 4: the ring's block computations
    // took 0.09 s a step where the layers' calibrated attention came to
    // about 0.04, the step 31 % under the prediction without this.
    const auto& layout = b.runtime->model().sequence_layout();
    if (layout && layout->attention_blocks && heads > 0) {
      const bool all = out.threads_per_rank > 1;
      const auto blocks = layout->attention_blocks(seq);
      const double per_block =
          seconds_at_length(all ? cal.attention_block_seconds_all : cal.attention_block_seconds_1, blocks.size);
      const double core = all ? cal.attention_core_seconds_per_token_all : cal.attention_core_seconds_per_token_1;
      for (std::size_t i = 0; per_block > 0 && i < b.model.indices.size(); ++i) {
        const int index = b.model.indices[i];
        if (b.desc.blocks[static_cast<std::size_t>(index)].name.rfind("blocks.", 0) != 0) continue;
        const double share = split_share(by_block[index], mesh);  // the rank's heads
        // (The blocks' own attention at the rank's positions: per token in
        // proportion to its length, when timed at fewer positions.)
        const double own = fewer_tokens ? core * tokens / positions : core * tokens;
        seconds += (per_block * static_cast<double>(mbs * heads) * share * blocks.count - own) *
                   (b.recomputed[i] ? 4.0 / 3 : 1.0);
      }
    }
    // Below the calibrated micro-batch's tokens the peak follows the
    // measured points, not the slope above them (the heap's size classes).
    double extra = cal.process_extra_bytes, kept = act * e.in_flight;
    if (cal.in_step_points.size() == 3 && slope > 0) {
      const auto& lo = cal.in_step_points[0];
      const auto& at = cal.in_step_points[1];
      const double t = kept / slope;  // the one-process tokens that keep as much
      if (t < at[0] && at[0] > lo[0]) {
        const double m = std::max(0.0, lo[1] + (at[1] - lo[1]) * (t - lo[0]) / (at[0] - lo[0]));
        kept = std::max(0.0, m - extra);
        extra = m - kept;
      }
    }
    // A replayed block holds its activations and their gradients at once.
    e.activations = kept + recompute_inputs * e.in_flight + (recompute_inputs > 0 ? 2 * largest_block : 0) +
                    std::max(0.0, w_queue_per_token * tokens - act) * std::min<double>(shape.weight_pending, micro_batches);
    e.compute = (seconds * micro_batches + once) * slowdown;
    e.idle = shape.idle_fraction < 1 ? e.compute * shape.idle_fraction / (1 - shape.idle_fraction) : 0;

    // Gradient sums over the partial dimensions' groups (once a step, or
    // per micro-batch when the optimizer shards them so), and the sharded
    // parameters gathered per micro-batch.
    double grad_elements = 0, grad_comm = 0, group = 1;
    for (const auto& p : b.model.params) {
      double n = 1;
      for (const auto& pl : p.spec.grad) {
        if (pl.placement.kind == dist::Placement::Kind::kPartial) n *= mesh.group_size(pl.dim);
      }
      if (n > 1) {
        grad_elements += static_cast<double>(p.tensor.numel());
        group = std::max(group, n);
      }
    }
    const double grad_bytes = grad_elements * sum_elem;
    const double rounds = b.state.grads_per_micro_batch ? micro_batches : 1;
    if (grad_bytes > 0) {
      grad_comm = rounds * (sum_seconds(grad_elements, group, sum_elem < 4) +
                            std::ceil(grad_bytes / bucket) * (cal.collective_latency_s + in_step));
      grad_comm += micro_batches * collective(b.state.gathered_per_micro_batch / 2, group);
    }
    // The optimizer's transient at the activations' peak, or, when larger,
    // what it holds after the update (gathers still travelling) beside the
    // next forward's first block: the peak is the larger of the two phases.
    // (The first block: a micro-batch's activations over the rank's blocks.)
    const double first_block =
        b.model.indices.empty() ? 0 : kept / std::max(1.0, e.in_flight) / static_cast<double>(b.model.indices.size());
    double at_peak = b.state.transient + (cal.grads_made_whole_factor - 1) * b.state.made_whole;
    // Released gradients reduced per micro-batch: in one process the last
    // buckets of a micro-batch still travel at the next one's peak, the
    // start of its backward, in place of whole gradients (the factor above
    // holds them). Where a backward runs beside other micro-batches'
    // activations, after earlier backwards of the step (a pipeline stage
    // holding more than one micro-batch but fewer than the step's: 1f1b's
    // and zbv's steady phase), its peak comes later, with its whole
    // gradients made and the previous micro-batch's buckets still
    // travelling (the optimizer says what they hold: ModelStateBytes::
    // travelling). (GPipe's peak is its first backward: nothing travels
    // yet.) Measured
    // on the GPT 4 x 256 at pp=2 x dp=2 (pool in use above ZeRO-1's, less
    // the released halves): 8.6 MiB on stage 0 of 1f1b, 11.8-12.5 under
    // zbv, stages of 6.0-6.7 MiB of gradients, where the factor alone gave
    // 1.3; the peaks of stages 2 and 3 went from -9.5..-12.6 % to -5.2..-0.4 %.
    if (e.in_flight > 1 && e.in_flight < micro_batches) at_peak += b.state.travelling;
    const double after_update = b.state.after_update > 0 ? b.state.after_update + first_block - e.activations : 0;
    const double optimizer_extra = std::max(at_peak, after_update);
    // Collectives between ranks of this host go through one shared-memory
    // segment per group, two sets of slots of at most kShmSlotBytes a
    // member; a rank's resident memory holds the pages its operations
    // touched: of its own slots a piece (the largest message, at most a
    // slot), of the other members' all of it where it gathers (ZeRO's
    // slices) and two parts in n where it only sums or exchanges (its part
    // of each slot, and the members' sums). Measured on the GPT 4 x 256
    // with buckets of 4 MiB (RssShmem): 8 MiB a rank at dp=2, 11.6-12.2 at
    // dp=4, 16.0-16.4 at dp=4 under ZeRO (stages 1-3).
    auto segment = [](double message, double n, bool gathers) {
      if (n <= 1 || message <= 0) return 0.0;
      const double piece = std::min(message, kShmSlotBytes);
      return 2 * piece * (gathers ? n : 1 + (n - 1) * std::min(1.0, 2 / n));
    };
    const bool gathers = b.state.after_update > 0 || b.state.gathered_per_micro_batch > 0;
    e.buffers = extra + optimizer_extra + segment(std::min(bucket, grad_bytes), group, gathers) +
                segment(split_message, split_n, false) + segment(expert_message, expert_n, false);
    // A gathering view's group (one segment each): its own slots hold a
    // reduce-scatter's whole input (n pieces), of each other member's it
    // reads the piece it gathers and its part of the sums. Measured on the
    // GPT 4 x 256 at dp=4 with every module at degree 4 (micro-batch 2,
    // pieces of 256 KiB): 21 MiB of shared memory a rank against 10.5 at
    // dp=4, where four groups of 5 MiB make 20.
    for (const auto& [view, g] : gather_groups) {
      const double piece = g.first, n = g.second;
      e.buffers += 2 * (std::min(n * piece, kShmSlotBytes) + (n - 1) * std::min(2 * piece, kShmSlotBytes));
    }
    e.kept_copies = kept_copies_bytes(b.model.params);
    // The reduction overlaps the backward (two thirds of the compute) where
    // the code overlaps it and a core is free to run it.
    const bool free_core = world * out.threads_per_rank < cal.cores;
    const double exposed = overlap && free_core ? std::max(0.0, grad_comm - e.compute * 2 / 3) : grad_comm;
    // The step's end: the passes over the gradients this rank holds and
    // the update of its optimizer state, then the loss's sum and the
    // gradients' norm summed over the ranks (two small collectives).
    const bool threads_all = out.threads_per_rank > 1;
    e.update = (e.grads * (threads_all ? cal.grad_pass_seconds_per_byte_all : cal.grad_pass_seconds_per_byte_1) +
                e.optimizer * (threads_all ? cal.update_seconds_per_byte_all : cal.update_seconds_per_byte_1)) *
               slowdown;
    const double step_end_comm = world > 1 ? 2 * (cal.collective_latency_s + in_step) : 0;
    e.comm = micro_batches * act_comm + exposed + step_end_comm;
    e.comm_bytes = micro_batches * act_bytes_sent +
                   rounds * grad_bytes * 2 * (group - 1) / group +
                   micro_batches * b.state.gathered_per_micro_batch * (group - 1) / group;
    out.ranks.push_back(e);
  }
  for (const auto& e : out.ranks) out.step_seconds = std::max(out.step_seconds, e.compute + e.idle + e.comm + e.update);
  return out;
}

std::string describe_memory(const LayoutEstimate& e, bool with_activations) {
  // Ranks with the same figures share a line ("0-3", "0,2"): a large
  // world of data-parallel replicas stays a few lines.
  std::vector<std::pair<std::string, const RankEstimate*>> rows;
  std::vector<std::vector<int>> members;
  auto same = [&](const RankEstimate& a, const RankEstimate& b) {
    return a.blocks == b.blocks && a.params == b.params && a.grads == b.grads && a.optimizer == b.optimizer &&
           (!with_activations ||
            (a.activations == b.activations && a.buffers == b.buffers && a.kept_copies == b.kept_copies));
  };
  for (const auto& r : e.ranks) {
    std::size_t i = 0;
    while (i < rows.size() && !same(*rows[i].second, r)) ++i;
    if (i == rows.size()) {
      rows.emplace_back("", &r);
      members.emplace_back();
    }
    members[i].push_back(r.rank);
  }
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto& m = members[i];
    std::string text;
    for (std::size_t j = 0; j < m.size();) {
      std::size_t k = j;
      while (k + 1 < m.size() && m[k + 1] == m[k] + 1) ++k;
      text += (text.empty() ? "" : ",") + std::to_string(m[j]) + (k > j ? "-" + std::to_string(m[k]) : "");
      j = k + 1;
    }
    rows[i].first = text;
  }
  std::ostringstream o;
  o << std::fixed << std::setprecision(1);
  o << "memory per rank (MiB; model state exact from the planning build"
    << (with_activations ? "; activations and baseline from the calibration; buffers: gradient buckets, the "
                           "step's transients, the layers' kept copies"
                         : "")
    << "):\n";
  o << "  ranks       coords of the first   blocks   params    grads  optimizer   state";
  if (with_activations) o << "  activations  buffers  baseline     peak";
  o << "\n";
  for (const auto& [ranks, r] : rows) {
    o << "  " << std::left << std::setw(11) << ranks << " " << std::setw(20) << r->coords << std::right
      << std::setw(7) << r->blocks << std::setw(9) << r->params / kMiB << std::setw(9) << r->grads / kMiB
      << std::setw(11) << r->optimizer / kMiB << std::setw(8) << r->model_state() / kMiB;
    if (with_activations) {
      o << std::setw(13) << r->activations / kMiB << std::setw(9) << (r->buffers + r->kept_copies) / kMiB << std::setw(10)
        << r->baseline / kMiB << std::setw(9) << r->peak() / kMiB;
    }
    o << "\n";
  }
  if (e.world > 0 && static_cast<int>(e.ranks.size()) < e.world) {
    o << "  (" << e.ranks.size() << " of " << e.world
      << " ranks built: the first of each data and sequence group; the others hold what it holds, ZeRO's uneven "
         "slices aside)\n";
  }
  for (const auto& [ranks, r] : rows) {
    o << "  ranks " << ranks << " model state bytes: params " << static_cast<long long>(r->params) << ", grads "
      << static_cast<long long>(r->grads) << ", optimizer " << static_cast<long long>(r->optimizer) << "\n";
  }
  return o.str();
}

std::string describe_schedule(const Setup& setup) {
  const Config& c = setup.config;
  auto ctx = dist::DistributedContext::planning(setup.mesh, 0);
  FeatureRuntime runtime(c, *ctx, nullptr);
  runtime.install(setup.features);
  std::shared_ptr<StepExecutor> executor = runtime.executor();
  if (!executor) executor = make_sequential_executor();
  const std::int64_t mbs = c.get_int("training.micro_batch_size");
  const std::int64_t gbs = c.get_int("training.global_batch_size");
  const int replicas = role_size(setup.mesh, dist::MeshRole::kReplicate);
  return executor->describe_schedule(static_cast<int>(std::max<std::int64_t>(1, gbs / (replicas * mbs))));
}

}  // namespace hp::plan
