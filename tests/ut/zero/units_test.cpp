// zero's units one at a time (plugins/zero compiled in, no runtime, no
// plugin loading), on real Gloo ranks: the slice plan (the one setup), the
// gradient slicer (partial sums to this rank's slices; stage 1 keeps the
// full gradients, stage 2 releases them), the parameters' residency after an
// update (every replica's slices back in the whole parameters) and the
// sharded optimizer (the unsharded rule, applied to this rank's slices).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <set>

#include "hp/comm/context.h"
#include "hp/comm/group.h"
#include "hp/comm/slice.h"
#include "hp/optim/optimizer.h"
#include "plugins/zero/grad_slicer.h"
#include "plugins/zero/param_residency.h"
#include "plugins/zero/sharded_optimizer.h"
#include "plugins/zero/slices.h"
#include "tests/support/multi_rank.h"

namespace {

using hp::zero::Composition;
using hp::zero::SlicePlan;
using hp::zero::ZeroOptions;

/// One rank's parameters on a (dp, tp) mesh: a tp split along dimension 1,
/// a whole vector, an uneven tp split along dimension 0, and a bias summed
/// over tp before dp (sequence parallel's replicated parameters).
std::vector<hp::ParamEntry> params_of(hp::dist::DistributedContext& d) {
  std::vector<hp::ParamEntry> out;
  const int T = d.group("tp").size(), t = d.group("tp").rank();
  auto add = [&](const std::string& name, std::vector<std::int64_t> shape, int dim, std::vector<std::string> sums,
                 std::uint64_t seed) {
    hp::ParamEntry e;
    e.spec.name = name;
    e.spec.global_shape = shape;
    auto whole = torch::randn(shape, torch::make_generator<at::CPUGeneratorImpl>(seed));
    torch::Tensor local = whole;
    if (dim >= 0 && T > 1) {
      e.spec.placements = {{"tp", hp::dist::Placement::shard(dim)}};
      const auto [off, len] = hp::dist::split_range(shape[static_cast<std::size_t>(dim)], T, t);
      e.spec.box.offsets.assign(shape.size(), 0);
      e.spec.box.lengths = shape;
      e.spec.box.offsets[static_cast<std::size_t>(dim)] = off;
      e.spec.box.lengths[static_cast<std::size_t>(dim)] = len;
      local = whole.narrow(dim, off, len);
    }
    e.spec.grad = e.spec.placements;
    for (const auto& s : sums) e.spec.grad.push_back({s, hp::dist::Placement::partial()});
    e.tensor = local.clone().requires_grad_(true);
    out.push_back(e);
  };
  add("w", {6, 8}, 1, {"dp"}, 1);
  add("b", {5}, -1, {"dp"}, 2);
  add("v", {7, 3}, 0, {"dp"}, 3);
  add("n", {9}, -1, {"tp", "dp"}, 4);
  return out;
}

/// Rank r's gradient of parameter i (its local shape).
torch::Tensor grad_of(const hp::ParamEntry& p, std::size_t i, int rank) {
  return torch::randn(p.tensor.sizes(), torch::make_generator<at::CPUGeneratorImpl>(50 + 10 * rank + i));
}

ZeroOptions options_of(int stage, bool overlap) {
  ZeroOptions o;
  o.parts = Composition::of_stage(stage);
  o.bucket_bytes = 64;  // several buckets from four small parameters
  o.overlap = overlap;
  return o;
}

const std::vector<hp::dist::ProcessMesh>& meshes() {
  static const std::vector<hp::dist::ProcessMesh> m{hp::test::grid(1, 2, 1), hp::test::grid(1, 2, 2)};
  return m;
}

}  // namespace

TEST(ZeroUnits, AStageIsACompositionOfUnits) {
  EXPECT_FALSE(Composition::of_stage(1).release_full_grads);
  EXPECT_FALSE(Composition::of_stage(1).shard_params);
  EXPECT_TRUE(Composition::of_stage(2).release_full_grads);
  EXPECT_FALSE(Composition::of_stage(2).shard_params);
  EXPECT_TRUE(Composition::of_stage(3).release_full_grads);
  EXPECT_TRUE(Composition::of_stage(3).shard_params);
}

// The plan cuts each parameter over dp along its tp split dimension (or 0):
// the members' ranges tile the local tensor in rank order, the slice's box
// is that range in global coordinates, and every cut is in one bucket.
TEST(ZeroUnits, SlicePlanTilesEveryParameterAndBucketsEachCutOnce) {
  for (const auto& mesh : meshes()) {
    hp::test::run_ranks(mesh, [&](hp::dist::DistributedContext& d) {
      auto params = params_of(d);
      SlicePlan plan(params, d, options_of(1, false));
      ASSERT_EQ(plan.cuts.size(), params.size());
      for (const auto& c : plan.cuts) {
        EXPECT_EQ(c.shard_group, "dp") << c.param.spec.name;
        EXPECT_EQ(c.me, d.group("dp").rank());
        std::int64_t next = 0;
        for (const auto& [off, len] : c.ranges) {
          EXPECT_EQ(off, next) << c.param.spec.name << " on rank " << d.rank();
          next += len;
        }
        EXPECT_EQ(next, c.param.tensor.size(c.dim)) << c.param.spec.name;
        const auto at = static_cast<std::size_t>(c.dim);
        const std::int64_t local_off = c.param.spec.box.offsets.empty() ? 0 : c.param.spec.box.offsets[at];
        EXPECT_EQ(c.slice_spec.box.offsets[at], local_off + c.ranges[static_cast<std::size_t>(c.me)].first);
        EXPECT_EQ(c.slice_spec.box.lengths[at], c.ranges[static_cast<std::size_t>(c.me)].second);
        EXPECT_TRUE(c.param.tensor.grad().defined()) << "stage 1 holds the full gradient from the start";
      }
      std::multiset<std::size_t> seen;
      const auto buckets = plan.buckets();
      EXPECT_GT(buckets.size(), 1u) << "64-byte buckets";
      for (const auto& b : buckets) {
        for (auto i : b.cuts) seen.insert(i);
        // The bias summed over tp first is never in a bucket that a
        // backward hook launches (its all-reduce runs after backward).
        const bool presum = std::any_of(b.cuts.begin(), b.cuts.end(), [&](std::size_t i) {
          return plan.cuts[i].partial.size() > 1 && d.group("tp").size() > 1;
        });
        if (presum) EXPECT_FALSE(b.hooked);
      }
      for (std::size_t i = 0; i < plan.cuts.size(); ++i) EXPECT_EQ(seen.count(i), 1u) << "cut " << i;
    });
  }
}

// After the reduction each rank's slice holds the sum over its replicas
// (over tp too for the summed bias) of its range, bitwise against the same
// sums in member order; stage 1 keeps the full gradients and stores the
// slice inside them, stage 2 releases them.
TEST(ZeroUnits, GradSlicerLeavesEachRankTheSumOfItsSlice) {
  for (int stage : {1, 2}) {
    for (const auto& mesh : meshes()) {
      hp::test::run_ranks(mesh, [&](hp::dist::DistributedContext& d) {
        auto params = params_of(d);
        auto plan = std::make_shared<SlicePlan>(params, d, options_of(stage, false));
        auto residency = hp::zero::make_param_residency(plan);
        auto slicer = hp::zero::make_grad_slicer(plan, residency);
        // Before any reduction: stage 2's slices have storage of their own
        // (made with the model state), stage 1's placeholders one element.
        std::vector<const void*> storage;
        for (const auto& c : plan->cuts) {
          storage.push_back(c.slice_grad.data_ptr());
          if (stage == 1) {
            EXPECT_LE(c.slice_grad.storage().nbytes(), c.slice_grad.element_size()) << c.param.spec.name;
          } else {
            EXPECT_EQ(c.slice_grad.storage().nbytes(), c.slice_grad.nbytes()) << c.param.spec.name;
          }
        }
        slicer->begin_step(1);
        for (std::size_t i = 0; i < params.size(); ++i) params[i].tensor.mutable_grad() = grad_of(params[i], i, d.rank());
        slicer->backward_done();
        slicer->reduce();
        const int T = d.group("tp").size();
        for (std::size_t i = 0; i < params.size(); ++i) {
          const auto& c = plan->cuts[i];
          // Replicas of this rank: same tp coordinate (or every rank for the
          // bias summed over tp as well), in rank order.
          torch::Tensor expect;
          for (int r = 0; r < d.world_size(); ++r) {
            if (c.partial.size() == 1 && r % T != d.rank() % T) continue;
            auto g = c.slice_of(grad_of(params[i], i, r), c.me);
            expect = expect.defined() ? expect + g : g.clone();
          }
          const auto& got = plan->gradients()[i].tensor;
          if (c.partial.size() == 1) {
            EXPECT_TRUE(torch::equal(got, expect)) << c.param.spec.name << " stage " << stage << " rank " << d.rank();
          } else {  // summed over tp, then dp: another order of the same terms
            EXPECT_TRUE(torch::allclose(got, expect, 1e-6, 1e-6)) << c.param.spec.name << " rank " << d.rank();
          }
          if (stage == 1) {
            ASSERT_TRUE(c.param.tensor.grad().defined());
            EXPECT_TRUE(got.is_alias_of(c.param.tensor.grad())) << "stage 1's slice lives in the full gradient";
          } else {
            EXPECT_FALSE(c.param.tensor.grad().defined()) << c.param.spec.name << ": stage 2 releases it";
            // The sum was copied into the slice's own storage: nothing
            // made during the reduction outlives it.
            EXPECT_EQ(got.data_ptr(), storage[i]) << c.param.spec.name << " rank " << d.rank();
          }
        }
        std::map<std::string, double> figures;
        slicer->report(figures);
        EXPECT_EQ(figures["zero_slice_grad_bytes"] > 0, stage == 2);
      });
    }
  }
}

// After an update of the slices, every replica's slice arrives in every
// replica's whole parameter: at once (overlap off) or a few buckets ahead
// of the blocks that read them (overlap on; waited here by wait_all).
TEST(ZeroUnits, GatherAfterUpdateBringsEveryReplicasSliceBack) {
  for (bool overlap : {false, true}) {
    for (const auto& mesh : meshes()) {
      hp::test::run_ranks(mesh, [&](hp::dist::DistributedContext& d) {
        auto params = params_of(d);
        auto plan = std::make_shared<SlicePlan>(params, d, options_of(1, overlap));
        auto residency = hp::zero::make_param_residency(plan);
        const int me = d.group("dp").rank();
        {
          torch::NoGradGuard g;
          for (auto& c : plan->cuts) residency->update_target(c).fill_(100 + me);
        }
        residency->after_update();
        residency->wait_all();
        for (auto& c : plan->cuts) {
          for (int m = 0; m < d.group("dp").size(); ++m) {
            auto part = c.slice_of(c.param.tensor.detach(), m);
            EXPECT_TRUE(torch::equal(part, torch::full_like(part, 100 + m)))
                << c.param.spec.name << ": member " << m << "'s slice on rank " << d.rank();
          }
        }
        std::map<std::string, double> figures;
        residency->report(figures);
        EXPECT_EQ(figures["zero_gathers"], static_cast<double>(plan->buckets().size()));
      });
    }
  }
}

// The sharded optimizer applies the unsharded optimizer's rule to this
// rank's slices (bitwise the unsharded optimizer run on copies of them)
// and keeps state for its slices only.
TEST(ZeroUnits, ShardedOptimizerIsTheUnshardedRuleOnTheSlices) {
  hp::test::run_ranks(hp::test::grid(1, 2, 1), [&](hp::dist::DistributedContext& d) {
    auto params = params_of(d);
    auto plan = std::make_shared<SlicePlan>(params, d, options_of(1, false));
    auto residency = hp::zero::make_param_residency(plan);
    hp::OptimizerOptions o;
    o.weight_decay = 0.1;
    auto opt = hp::zero::make_sharded_optimizer(o, plan, residency);
    std::vector<hp::ParamEntry> copies;
    for (std::size_t i = 0; i < plan->cuts.size(); ++i) {
      auto& c = plan->cuts[i];
      hp::ParamEntry e;
      e.spec = c.slice_spec;
      e.tensor = c.slice_of(c.param.tensor.detach(), c.me).clone();
      copies.push_back(e);
    }
    auto ref = hp::make_optimizer(o, copies);
    double slice_bytes = 0;
    for (int step = 1; step <= 3; ++step) {
      for (std::size_t i = 0; i < plan->cuts.size(); ++i) {
        auto& c = plan->cuts[i];
        c.slice_grad = torch::randn(copies[i].tensor.sizes(),
                                    torch::make_generator<at::CPUGeneratorImpl>(7 * step + i + 100 * d.rank()));
        copies[i].tensor.mutable_grad() = c.slice_grad.clone();
      }
      opt->step(1e-2);
      ref->step(1e-2);
    }
    for (std::size_t i = 0; i < plan->cuts.size(); ++i) {
      auto& c = plan->cuts[i];
      EXPECT_TRUE(torch::equal(c.slice_of(c.param.tensor.detach(), c.me), copies[i].tensor))
          << c.param.spec.name << " on rank " << d.rank();
      slice_bytes += static_cast<double>(copies[i].tensor.nbytes());
    }
    EXPECT_EQ(static_cast<double>(opt->state_bytes()), 2 * slice_bytes) << "exp_avg and exp_avg_sq of the slices";
    EXPECT_EQ(opt->state_bytes(), ref->state_bytes());
  });
}

// What the planner is told: stage 1 and 2 hold after the update the
// gathers of kGathersAhead buckets at once (each a receive buffer of its
// parameters' whole bytes and this rank's slices packed), the largest such
// run of consecutive buckets; stage 3 gathers per block instead, so none
// after the update, and makes its gradients whole in backward.
TEST(ZeroUnits, ModelStateNamesWhatTheUpdateLeavesTravelling) {
  for (int stage : {1, 2, 3}) {
    hp::test::run_ranks(hp::test::grid(1, 2, 1), [&](hp::dist::DistributedContext& d) {
      auto params = params_of(d);
      auto plan = std::make_shared<SlicePlan>(params, d, options_of(stage, true));
      auto residency = hp::zero::make_param_residency(plan);
      auto opt = hp::zero::make_sharded_optimizer(hp::OptimizerOptions{}, plan, residency);
      const auto m = opt->model_state(params);
      std::vector<std::pair<std::size_t, double>> per_bucket;
      double whole = 0;
      for (const auto& b : plan->buckets()) {
        double bytes = 0;
        for (std::size_t i : b.cuts) {
          const auto& c = plan->cuts[i];
          bytes += static_cast<double>(c.param.tensor.nbytes() + c.numel_of(c.me) * c.param.tensor.element_size());
          whole += static_cast<double>(c.param.tensor.nbytes());
        }
        per_bucket.emplace_back(*std::min_element(b.cuts.begin(), b.cuts.end()), bytes);
      }
      std::sort(per_bucket.begin(), per_bucket.end());
      double expect = 0;
      for (std::size_t f = 0; f < per_bucket.size(); ++f) {
        double run = 0;
        for (std::size_t k = f; k < std::min(per_bucket.size(), f + hp::zero::kGathersAhead); ++k)
          run += per_bucket[k].second;
        expect = std::max(expect, run);
      }
      if (stage == 3) {
        EXPECT_EQ(m.after_update, 0.0);
        EXPECT_EQ(m.made_whole, whole);
      } else {
        EXPECT_GT(expect, 0.0);
        EXPECT_EQ(m.after_update, expect) << "stage " << stage;
        EXPECT_EQ(m.made_whole, stage == 2 ? whole : 0.0);
      }
    });
  }
}
