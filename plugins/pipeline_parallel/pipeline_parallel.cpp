// The `pipeline_parallel` feature: split any model's block list into
// `size` stages (x `virtual_stages` chunks per rank), build only this
// rank's blocks, and run a pipeline schedule over the micro-batches.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <map>
#include <sstream>
#include <tuple>
#include <numeric>
#include <optional>

#include "hp/comm/context.h"
#include "hp/comm/flight_recorder.h"
#include "hp/comm/group.h"
#include "hp/comm/mesh.h"
#include "hp/profile/trace.h"
#include "hp/config/config.h"
#include "hp/logging/logging.h"
#include "hp/model/aux_loss.h"
#include "hp/model/model_info.h"
#include "hp/plugin/feature_runtime.h"
#include "hp/plugin/plugin_export.h"
#include "hp/trainer/executor.h"
#include "hp/trainer/training_metrics.h"
#include "plugins/pipeline_parallel/partition.h"
#include "hp/model/weight_grad.h"
#include "plugins/pipeline_parallel/schedule.h"
#include "plugins/pipeline_parallel/stage_link.h"
#include "plugins/pipeline_parallel/zero_bubble.h"

namespace hp::pipeline {

namespace {

const char* kSize = "features.pipeline_parallel.size";
const char* kSchedule = "features.pipeline_parallel.schedule";
const char* kMicro = "features.pipeline_parallel.num_microbatches";
const char* kVirtual = "features.pipeline_parallel.virtual_stages";
const char* kBalance = "features.pipeline_parallel.balance";

/// Per-block costs for balancing: forward FLOPs per token, the loss counted
/// with the last block. A block that declares nothing counts as 1.
std::vector<double> block_costs(std::vector<double> flops, double loss_flops) {
  for (auto& c : flops) c = c > 0 ? c : 1.0;
  if (!flops.empty()) flops.back() += loss_flops;
  return flops;
}

Partition split(std::vector<double> costs, const std::vector<std::int64_t>& balance, int chunks) {
  if (balance.empty()) return partition_balanced(costs, chunks);
  return partition_manual(costs, std::vector<int>(balance.begin(), balance.end()), chunks);
}

Partition split(const ModelDescription& d, const std::vector<std::int64_t>& balance, int chunks) {
  std::vector<double> flops;
  for (const auto& b : d.blocks) flops.push_back(b.cost.flops_per_token);
  return split(block_costs(flops, d.loss_cost.flops_per_token), balance, chunks);
}

/// One (chunk, micro-batch) between its forward and its backward.
struct InFlight {
  Activations inputs;   ///< received (leaves) or the tokens
  Activations outputs;  ///< what was sent on, or the loss input
  at::Tensor loss;      ///< last chunk: the scaled loss to back-propagate
  at::Tensor aux;       ///< other chunks: their scaled auxiliary losses (may be undefined)
};

class PipelineExecutor : public StepExecutor {
 public:
  PipelineExecutor(const Config& c, dist::DistributedContext& d)
      : pp_(d.group("pp")),
        world_(d.group("world")),
        P_(pp_.size()),
        stage_(pp_.rank()),
        kind_(parse_schedule(c.get_string(kSchedule))),
        V_(chunks_per_rank(kind_, static_cast<int>(c.get_int(kVirtual)))),
        placement_(placement_of(kind_)),
        balance_(c.get_int_list(kBalance)),
        link_(pp_, P_ * V_, stage_),
        memory_probe_(std::getenv("HP_PIPELINE_MEMORY_PROBE") != nullptr) {}

  std::vector<int> place(const ModelDescription& desc) override {
    Partition part;
    try {
      part = split(desc, balance_, P_ * V_);
    } catch (const PartitionError& e) {
      throw std::invalid_argument(std::string("pipeline_parallel: ") + e.what());
    }
    if (stage_ == 0 && pp_.global_ranks().front() == 0) {
      log::logger()->info("pipeline: {} stages x {} chunks, schedule {}: {}", P_, V_, to_string(kind_),
                          part.describe());
    }
    std::vector<int> blocks;
    chunk_blocks_.clear();
    int position = 0;
    for (int chunk : chunks_of_rank(placement_, P_, V_, stage_)) {
      std::vector<int> positions;
      for (int b = part.first[chunk]; b < part.first[chunk + 1]; ++b) {
        blocks.push_back(b);
        positions.push_back(position++);
      }
      chunk_blocks_[chunk] = positions;
    }
    return blocks;
  }

  bool computes_loss() const override { return stage_ == peer(P_ * V_ - 1); }

  /// From the schedule's simulation (forward 1, backward 2): this stage's
  /// most chunks in flight, as a share of its V chunks, and its idle time.
  StepShape shape(int micro_batches) const override {
    std::vector<std::vector<Action>> lists;
    for (int r = 0; r < P_; ++r) lists.push_back(make_schedule(kind_, P_, micro_batches, V_, r));
    const Simulation sim = simulate(lists, P_, V_, 1.0, 2.0, placement_);
    StepShape out;
    out.in_flight = static_cast<double>(sim.peak_in_flight.at(static_cast<std::size_t>(stage_))) / V_;
    out.weight_pending = static_cast<double>(sim.peak_weight_pending.at(static_cast<std::size_t>(stage_))) / V_;
    if (sim.deadlock_free) out.idle_fraction = sim.idle_fraction.at(static_cast<std::size_t>(stage_));
    return out;
  }

  /// Every stage's list, and the simulated idle share of each (forward 1,
  /// backward 2; a B and a W 1 each).
  std::string describe_schedule(int micro_batches) const override {
    std::vector<std::vector<Action>> lists;
    for (int r = 0; r < P_; ++r) lists.push_back(make_schedule(kind_, P_, micro_batches, V_, r));
    const Simulation sim = simulate(lists, P_, V_, 1.0, 2.0, placement_);
    const bool split = kind_ == ScheduleKind::kZbH1 || kind_ == ScheduleKind::kZbV;
    std::ostringstream out;
    out << "schedule " << to_string(kind_) << ": " << P_ << " stages, " << micro_batches << " micro-batch"
        << (micro_batches == 1 ? "" : "es") << ", " << V_ << " chunk" << (V_ == 1 ? "" : "s") << " per stage"
        << (placement_ == Placement::kV ? " in a V" : "") << " (F forward, B "
        << (split ? "input gradient, W weight gradient" : "backward") << "; chunk.micro-batch)\n";
    for (int r = 0; r < P_; ++r) {
      out << "  stage " << r << ":";
      for (const Action& a : lists[static_cast<std::size_t>(r)]) out << ' ' << a.str();
      if (sim.deadlock_free) {
        char idle[64];
        std::snprintf(idle, sizeof idle, "  (idle %.1f %%)", 100.0 * sim.idle_fraction[static_cast<std::size_t>(r)]);
        out << idle;
      }
      out << '\n';
    }
    return out.str();
  }

  StepReport run(BuiltModel& m, const StepWork& w) override {
    const int M = static_cast<int>(w.micro_batches);
    const int C = P_ * V_;
    const ActionCosts planned = costs_;
    // A zero-bubble list is a timed plan of the whole pipeline: made once
    // per micro-batch count and costs, not every step.
    const auto key = std::make_tuple(M, planned.b, planned.w);
    if (w.backward && !lists_.count(key)) lists_[key] = make_schedule(kind_, P_, M, V_, stage_, planned);
    const std::vector<Action> actions =
        w.backward ? lists_.at(key) : make_forward_only(P_, M, V_, stage_, placement_);
    c10::AutoGradMode grad_mode(w.backward);
    StepReport rep;
    std::map<std::pair<int, int>, InFlight> live;
    std::size_t peak = 0;
    // Memory probe (benchmarks): reset the kernel's peak-RSS mark so this
    // step's peak growth over its start is what its activations needed.
    double rss_start = 0;
    if (memory_probe_ && w.backward) {
      std::ofstream("/proc/self/clear_refs") << "5";
      rss_start = resident_memory_bytes().first;
    }
    // Every stage's step spans the same window (barriers at both ends), so a
    // stage's idle time includes the bubble at its end too, as in the theory.
    if (w.backward) pp_.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    link_.take_wait_seconds();
    dist::flight::set_where("pipeline stage " + std::to_string(stage_));
    // Receives are posted ahead: on each channel the next message this stage
    // will take, posted again as soon as one is taken, so a peer's message
    // lands while this stage computes.
    using Expected = std::pair<int, MessageId>;  // peer, message
    std::map<std::pair<int, int>, std::deque<Expected>> upcoming;  // (direction, boundary)
    for (const Action& a : actions) {
      const int c = a.chunk;
      if (a.kind == Action::Kind::kForward && c > 0) {
        upcoming[{0, c - 1}].push_back({peer(c - 1), {Direction::kForward, c - 1, a.mb}});
      } else if (a.kind == Action::Kind::kBackward && c < C - 1) {
        upcoming[{1, c}].push_back({peer(c + 1), {Direction::kBackward, c, a.mb}});
      }
    }
    auto post_front = [&](const std::pair<int, int>& channel) {
      auto& q = upcoming[channel];
      if (!q.empty()) link_.prepost(q.front().first, q.front().second);
    };
    auto taken = [&](const std::pair<int, int>& channel) {
      auto& q = upcoming[channel];
      if (!q.empty()) q.pop_front();
      post_front(channel);
    };
    for (const auto& kv : upcoming) post_front(kv.first);
    // zb_h1: the products' backward split (include/hp/model/weight_grad.h):
    // B queues each chunk and micro-batch's W here, the W action runs it.
    const bool split_backward = (kind_ == ScheduleKind::kZbH1 || kind_ == ScheduleKind::kZbV) && w.backward;
    std::optional<wgrad::SplitForward> split;
    if (split_backward) split.emplace();
    std::map<std::pair<int, int>, wgrad::WeightGradQueue> weights;
    // The third training step of a zero-bubble schedule times its F, B and
    // W (compute only: waits for messages left out); the later steps run
    // the plan made for those costs (RFC 0019, 6.5). Not the first: a
    // MoE's first step took 2.7-3.2 x its later forwards and 1.9-3 x its
    // B (the heap growing to the routing's sizes) but its W as later, so
    // its plan was for B 0.5 F and W 0.25 F where its steps ran B 0.9 F
    // and W 0.65 F (the GPT 4 x 256's first step gave B 1 F, W 0.5 F).
    const bool measure = split_backward && training_steps_ + 1 == kCostStep;
    double spent[3] = {0, 0, 0};
    int counted[3] = {0, 0, 0};
    for (const Action& a : actions) {
      const int c = a.chunk, mb = a.mb;
      const bool fwd = a.kind == Action::Kind::kForward;
      const auto a0 = std::chrono::steady_clock::now();
      const double wait0 = link_.wait_seconds();
      auto account = [&] {
        if (!measure) return;
        const int k = static_cast<int>(a.kind);
        spent[k] += std::chrono::duration<double>(std::chrono::steady_clock::now() - a0).count() -
                    (link_.wait_seconds() - wait0);
        ++counted[k];
      };
      if (a.kind == Action::Kind::kWeight) {
        dist::flight::set_phase(dist::flight::Phase::kBackward, mb, c);
        profile::Span span("compute", "weight");
        if (span.active()) span.arg("mb", mb).arg("chunk", c).arg("stage", stage_).arg("action", a.str());
        auto it = weights.find({c, mb});
        if (it == weights.end()) {
          throw std::logic_error("internal error: W of chunk " + std::to_string(c) + " micro-batch " +
                                 std::to_string(mb) + " before its B, please report");
        }
        it->second.run(w.weight_ready);
        weights.erase(it);
        account();
        continue;
      }
      dist::flight::set_phase(!w.backward ? dist::flight::Phase::kEval
                              : fwd       ? dist::flight::Phase::kForward
                                          : dist::flight::Phase::kBackward,
                              mb, c);
      profile::Span span(!w.backward ? "eval" : "compute", fwd ? "forward" : "backward");
      if (span.active()) {
        span.arg("mb", mb).arg("chunk", c).arg("stage", stage_).arg("action", a.str());
      }
      if (a.kind == Action::Kind::kForward) {
        DropoutSiteGuard site(dropout_site(w, mb));
        InFlight st;
        if (c == 0) {
          st.inputs = w.batch(mb).inputs;
        } else {
          st.inputs = link_.recv(peer(c - 1), {Direction::kForward, c - 1, mb});
          taken({0, c - 1});
          if (w.backward) {
            for (auto& item : st.inputs) {
              if (item.value().is_floating_point()) item.value().requires_grad_(true);
            }
          }
        }
        Activations x;
        std::optional<AuxLossScope> aux_scope;  // training steps only, not evaluation
        if (w.backward) aux_scope.emplace();
        x = st.inputs;
        for (int pos : chunk_blocks_.at(c)) x = m.blocks[static_cast<std::size_t>(pos)]->forward(x);
        at::Tensor aux = aux_scope ? take_aux_losses(*aux_scope, w.loss_scale, rep) : at::Tensor();
        if (c == C - 1) {
          // Only one stage reads the targets, once per micro-batch (with one
          // stage, the batch is built twice: cheap, and no cache to keep).
          auto lo = m.loss->forward(x, w.batch(mb).targets);
          rep.loss_sum += lo.sum.item<double>();
          rep.tokens += static_cast<double>(lo.count);
          if (w.after_forward) w.after_forward();
          if (w.backward) st.loss = aux.defined() ? lo.sum * w.loss_scale + aux : lo.sum * w.loss_scale;
        } else {
          link_.send(x, peer(c + 1), {Direction::kForward, c, mb});
          if (w.backward) st.aux = aux;
        }
        if (w.backward) {
          st.outputs = std::move(x);
          live[{c, mb}] = std::move(st);
          peak = std::max(peak, live.size());
        }
      } else {
        auto it = live.find({c, mb});
        if (it == live.end()) {
          throw std::logic_error("internal error: backward of chunk " + std::to_string(c) + " micro-batch " +
                                 std::to_string(mb) + " before its forward, please report");
        }
        InFlight& st = it->second;
        std::optional<wgrad::Collect> collect;
        if (split_backward) collect.emplace();
        if (c == C - 1) {
          st.loss.backward();
        } else {
          Activations grads = link_.recv(peer(c + 1), {Direction::kBackward, c, mb});
          taken({1, c});
          std::vector<at::Tensor> outs, gs;
          for (const auto& item : st.outputs) {
            const at::Tensor& t = item.value();
            if (!t.is_floating_point()) continue;
            const at::Tensor* g = grads.find(item.key());
            if (t.requires_grad() && g) {
              outs.push_back(t);
              gs.push_back(*g);
            }
          }
          if (st.aux.defined() && st.aux.requires_grad()) {
            outs.push_back(st.aux);
            gs.push_back(at::ones_like(st.aux));
          }
          if (!outs.empty()) torch::autograd::backward(outs, gs);
        }
        if (collect) weights[{c, mb}] = collect->take();
        if (c > 0) {
          Activations in_grads;
          for (const auto& item : st.inputs) {
            const at::Tensor& t = item.value();
            if (!t.is_floating_point()) continue;
            at::Tensor g = t.grad();
            in_grads.insert(item.key(), g.defined() ? g : at::zeros_like(t));
          }
          link_.send(in_grads, peer(c - 1), {Direction::kBackward, c - 1, mb});
        }
        live.erase(it);
      }
      account();
      link_.reap();
    }
    if (!weights.empty()) {
      throw std::logic_error("internal error: " + std::to_string(weights.size()) +
                             " weight gradients left unrun at the step's end, please report");
    }
    link_.wait_all();
    double wait = link_.take_wait_seconds();
    if (w.backward) {
      const auto tb = std::chrono::steady_clock::now();
      pp_.barrier();
      wait += std::chrono::duration<double>(std::chrono::steady_clock::now() - tb).count();
    }
    const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (w.backward) {
      const double growth = memory_probe_ ? resident_memory_bytes().second - rss_start : 0.0;
      rep.figures["pipeline_wait_seconds"] = wait;
      rep.figures["pipeline_compute_seconds"] = total - wait;
      rep.figures["pipeline_idle_fraction"] = total > 0 ? wait / total : 0.0;
      rep.figures["pipeline_peak_in_flight"] = static_cast<double>(peak);
      rep.figures["pipeline_headers_sent"] = static_cast<double>(link_.headers_sent());
      if (memory_probe_) rep.figures["pipeline_step_memory_growth_bytes"] = growth;
      // Every stage's figures, so the first stage's metrics show the whole pipeline.
      at::Tensor mine = at::tensor({total > 0 ? wait / total : 0.0, static_cast<double>(peak), growth}, at::kDouble);
      auto all = pp_.all_gather(mine.unsqueeze(0), 0);
      if (measure) {
        // Every rank must run the same plan, not only this pipeline's
        // stages: ranks of other pipelines share tensor, sequence and
        // expert groups with them, whose collectives would otherwise meet
        // in another order. So the costs are summed over the world (every
        // rank gets the same sum), and B and W rounded to quarters of F.
        auto mean = [&](int k) { return counted[k] ? spent[k] / counted[k] : 0.0; };
        at::Tensor sums = at::tensor({mean(0), mean(1), mean(2)}, at::kDouble);
        world_.all_reduce(sums);
        const double f = sums[0].item<double>(), b = sums[1].item<double>(), wt = sums[2].item<double>();
        auto quarter = [&](double x) { return f > 0 ? std::max(0.25, std::round(4 * x / f) / 4) : 1.0; };
        costs_ = ActionCosts{1.0, quarter(b), quarter(wt)};
        if (stage_ == 0 && pp_.global_ranks().front() == 0) {
          log::logger()->info("pipeline: {} planned from step {}'s measured costs: B {:.2f} F, W {:.2f} F",
                              to_string(kind_), kCostStep, costs_.b, costs_.w);
        }
      }
      if (split_backward) {
        rep.figures["pipeline_plan_b_over_f"] = planned.b;
        rep.figures["pipeline_plan_w_over_f"] = planned.w;
      }
      rep.figures["pipeline_idle_fraction_simulated"] = simulated_idle(M, planned);
      for (int s = 0; s < P_; ++s) {
        const std::string tag = "_stage" + std::to_string(s);
        rep.figures["pipeline_idle_fraction" + tag] = all[s][0].item<double>();
        rep.figures["pipeline_peak_in_flight" + tag] = all[s][1].item<double>();
        if (memory_probe_) rep.figures["pipeline_step_memory_growth_bytes" + tag] = all[s][2].item<double>();
      }
      ++training_steps_;
    }
    return rep;
  }

 private:
  /// The pipeline's idle share (mean over stages) that the simulator gives
  /// the lists of a step: at the planned F, B and W for zb_h1 and zbv
  /// (their plan's own timing), at forward 1 and backward 2 otherwise.
  double simulated_idle(int M, const ActionCosts& c) {
    const auto key = std::make_tuple(M, c.b, c.w);
    auto it = simulated_.find(key);
    if (it != simulated_.end()) return it->second;
    double idle = 0;
    if (kind_ == ScheduleKind::kZbH1 || kind_ == ScheduleKind::kZbV) {
      idle = zb::plan(kind_ == ScheduleKind::kZbV ? zb::Scheme::kZbV : zb::Scheme::kZbH1, P_, M, {c.f, c.b, c.w})
                 .idle();
    } else {
      std::vector<std::vector<Action>> lists;
      for (int r = 0; r < P_; ++r) lists.push_back(make_schedule(kind_, P_, M, V_, r));
      const Simulation sim = simulate(lists, P_, V_, 1.0, 2.0, placement_);
      for (double f : sim.idle_fraction) idle += f / P_;
    }
    return simulated_[key] = idle;
  }

  /// The stage that runs chunk `c`.
  int peer(int c) const { return rank_of_chunk(placement_, P_, V_, c); }

  dist::Group& pp_;
  dist::Group& world_;
  int P_, stage_;
  ScheduleKind kind_;
  int V_;
  Placement placement_;
  /// The training step (1-based, of this executor) whose F, B and W the
  /// zero-bubble plans are made for.
  static constexpr int kCostStep = 3;
  ActionCosts costs_;            ///< what zb_h1 and zbv plan for
  int training_steps_ = 0;  ///< training steps run
  std::map<std::tuple<int, double, double>, double> simulated_;  ///< (M, B, W) -> simulated idle
  std::map<std::tuple<int, double, double>, std::vector<Action>> lists_;  ///< (M, B, W) -> this stage's list
  std::vector<std::int64_t> balance_;
  StageLink link_;
  bool memory_probe_;
  std::map<int, std::vector<int>> chunk_blocks_;  // chunk -> positions in the built model
};

class PipelineParallelFeature : public Feature {
 public:
  void declare_options(Schema& s, const std::string& prefix) const override {
    s.add_int(prefix + "size", 2).range(1, 1024)
        .describe("Pipeline stages (the pp mesh dimension); each builds a contiguous run of blocks.");
    s.add_enum(prefix + "schedule", "1f1b", {"gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "zbv"})
        .describe("Order of forwards and backwards: gpipe (all forwards, then all backwards), 1f1b "
                  "(one forward one backward after a warm-up), interleaved_1f1b (virtual_stages chunks per rank), "
                  "zb_h1 (zero-bubble H1: each backward split into B, the input's gradient, and W, the weights', "
                  "with the W's filling the bubble at 1f1b's activation memory; fp32 products, embeddings and norms are split, "
                  "the packed expert products and bf16 products keep W in B), "
                  "zbv (zero-bubble V: as zb_h1 with two chunks per rank in a V, rank r running chunks r and "
                  "2 x size - 1 - r, so the first stage also runs the last chunk and the loss).");
    s.add_int(prefix + "num_microbatches", 0).range(0, 1e6)
        .describe("Micro-batches per step and data-parallel rank; 0 takes global_batch_size / "
                  "(micro_batch_size x dp), and any other value must equal it.");
    s.add_int(prefix + "virtual_stages", 1).range(1, 64)
        .describe("Model chunks per rank (interleaved_1f1b): chunk c runs on stage c mod size; zbv always "
                  "runs 2 (in a V) and takes 1 or 2 here.");
    s.add_int_list(prefix + "balance", {}).at_least(1).or_word("auto")
        .describe("Blocks per chunk in model order (size x chunks per rank entries), or auto: "
                  "contiguous chunks whose costliest is as light as possible, from the blocks' cost estimates.");
  }

  void validate(const FeatureContext& ctx, ConfigErrors& e) const override {
    const Config& c = ctx.config;
    if (!c.ok({kSize, kSchedule, kMicro, kVirtual, kBalance})) return;
    const int P = static_cast<int>(c.get_int(kSize));
    const int V = static_cast<int>(c.get_int(kVirtual));
    const std::string schedule = c.get_string(kSchedule);
    if (c.world_size() % P != 0) {
      e.add(kSize, std::to_string(P), "must divide the world size " + std::to_string(c.world_size()),
            "a divisor of " + std::to_string(c.world_size()));
      return;
    }
    if (schedule == "zbv" && V > 2) {
      e.add(kVirtual, std::to_string(V), "schedule zbv runs two chunks per rank in a V", "1 or 2 (both mean the V)");
    } else if (V > 1 && schedule != "interleaved_1f1b" && schedule != "zbv") {
      e.add(kVirtual, std::to_string(V), "more than one chunk per rank needs schedule interleaved_1f1b (schedule is " +
                                             schedule + ")", "1, or set schedule: interleaved_1f1b");
    }
    const int chunks = P * chunks_per_rank(parse_schedule(schedule), V);
    const int dp = ctx.mesh.replicas;
    if (dp > 0 && c.ok({"training.global_batch_size", "training.micro_batch_size"})) {
      const auto G = c.get_int("training.global_batch_size"), mbs = c.get_int("training.micro_batch_size");
      if (G % (mbs * dp) == 0) {
        const auto M = G / (mbs * dp);
        const auto given = c.get_int(kMicro);
        if (given != 0 && given != M) {
          e.add(kMicro, std::to_string(given),
                "must equal global_batch_size / (micro_batch_size x dp) = " + std::to_string(G) + " / (" +
                    std::to_string(mbs) + " x " + std::to_string(dp) + ") = " + std::to_string(M),
                "0 or " + std::to_string(M));
        }
        if (schedule == "interleaved_1f1b" && V > 1 && M % P != 0) {
          e.add(kSchedule, schedule,
                "interleaved_1f1b needs the micro-batches per step (" + std::to_string(M) +
                    ") to be a multiple of size (" + std::to_string(P) + ")",
                "gpipe or 1f1b, or a batch with a multiple of " + std::to_string(P) + " micro-batches");
        }
      }
    }
    // zbv's V puts the first and the last chunk (the embedding and the
    // head) on stage 0: a tied weight stays on one stage.
    if (P > 1 && schedule != "zbv" && !ctx.model.shared_parameter_key.empty()) {
      e.add(ctx.model.shared_parameter_key, "true",
            "tied embeddings across pipeline stages are not supported yet (the embedding and the head live "
            "on different stages; under schedule zbv both live on stage 0)",
            "false when features.pipeline_parallel.size > 1, or features.pipeline_parallel.schedule: zbv");
    }
    // The model's blocks are split here, before any process starts, from
    // the costs it declares.
    if (!ctx.model.block_flops.empty()) {
      try {
        split(block_costs(ctx.model.block_flops, ctx.model.loss_flops), c.get_int_list(kBalance), chunks);
      } catch (const PartitionError& err) {
        const auto& b = c.get_int_list(kBalance);
        e.add(kBalance, b.empty() ? "auto" : hp::to_string(c.value(kBalance)), err.what(),
              "auto, or " + std::to_string(chunks) + " counts >= 1 adding up to the model's blocks");
      }
    }
  }

  void plan_mesh(const Config& c, dist::MeshPlan& plan) const override {
    plan.claim("pp", static_cast<int>(c.get_int(kSize)), "pipeline_parallel", dist::MeshRole::kPartition);
  }

  void install(FeatureRuntime& rt) override {
    rt.set_executor("pipeline_parallel", std::make_shared<PipelineExecutor>(rt.config(), rt.dist()));
  }
};

}  // namespace
}  // namespace hp::pipeline

HP_FEATURE_PLUGIN(hp::pipeline::PipelineParallelFeature)
