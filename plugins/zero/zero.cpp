// The `zero` feature (ZeRO stage 1): optimizer state sharded over the
// replicating groups. Every parameter is cut along one dimension into one
// slice per replica (its tensor-parallel split dimension when it has one,
// else dimension 0, so a slice is still a range of the global tensor that a
// ShardSpec describes). After backward each rank reduce-scatters the
// gradients in buckets (Group::reduce_scatter with uneven chunks: an
// all-to-all of the slices, then a local sum in member order),
// clips with the global norm of the slices, updates only its slice with the
// same update rule as the unsharded optimizer, and all-gathers the updated
// slices. Its state is saved by global name with the slice's ShardSpec, so
// a zero run resumes at another data-parallel size and with zero off.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include "backends/dist/context.h"
#include "backends/dist/gather.h"
#include "backends/dist/group.h"
#include "framework/config/config.h"
#include "framework/metrics/metrics.h"
#include "framework/optim/grad_sync.h"
#include "framework/optim/optimizer.h"
#include "framework/plugin/feature_runtime.h"
#include "framework/plugin/plugin_export.h"

namespace hp::zero {

namespace {

const char* kStage = "features.zero.stage";

/// One parameter's cut: which group it is sharded over, along which
/// dimension, each member's range along it, and this rank's slice.
struct Cut {
  ParamEntry param;
  std::vector<std::string> pre_groups;  ///< summed (all-reduce) before the scatter
  std::string shard_group;
  int dim = 0;
  std::vector<std::pair<std::int64_t, std::int64_t>> ranges;  ///< per member: offset, length (local)
  int me = 0;
  ShardSpec slice_spec;
  at::Tensor slice_grad;

  at::Tensor slice_of(const at::Tensor& t, int member) const {
    return t.narrow(dim, ranges[static_cast<std::size_t>(member)].first, ranges[static_cast<std::size_t>(member)].second);
  }
  std::int64_t numel_of(int member) const {
    const auto& shape = param.tensor.sizes();
    std::int64_t n = ranges[static_cast<std::size_t>(member)].second;
    for (std::int64_t d = 0; d < static_cast<std::int64_t>(shape.size()); ++d) {
      if (d != dim) n *= shape[static_cast<std::size_t>(d)];
    }
    return n;
  }
};

/// What the optimizer and the reducer of one run share.
struct Shards {
  std::vector<Cut> cuts;
  double bucket_bytes = 25.0 * 1024 * 1024;
  dist::DistributedContext* dist = nullptr;

  Shards(const std::vector<ParamEntry>& params, dist::DistributedContext& d) : dist(&d) {
    for (const auto& p : params) {
      Cut c;
      c.param = p;
      auto groups = p.spec.grad_sync_groups();
      c.shard_group = groups.back();
      groups.pop_back();
      c.pre_groups = groups;
      c.dim = p.spec.sharded() ? p.spec.split_dim : 0;
      auto& g = d.group(c.shard_group);
      c.me = g.rank();
      const std::int64_t len = p.tensor.size(c.dim);
      for (int m = 0; m < g.size(); ++m) c.ranges.push_back(split_range(len, g.size(), m));
      c.slice_spec = p.spec;
      if (g.size() > 1) {
        c.slice_spec.split_dim = c.dim;
        c.slice_spec.offset = (p.spec.sharded() ? p.spec.offset : 0) + c.ranges[static_cast<std::size_t>(c.me)].first;
        c.slice_spec.length = c.ranges[static_cast<std::size_t>(c.me)].second;
        c.slice_spec.split_group =
            p.spec.sharded() ? p.spec.split_group + "+" + c.shard_group : c.shard_group;
      }
      if (!p.tensor.grad().defined()) p.tensor.mutable_grad() = at::zeros_like(p.tensor);
      c.slice_grad = at::zeros(c.slice_of(p.tensor, c.me).sizes(), p.tensor.options());
      cuts.push_back(std::move(c));
    }
  }

  /// Buckets of cut indices, each over one shard group, of at most
  /// bucket_bytes, in reverse model order (last layers first).
  std::vector<std::vector<std::size_t>> buckets() const {
    std::map<std::string, std::vector<std::size_t>> by_group;
    for (std::size_t i = cuts.size(); i-- > 0;) by_group[cuts[i].shard_group].push_back(i);
    std::vector<std::vector<std::size_t>> out;
    for (const auto& [group, idx] : by_group) {
      std::vector<std::size_t> b;
      double bytes = 0;
      for (std::size_t i : idx) {
        const double n = static_cast<double>(cuts[i].param.tensor.nbytes());
        if (!b.empty() && bytes + n > bucket_bytes) {
          out.push_back(b);
          b.clear();
          bytes = 0;
        }
        b.push_back(i);
        bytes += n;
      }
      if (!b.empty()) out.push_back(b);
    }
    return out;
  }

  void reduce_scatter() {
    c10::NoGradGuard no_grad;
    // Partial sums first (tp for sequence-parallel replicated parameters).
    std::map<std::string, std::vector<at::Tensor>> pre;
    for (auto it = cuts.rbegin(); it != cuts.rend(); ++it) {
      if (it->pre_groups.empty()) continue;
      std::string joined;
      for (const auto& g : it->pre_groups) joined += (joined.empty() ? "" : "+") + g;
      pre[joined].push_back(it->param.tensor.grad());
    }
    for (auto& [joined, grads] : pre) all_reduce_bucketed(*dist, ShardSpec::groups_of(joined), grads, bucket_bytes);
    for (const auto& bucket : buckets()) {
      auto& g = dist->group(cuts[bucket.front()].shard_group);
      const int n = g.size();
      if (n == 1) {
        for (std::size_t i : bucket) cuts[i].slice_grad = cuts[i].param.tensor.grad();
        continue;
      }
      // Member-major: every member's slices of every parameter, in bucket
      // order; member m's chunk is counts[m] elements long.
      std::vector<at::Tensor> parts;
      std::vector<std::int64_t> counts(static_cast<std::size_t>(n), 0);
      for (int m = 0; m < n; ++m) {
        for (std::size_t i : bucket) {
          parts.push_back(cuts[i].slice_of(cuts[i].param.tensor.grad(), m).reshape({-1}));
          counts[static_cast<std::size_t>(m)] += cuts[i].numel_of(m);
        }
      }
      // Summed in member order, so every replica adds in the same order.
      at::Tensor sum = g.reduce_scatter(at::cat(parts), counts);
      // The slices' gradients are views into the summed bucket (no copy).
      std::int64_t off = 0;
      for (std::size_t i : bucket) {
        auto& c = cuts[i];
        const std::int64_t k = c.numel_of(c.me);
        c.slice_grad = sum.narrow(0, off, k).view(c.slice_grad.sizes());
        off += k;
      }
    }
  }

  std::vector<ParamEntry> gradients() const {
    std::vector<ParamEntry> out;
    for (const auto& c : cuts) out.push_back({c.slice_spec, c.slice_grad});
    return out;
  }

  /// Every replica's updated slices back into every parameter.
  void all_gather_params() {
    c10::NoGradGuard no_grad;
    for (const auto& bucket : buckets()) {
      auto& g = dist->group(cuts[bucket.front()].shard_group);
      const int n = g.size();
      if (n == 1) continue;
      std::vector<std::int64_t> totals(static_cast<std::size_t>(n), 0);
      for (int m = 0; m < n; ++m) {
        for (std::size_t i : bucket) totals[static_cast<std::size_t>(m)] += cuts[i].numel_of(m);
      }
      std::vector<at::Tensor> mine;
      for (std::size_t i : bucket) mine.push_back(cuts[i].slice_of(cuts[i].param.tensor, cuts[i].me).reshape({-1}));
      const auto all = dist::all_gather_uneven(g, at::cat(mine), 0, totals);
      for (int m = 0; m < n; ++m) {
        if (m == g.rank()) continue;
        std::int64_t off = 0;
        for (std::size_t i : bucket) {
          auto& c = cuts[i];
          at::Tensor dst = c.slice_of(c.param.tensor, m);
          const std::int64_t k = c.numel_of(m);
          dst.copy_(all[static_cast<std::size_t>(m)].narrow(0, off, k).view(dst.sizes()));
          off += k;
        }
      }
    }
  }
};

class ZeroReducer : public GradReducer {
 public:
  explicit ZeroReducer(std::shared_ptr<Shards> s) : s_(std::move(s)) {}
  void reduce() override { s_->reduce_scatter(); }
  double clip(double max_norm) override {
    const auto grads = s_->gradients();
    const double norm = global_grad_norm(*s_->dist, grads);
    clip_to(grads, norm, max_norm);
    return norm;
  }
  std::vector<ParamEntry> gradients() const override { return s_->gradients(); }

 private:
  std::shared_ptr<Shards> s_;
};

class ZeroOptimizer : public NamedStateOptimizer {
 public:
  ZeroOptimizer(OptimizerOptions o, std::shared_ptr<Shards> s) : NamedStateOptimizer(o), s_(std::move(s)) {
    for (const auto& c : s_->cuts) {
      ShardSpec spec = c.slice_spec;
      spec.name = c.param.spec.name;
      add_state(spec, c.slice_grad);
    }
  }
  void step(double lr) override {
    {
      c10::NoGradGuard no_grad;
      ++steps_;
      for (std::size_t i = 0; i < s_->cuts.size(); ++i) {
        auto& c = s_->cuts[i];
        apply_update(o_, steps_, lr, c.slice_of(c.param.tensor, c.me), c.slice_grad, state_[i]);
      }
    }
    s_->all_gather_params();
  }
  void zero_grad() override {
    std::vector<ParamEntry> params;
    for (const auto& c : s_->cuts) params.push_back(c.param);
    zero_gradients(params);
  }

 private:
  std::shared_ptr<Shards> s_;
};

class ZeroFeature : public Feature {
 public:
  void declare_options(Schema& s, const std::string& prefix) const override {
    s.add_int(prefix + "stage", 1).range(1, 3)
        .describe("ZeRO stage: 1 shards the optimizer state over the data-parallel replicas (2 and 3, "
                  "gradients and parameters, are not built yet).");
  }

  void validate(const FeatureContext& ctx, ConfigErrors& e) const override {
    if (ctx.config.ok({kStage}) && ctx.config.get_int(kStage) != 1) {
      e.add(kStage, std::to_string(ctx.config.get_int(kStage)),
            "only stage 1 (optimizer state sharding) is built; gradient and parameter sharding are not", "1");
    }
  }

  void install(FeatureRuntime& rt) override {
    // The optimizer is made first, then the reducer, for the same parameters.
    auto shards = std::make_shared<std::shared_ptr<Shards>>();
    metrics::Gauge* gauge = rt.has_metrics()
        ? &rt.metrics().gauge("hp_zero_optimizer_state_bytes", "Optimizer state bytes this rank holds under zero.")
        : nullptr;
    rt.set_optimizer("zero", [shards, gauge](const OptimizerOptions& o, const std::vector<ParamEntry>& params,
                                              dist::DistributedContext& d) -> std::unique_ptr<Optimizer> {
      if (!*shards) *shards = std::make_shared<Shards>(params, d);
      auto opt = std::make_unique<ZeroOptimizer>(o, *shards);
      if (gauge) gauge->set(static_cast<double>(opt->state_bytes()));
      return opt;
    });
    rt.set_grad_reducer("zero", [shards](const ReducerOptions& o, const std::vector<ParamEntry>& params,
                                         dist::DistributedContext& d) -> std::unique_ptr<GradReducer> {
      if (!*shards) *shards = std::make_shared<Shards>(params, d);
      (*shards)->bucket_bytes = o.bucket_bytes;
      return std::make_unique<ZeroReducer>(*shards);
    });
  }
};

}  // namespace
}  // namespace hp::zero

HP_FEATURE_PLUGIN(hp::zero::ZeroFeature)
