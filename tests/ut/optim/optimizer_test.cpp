// The optimizer collaborator against torch::optim, the learning-rate
// schedule, and the zero feature's sharded optimizer and reducer against the
// unsharded ones on real Gloo ranks (loaded as the plugin, through the
// runtime's extension points).
#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <torch/torch.h>

#include "hp/comm/context.h"
#include "hp/comm/group.h"
#include "hp/model/extensions.h"
#include "hp/model/layers.h"
#include "hp/config/config.h"
#include "hp/optim/grad_sync.h"
#include "hp/optim/optimizer.h"
#include "framework/optim/sum_squares.h"
#include "hp/plugin/feature_runtime.h"
#include "framework/runtime/setup.h"
#include "tests/support/multi_rank.h"

namespace {

std::vector<hp::ParamEntry> make_params(std::uint64_t seed) {
  std::vector<hp::ParamEntry> out;
  auto gen = torch::make_generator<at::CPUGeneratorImpl>(seed);
  for (auto shape : std::vector<std::vector<std::int64_t>>{{5, 3}, {4}, {2, 7}}) {
    hp::ParamEntry e;
    e.spec.name = "p" + std::to_string(out.size());
    e.spec.global_shape = shape;
    e.tensor = torch::randn(shape, gen).requires_grad_(true);
    out.push_back(e);
  }
  return out;
}

/// Gradients for step `step`, the same for both optimizers.
void set_grads(const std::vector<hp::ParamEntry>& params, int step, std::uint64_t salt = 0) {
  for (std::size_t i = 0; i < params.size(); ++i) {
    auto gen = torch::make_generator<at::CPUGeneratorImpl>(100 * step + i + salt);
    params[i].tensor.mutable_grad() = torch::randn(params[i].tensor.sizes(), gen);
  }
}

double max_rel(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a - b).abs().max() / (b.abs().max() + 1e-12)).item<double>();
}

void expect_like_torch(hp::OptimizerOptions o, torch::optim::Optimizer& ref, std::vector<torch::Tensor>& ref_params,
                       double lr) {
  auto ours = make_params(3);
  for (std::size_t i = 0; i < ours.size(); ++i) {
    torch::NoGradGuard g;
    ref_params[i].copy_(ours[i].tensor);
  }
  auto opt = hp::make_optimizer(o, ours);
  for (int step = 1; step <= 10; ++step) {
    std::vector<hp::ParamEntry> theirs;
    for (auto& t : ref_params) theirs.push_back({{}, t});
    set_grads(ours, step);
    set_grads(theirs, step);
    opt->step(lr);
    ref.step();
  }
  for (std::size_t i = 0; i < ours.size(); ++i) {
    EXPECT_LE(max_rel(ours[i].tensor.detach(), ref_params[i].detach()), 1e-6) << ours[i].spec.name;
  }
  EXPECT_EQ(opt->steps_taken(), 10);
}

std::vector<torch::Tensor> leaves() {
  std::vector<torch::Tensor> out;
  for (auto& p : make_params(3)) out.push_back(p.tensor.detach().clone().requires_grad_(true));
  return out;
}

}  // namespace

TEST(Optimizer, SgdWithMomentumMatchesTorch) {
  auto p = leaves();
  torch::optim::SGD ref(p, torch::optim::SGDOptions(0.05).momentum(0.9).weight_decay(0.01));
  hp::OptimizerOptions o;
  o.kind = hp::OptimizerKind::kSgd;
  o.momentum = 0.9;
  o.weight_decay = 0.01;
  expect_like_torch(o, ref, p, 0.05);
}

TEST(Optimizer, AdamMatchesTorch) {
  auto p = leaves();
  torch::optim::Adam ref(p, torch::optim::AdamOptions(1e-2).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.1));
  hp::OptimizerOptions o;
  o.kind = hp::OptimizerKind::kAdam;
  o.beta2 = 0.95;
  o.weight_decay = 0.1;
  expect_like_torch(o, ref, p, 1e-2);
}

TEST(Optimizer, AdamWMatchesTorch) {
  auto p = leaves();
  torch::optim::AdamW ref(p, torch::optim::AdamWOptions(1e-2).betas({0.9, 0.999}).eps(1e-8).weight_decay(0.1));
  hp::OptimizerOptions o;
  o.kind = hp::OptimizerKind::kAdamW;
  o.weight_decay = 0.1;
  expect_like_torch(o, ref, p, 1e-2);
}

// The one-pass Adam(W) update (contiguous float tensors) against the same
// update as tensor operations (taken by strided tensors), over sizes around
// its chunk boundary, for both kinds with weight decay: bitwise equal after
// 5 steps (it rounds as LibTorch's kernels do), at 1 and at 2 threads.
TEST(Optimizer, FusedAdamMatchesTheTensorOperationsAndDoesNotDependOnThreads) {
  for (auto kind : {hp::OptimizerKind::kAdam, hp::OptimizerKind::kAdamW}) {
    hp::OptimizerOptions o;
    o.kind = kind;
    o.weight_decay = 0.1;
    o.beta2 = 0.95;
    for (std::int64_t cols : {1, 333, 32768, 70001}) {
      auto gen = torch::make_generator<at::CPUGeneratorImpl>(11 + cols);
      const auto p0 = torch::randn({3, cols}, gen);
      // Fused at 1 and at 2 threads; tensor operations on a transposed
      // (non-contiguous) copy of the same numbers.
      auto p1 = p0.clone(), p2 = p0.clone(), pt = p0.t().contiguous().t();
      ASSERT_EQ(pt.is_contiguous(), cols == 1) << "the reference must take the strided path";
      std::vector<torch::Tensor> s1{torch::zeros_like(p0), torch::zeros_like(p0)}, s2 = {s1[0].clone(), s1[1].clone()};
      std::vector<torch::Tensor> st{torch::zeros_like(pt), torch::zeros_like(pt)};
      const int threads = at::get_num_threads();
      for (int step = 1; step <= 5; ++step) {
        const auto g = torch::randn({3, cols}, gen);
        at::set_num_threads(1);
        hp::apply_update(o, step, 1e-2, p1, g, s1);
        at::set_num_threads(2);
        hp::apply_update(o, step, 1e-2, p2, g, s2);
        hp::apply_update(o, step, 1e-2, pt, g.t().contiguous().t(), st);
      }
      at::set_num_threads(threads);
      EXPECT_TRUE(torch::equal(p1, p2)) << "cols " << cols << ": the thread count changed the update";
      EXPECT_TRUE(torch::equal(s1[1], s2[1])) << "cols " << cols;
      if (cols == 1) continue;  // both took the fused path
      EXPECT_TRUE(torch::equal(p1, pt)) << "cols " << cols << ": max rel " << max_rel(p1, pt);
      EXPECT_TRUE(torch::equal(s1[0], st[0])) << "cols " << cols << ": exp_avg";
      EXPECT_TRUE(torch::equal(s1[1], st[1])) << "cols " << cols << ": exp_avg_sq";
    }
  }
}

TEST(Optimizer, StateIsNamedByKindAndParameter) {
  auto params = make_params(1);
  hp::OptimizerOptions o;
  auto opt = hp::make_optimizer(o, params);
  auto st = opt->state();
  ASSERT_EQ(st.size(), 6u);
  EXPECT_EQ(st[0].spec.name, "exp_avg/p0");
  EXPECT_EQ(st[1].spec.name, "exp_avg_sq/p0");
  EXPECT_EQ(opt->state_bytes(), 2 * (15 + 4 + 14) * 4);
  o.kind = hp::OptimizerKind::kSgd;
  EXPECT_TRUE(hp::make_optimizer(o, params)->state().empty()) << "plain SGD keeps no state";
}

// The gradient norm's one-pass sum of squares: within double rounding of
// the double-precision reference at sizes around its chunk and unroll
// boundaries, on a strided view, the same bits at 1 and 2 threads, and
// other dtypes through the reference path.
TEST(SumOfSquares, MatchesTheDoubleReferenceAndDoesNotDependOnThreads) {
  auto gen = torch::make_generator<at::CPUGeneratorImpl>(5);
  for (std::int64_t n : {0, 1, 7, 8, 9, 65535, 65536, 65537, 200003, 1 << 20}) {
    auto x = torch::randn({n}, gen) * 3;
    const double ref = x.to(torch::kDouble).pow(2).sum().item<double>();
    const int threads = at::get_num_threads();
    at::set_num_threads(1);
    const double one = hp::sum_of_squares(x);
    at::set_num_threads(2);
    const double two = hp::sum_of_squares(x);
    at::set_num_threads(threads);
    EXPECT_NEAR(one, ref, 1e-12 * std::max(1.0, ref)) << "n = " << n;
    EXPECT_EQ(one, two) << "n = " << n << ": the thread count changed the sum";
  }
  auto m = torch::randn({300, 500}, gen);
  const double mref = m.to(torch::kDouble).pow(2).sum().item<double>();
  EXPECT_NEAR(hp::sum_of_squares(m.t()), mref, 1e-12 * mref) << "a transposed view";
  auto d = torch::randn({1000}, gen).to(torch::kDouble);
  EXPECT_DOUBLE_EQ(hp::sum_of_squares(d), d.pow(2).sum().item<double>()) << "double input";
}

TEST(LearningRate, WarmupThenCosineToTheFloor) {
  hp::ScheduleOptions s;
  s.lr = 1.0;
  s.min_lr = 0.1;
  s.warmup_steps = 4;
  s.max_steps = 14;
  EXPECT_DOUBLE_EQ(hp::learning_rate(s, 0), 0.25);
  EXPECT_DOUBLE_EQ(hp::learning_rate(s, 3), 1.0);
  EXPECT_DOUBLE_EQ(hp::learning_rate(s, 4), 1.0);
  EXPECT_NEAR(hp::learning_rate(s, 9), 0.1 + 0.45 * (1 + std::cos(M_PI * 0.5)), 1e-12);
  EXPECT_NEAR(hp::learning_rate(s, 14), 0.1, 1e-12);
  EXPECT_NEAR(hp::learning_rate(s, 20), 0.1, 1e-12) << "stays at the floor past max_steps";
  s.cosine = false;
  EXPECT_DOUBLE_EQ(hp::learning_rate(s, 1), 0.5);
  EXPECT_DOUBLE_EQ(hp::learning_rate(s, 9), 1.0);
}

// ---- zero: the plugin through the runtime's collaborator slots ---------------

namespace {

hp::Setup zero_setup() {
  return hp::prepare(hp::RawConfig::parse_string("data: {type: synthetic}\nfeatures: {zero: {enabled: true}}\n", "z"),
                     1);
}

/// Parameters of one rank of a (dp, tp) mesh: p0 split over tp on dim 1,
/// p1 whole, p2 split over tp on dim 0 (uneven), p3 a bias summed over tp
/// then dp (sequence parallel's replicated parameters).
std::vector<hp::ParamEntry> mesh_params(hp::dist::DistributedContext& d) {
  std::vector<hp::ParamEntry> out;
  const int T = d.group("tp").size(), t = d.group("tp").rank();
  auto full = [](std::vector<std::int64_t> shape, std::uint64_t seed) {
    return torch::randn(shape, torch::make_generator<at::CPUGeneratorImpl>(seed));
  };
  auto add = [&](const std::string& name, torch::Tensor whole, int dim, std::vector<std::string> sync) {
    hp::ParamEntry e;
    e.spec.name = name;
    e.spec.global_shape = whole.sizes().vec();
    torch::Tensor local = whole;
    if (dim >= 0 && T > 1) {
      auto [off, len] = hp::split_range(whole.size(dim), T, t);
      e.spec.placements = {{"tp", hp::dist::Placement::shard(dim)}};
      e.spec.box = {std::vector<std::int64_t>(e.spec.global_shape.size(), 0), e.spec.global_shape};
      e.spec.box.offsets[static_cast<std::size_t>(dim)] = off;
      e.spec.box.lengths[static_cast<std::size_t>(dim)] = len;
      local = whole.narrow(dim, off, len);
    }
    e.spec.grad = e.spec.placements;
    for (const auto& g : sync) e.spec.grad.push_back({g, hp::dist::Placement::partial()});
    e.tensor = local.clone().requires_grad_(true);
    out.push_back(e);
  };
  add("p0", full({6, 8}, 1), 1, {"dp"});
  add("p1", full({5}, 2), -1, {"dp"});
  add("p2", full({7, 3}, 3), 0, {"dp"});
  add("p3", full({9}, 4), -1, {"tp", "dp"});
  return out;
}

}  // namespace

// The bucketed reducer's gradients are views of one flat tensor per bucket
// (written in place by backward's accumulation and reduced in place); a
// gradient something replaced since is still reduced (copied), and both
// give the same sums, bitwise, at dp=2 and tp=2 x dp=2.
TEST(GradReducer, BucketsAreViewsReducedInPlaceAndAReplacedGradientStillCounts) {
  for (auto mesh : {hp::test::grid(1, 2, 1), hp::test::grid(1, 2, 2)}) {
    hp::test::run_ranks(mesh, [&](hp::dist::DistributedContext& d) {
      auto viewed = mesh_params(d);
      auto replaced = mesh_params(d);
      auto red_v = hp::make_bucketed_reducer({1 << 20}, viewed, d);
      auto red_r = hp::make_bucketed_reducer({1 << 20}, replaced, d);
      // p0, p1 and p2 share the dp list: one bucket, so one storage.
      for (std::size_t i = 1; i < 3; ++i) {
        EXPECT_TRUE(viewed[i].tensor.grad().storage().is_alias_of(viewed[0].tensor.grad().storage()))
            << viewed[i].spec.name << " is not a view of its bucket";
      }
      set_grads(replaced, 1, static_cast<std::uint64_t>(1000 * d.rank()));  // new tensors
      std::vector<const void*> where;
      for (std::size_t i = 0; i < viewed.size(); ++i) {
        torch::NoGradGuard g;
        viewed[i].tensor.mutable_grad().copy_(replaced[i].tensor.grad());  // in place
        where.push_back(viewed[i].tensor.grad().data_ptr());
      }
      red_v->reduce();
      red_r->reduce();
      for (std::size_t i = 0; i < viewed.size(); ++i) {
        EXPECT_TRUE(torch::equal(viewed[i].tensor.grad(), replaced[i].tensor.grad())) << viewed[i].spec.name;
        EXPECT_EQ(viewed[i].tensor.grad().data_ptr(), where[i]) << viewed[i].spec.name << " was not reduced in place";
      }
      // The sums are over dp (and tp first for p3): rank 0's p1 gradient
      // is the sum of every dp replica's.
      torch::Tensor expect = torch::zeros({5});
      for (int r = 0; r < d.world_size(); ++r) {
        if (r % d.group("tp").size() != d.rank() % d.group("tp").size()) continue;
        expect += torch::randn({5}, torch::make_generator<at::CPUGeneratorImpl>(100 + 1 + 1000 * r));
      }
      EXPECT_LE(max_rel(viewed[1].tensor.grad(), expect), 1e-6) << "p1 on rank " << d.rank();
    });
  }
}

TEST(Zero, ShardedStepEqualsTheUnshardedStepAtDp2AndDp2Tp2) {
  for (auto mesh : {hp::test::grid(1, 2, 1), hp::test::grid(1, 2, 2), hp::test::grid(1, 4, 1)}) {
    static hp::Setup setup = zero_setup();
    ASSERT_EQ(setup.features.size(), 1u);
    hp::test::run_ranks(mesh, [&](hp::dist::DistributedContext& d) {
      auto ref = mesh_params(d);
      auto ours = mesh_params(d);
      hp::OptimizerOptions o;
      o.weight_decay = 0.1;
      auto ref_opt = hp::make_optimizer(o, ref);
      auto ref_red = hp::make_bucketed_reducer({64}, ref, d);
      hp::FeatureRuntime rt(setup.config, d);
      rt.install(setup.features);
      EXPECT_EQ(rt.owner_of("optimizer"), "zero");
      EXPECT_EQ(rt.owner_of("gradient reducer"), "zero");
      auto opt = rt.optimizer_factory()(o, ours, d);
      auto red = rt.grad_reducer_factory()(hp::ReducerOptions{64}, ours, d);
      for (int step = 1; step <= 3; ++step) {
        set_grads(ref, step, static_cast<std::uint64_t>(1000 * d.rank()));
        set_grads(ours, step, static_cast<std::uint64_t>(1000 * d.rank()));
        ref_red->reduce();
        red->reduce();
        const double ref_norm = ref_red->clip(1.0);
        const double norm = red->clip(1.0);
        EXPECT_NEAR(norm, ref_norm, 1e-6 * ref_norm) << "global norm at step " << step;
        ref_opt->step(1e-2);
        opt->step(1e-2);
      }
      for (std::size_t i = 0; i < ref.size(); ++i) {
        EXPECT_LE(max_rel(ours[i].tensor.detach(), ref[i].tensor.detach()), 1e-6) << ref[i].spec.name << " on rank "
                                                                                    << d.rank();
      }
      // Each replica keeps about 1/dp of the state; slices are ranges of
      // the global tensor, named as the unsharded state is.
      const double share = static_cast<double>(opt->state_bytes()) / static_cast<double>(ref_opt->state_bytes());
      EXPECT_NEAR(share, 1.0 / d.group("dp").size(), 0.15) << mesh.shape();
      auto st = opt->state();
      ASSERT_EQ(st.size(), ref_opt->state().size());
      EXPECT_EQ(st[0].spec.name, "exp_avg/p0");
      if (d.group("dp").size() > 1) {
        // p0: a tp slice along dimension 1 cut again along it; whole (tp=1) along dimension 0.
        EXPECT_EQ(hp::dist::describe(st[0].spec.placements), d.group("tp").size() > 1 ? "tp:S(1) dp:S(1)" : "dp:S(0)");
        EXPECT_EQ(hp::dist::describe(st[2].spec.placements), "dp:S(0)") << "a whole parameter is cut along dimension 0";
      }
    });
  }
}

// The reduced gradients the zero reducer reports reassemble (through their
// ShardSpecs) into the unsharded reducer's.
TEST(Zero, ReportedGradientSlicesTileTheFullGradient) {
  static hp::Setup setup = zero_setup();
  hp::test::run_ranks(hp::test::grid(1, 2, 1), [&](hp::dist::DistributedContext& d) {
    auto ref = mesh_params(d);
    auto ours = mesh_params(d);
    hp::FeatureRuntime rt(setup.config, d);
    rt.install(setup.features);
    hp::OptimizerOptions o;
    auto opt = rt.optimizer_factory()(o, ours, d);
    auto red = rt.grad_reducer_factory()(hp::ReducerOptions{1 << 20}, ours, d);
    auto ref_red = hp::make_bucketed_reducer({1 << 20}, ref, d);
    set_grads(ref, 1, static_cast<std::uint64_t>(d.rank()));
    set_grads(ours, 1, static_cast<std::uint64_t>(d.rank()));
    ref_red->reduce();
    red->reduce();
    auto grads = red->gradients();
    ASSERT_EQ(grads.size(), ref.size());
    for (std::size_t i = 0; i < grads.size(); ++i) {
      const auto& s = grads[i].spec;
      // The slice of the full (unsharded, all tp ranks identical here) gradient.
      auto expect = hp::dist::slice_of(ref[i].tensor.grad(), [&] {
        auto b = s.box;
        for (const auto& p : ref[i].spec.placements) {  // tp's cut is already in the local tensor
          b.offsets[static_cast<std::size_t>(p.placement.dim)] -= ref[i].spec.box.offsets[static_cast<std::size_t>(p.placement.dim)];
        }
        return b;
      }());
      EXPECT_TRUE(torch::allclose(grads[i].tensor, expect, 1e-6, 1e-7)) << s.name;
    }
  });
}

// Stage 3's just-in-time gathers, driven as the trainer drives them (the
// step-begin hook, the block observer, the reduction): a step starts with
// every sharded parameter's storage released (0 bytes counted) and the
// slices kept; before block b's forward its parameters come back whole,
// bitwise the values they had, and the next block's gather is already
// issued (prefetch 1: one more all_gather than the block needed); after
// the forward the block's storage is released again; the reduction
// releases everything; a save gathers every parameter back.
TEST(Zero, Stage3GathersJustInTimePrefetchesTheNextBlockAndReleasesWhatItGathered) {
  static hp::Setup setup = hp::prepare(
      hp::RawConfig::parse_string("data: {type: synthetic}\nfeatures: {zero: {enabled: true, stage: 3}}\n", "z"), 1);
  hp::test::run_ranks(hp::test::grid(1, 2, 1), [&](hp::dist::DistributedContext& d) {
    auto ours = mesh_params(d);
    for (std::size_t i = 0; i < ours.size(); ++i) ours[i].block = static_cast<int>(i);  // one parameter a block
    std::vector<torch::Tensor> whole;
    for (const auto& p : ours) whole.push_back(p.tensor.detach().clone());
    hp::FeatureRuntime rt(setup.config, d);
    rt.install(setup.features);
    hp::OptimizerOptions o;
    auto opt = rt.optimizer_factory()(o, ours, d);
    auto red = rt.grad_reducer_factory()(hp::ReducerOptions{1 << 20}, ours, d);
    hp::BuildContext ctx(setup.config, d, hp::LayerRegistry::dense(), 1);
    rt.model().apply_to(ctx);
    ASSERT_EQ(ctx.block_observers().size(), 1u);
    const auto& watch = ctx.block_observers()[0];
    auto held = [&] {
      std::vector<std::size_t> n;
      for (const auto& p : ours) n.push_back(p.tensor.storage().nbytes());
      return n;
    };
    auto gathers = [&] {
      const auto& st = d.group("dp").stats();
      auto it = st.find("all_gather");
      return it == st.end() ? std::uint64_t{0} : it->second.calls;
    };
    std::map<std::string, double> figures;
    hp::StepContext sc;
    sc.figures = &figures;
    rt.run_hooks(hp::StepEvent::kStepBegin, sc);
    for (std::size_t n : held()) EXPECT_EQ(n, 0u) << "released at the step's start";
    const auto before = gathers();
    watch.before(0);
    EXPECT_EQ(gathers() - before, 2u) << "block 0's gather and block 1's (prefetched)";
    EXPECT_EQ(held()[0], static_cast<std::size_t>(whole[0].nbytes()));
    EXPECT_TRUE(torch::equal(ours[0].tensor.detach(), whole[0])) << "gathered back bitwise";
    watch.after(0, hp::Activations(), hp::Activations());
    EXPECT_EQ(held()[0], 0u) << "released after its forward";
    watch.before(1);
    EXPECT_EQ(gathers() - before, 3u) << "block 1 was in flight already; block 2 prefetched";
    EXPECT_TRUE(torch::equal(ours[1].tensor.detach(), whole[1]));
    EXPECT_EQ(held()[0], 0u);
    set_grads(ours, 1, static_cast<std::uint64_t>(d.rank()));
    red->reduce();
    for (std::size_t n : held()) EXPECT_EQ(n, 0u) << "the reduction releases everything";
    red->report(figures);
    EXPECT_EQ(figures.at("zero_block_gathers"), 3.0);
    EXPECT_EQ(figures.at("zero_block_gathers_prefetched"), 1.0);
    rt.run_hooks(hp::StepEvent::kSave, sc);
    for (std::size_t i = 0; i < ours.size(); ++i) {
      EXPECT_TRUE(torch::equal(ours[i].tensor.detach(), whole[i])) << "whole for a save: " << ours[i].spec.name;
    }
  });
}

// A gather that fails (here: rank 1 never joins it, so rank 0's times out)
// is one line naming the block, its first parameter and the rank, then
// the collective's own words.
TEST(Zero, Stage3AFailedGatherNamesTheBlockAndTheRank) {
  static hp::Setup setup = hp::prepare(
      hp::RawConfig::parse_string("data: {type: synthetic}\nfeatures: {zero: {enabled: true, stage: 3}}\n", "z"), 1);
  hp::test::run_ranks(
      hp::test::grid(1, 2, 1),
      [&](hp::dist::DistributedContext& d) {
        auto ours = mesh_params(d);
        for (std::size_t i = 0; i < ours.size(); ++i) ours[i].block = static_cast<int>(i) + 3;
        hp::FeatureRuntime rt(setup.config, d);
        rt.install(setup.features);
        auto opt = rt.optimizer_factory()(hp::OptimizerOptions{}, ours, d);
        auto red = rt.grad_reducer_factory()(hp::ReducerOptions{1 << 20}, ours, d);
        hp::BuildContext ctx(setup.config, d, hp::LayerRegistry::dense(), 1);
        rt.model().apply_to(ctx);
        hp::StepContext sc;
        rt.run_hooks(hp::StepEvent::kStepBegin, sc);
        if (d.rank() == 1) {
          std::this_thread::sleep_for(std::chrono::milliseconds(2500));  // never joins
          return;
        }
        try {
          ctx.block_observers()[0].before(3);
          ADD_FAILURE() << "the gather did not fail";
        } catch (const hp::dist::CommError& e) {
          const std::string msg = e.what();
          EXPECT_EQ(msg.rfind("zero stage 3: rank 0 gathering the parameters of block 3 (p0): ", 0), 0u) << msg;
          EXPECT_NE(msg.find("all_gather"), std::string::npos) << msg;
          EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line: " << msg;
        }
      },
      std::chrono::milliseconds(1000));
}

// distributed.rebuild_buckets: after the first step the buckets follow the
// order the gradients arrived in. A chain used in reverse (w3 first, so
// backward reaches w0 first) is rebuilt: the one bucket's flat tensor then
// holds w0's gradient first; the sums stay bitwise those of a reducer that
// keeps the declared order (dp=2: one sum of two terms). A chain used in
// declared order arrives in the declared reverse order: nothing to rebuild.
TEST(GradReducer, BucketsRebuiltInArrivalOrderKeepTheSums) {
  for (bool reversed : {true, false}) {
    hp::test::run_ranks(2, [&](hp::dist::DistributedContext& d) {
      auto chain = [](std::uint64_t seed) {
        std::vector<hp::ParamEntry> out;
        for (int i = 0; i < 4; ++i) {
          hp::ParamEntry e;
          e.spec.name = "w" + std::to_string(i);
          e.spec.global_shape = {3};
          e.spec.grad = {{"dp", hp::dist::Placement::partial()}};
          e.tensor = torch::rand({3}, torch::make_generator<at::CPUGeneratorImpl>(seed + i)).add_(0.5).requires_grad_(true);
          out.push_back(e);
        }
        return out;
      };
      auto ours = chain(11), ref = chain(11);
      auto rebuilt = hp::make_bucketed_reducer(hp::ReducerOptions{1 << 20, true, true}, ours, d);
      auto declared = hp::make_bucketed_reducer(hp::ReducerOptions{1 << 20, true, false}, ref, d);
      auto step = [&](std::vector<hp::ParamEntry>& ps, hp::GradReducer& red, int s) {
        for (auto& p : ps) p.tensor.mutable_grad().zero_();
        red.begin_step(1);
        auto y = torch::full({3}, 1.0 + d.rank() + 0.25 * s);
        if (reversed) {
          for (int i = 3; i >= 0; --i) y = y * ps[static_cast<std::size_t>(i)].tensor;
        } else {
          for (auto& p : ps) y = y * p.tensor;
        }
        y.sum().backward();
        red.backward_done();
        red.reduce();
      };
      for (int s = 1; s <= 3; ++s) {
        step(ours, *rebuilt, s);
        step(ref, *declared, s);
        for (std::size_t i = 0; i < ours.size(); ++i) {
          EXPECT_TRUE(torch::equal(ours[i].tensor.grad(), ref[i].tensor.grad()))
              << ours[i].spec.name << " at step " << s << " on rank " << d.rank();
        }
      }
      std::map<std::string, double> f;
      rebuilt->report(f);
      EXPECT_EQ(f["grad_buckets_rebuilt"], reversed ? 1.0 : 0.0);
      // The one bucket's flat tensor, in the order the gradients arrived.
      const auto* w0 = static_cast<const float*>(ours[0].tensor.grad().data_ptr());
      const auto* w3 = static_cast<const float*>(ours[3].tensor.grad().data_ptr());
      EXPECT_EQ(reversed ? w3 - w0 : w0 - w3, 9) << "w0 and w3 at the ends of the bucket";
    });
  }
}
