// The `expert_parallel` feature: the experts of every `moe` layer split
// over `size` ranks (the ep mesh dimension, carved out of the data-parallel
// ranks and, with context parallel, the cp ranks: Megatron's folding of
// experts over what attention sees as cp x dp). Each rank routes its own tokens exactly as one
// process would (framework/model/moe.h), sends each kept assignment to the
// rank of its expert with an uneven all-to-all (counts exchanged first),
// runs its experts on what it received, and gets the outputs back with the
// reverse all-to-all; the backward of each exchange is the other. A token's
// outputs are then weighted and summed in ascending expert order, as the
// dense layer does. Expert parameters are stacked [experts, ...] and split
// on dimension 0; their gradients are summed over the expert-data-parallel
// group (edp), the router's over dp (and cp).
#include <ATen/ATen.h>

#include "backends/dist/autograd.h"
#include "backends/dist/context.h"
#include "backends/dist/mesh.h"
#include "framework/config/config.h"
#include "framework/model/extensions.h"
#include "framework/model/model_info.h"
#include "framework/model/moe.h"
#include "framework/plugin/feature_runtime.h"
#include "framework/plugin/plugin_export.h"

namespace hp::expert_parallel {

namespace {

const char* kSize = "features.expert_parallel.size";
// The two dimensions this plugin registers (plan_mesh), named once: experts
// are split over kExperts and their gradients summed over kExpertReplicas.
const char* kExperts = "ep";
const char* kExpertReplicas = "edp";

class ExpertParallelMoe : public MoeLayer {
 public:
  ExpertParallelMoe(const LayerSpec& s, BuildContext& ctx)
      : MoeLayer(s, ctx), g_(*ctx.group(kExperts)) {
    const std::int64_t E = options().num_experts, P = g_.size();
    per_rank_ = E / P;
    first_ = g_.rank() * per_rank_;
    experts_ = make_experts(ctx, {{kExperts, dist::Placement::shard(0)}});
  }

 protected:
  at::Tensor dispatch(const at::Tensor& tokens, const Routing& r) override {
    const std::int64_t P = g_.size(), E = options().num_experts, k = r.experts.size(1);
    if (P == 1) return dispatch_locally(experts_, 0, tokens, r, options().padded);
    // This rank's kept assignments, by expert, then token (one stable sort).
    ExpertGroups groups = group_by_expert(r, 0, E);
    const auto& per_expert = groups.counts;
    at::Tensor token_of = at::div(groups.order, k, "floor");
    // Counts first: how many rows each rank sends to each of my experts.
    at::Tensor counts = at::tensor(per_expert, at::kLong);
    std::vector<std::int64_t> even(static_cast<std::size_t>(P), per_rank_);
    at::Tensor got = g_.all_to_all(counts, even, even).view({P, per_rank_});
    std::vector<std::int64_t> send(static_cast<std::size_t>(P), 0),
        recv(static_cast<std::size_t>(P), 0);
    for (std::int64_t d = 0; d < P; ++d) {
      for (std::int64_t j = 0; j < per_rank_; ++j)
        send[static_cast<std::size_t>(d)] +=
            per_expert[static_cast<std::size_t>(d * per_rank_ + j)];
      recv[static_cast<std::size_t>(d)] = got[d].sum().item<std::int64_t>();
    }
    at::Tensor rows = dist::all_to_all(tokens.index_select(0, token_of), g_, send, recv);
    // What arrived is by source rank, then by my expert: one stable sort by
    // my expert makes each expert's rows contiguous (sources ascending), the
    // experts run on their slices, and the outputs go back to arrival order.
    // With no rows, forward_grouped returns rows x 0, not zeros: every
    // rank's graph must hold both exchanges, so that each backward
    // all-to-all has every member, even a rank that got no rows or sent none.
    at::Tensor expert_of =
        at::repeat_interleave(at::arange(per_rank_, at::kLong).repeat({P}), got.reshape({-1}));
    at::Tensor by_expert =
        std::get<1>(at::sort(expert_of, /*stable=*/true, /*dim=*/0, /*descending=*/false));
    at::Tensor mine = got.sum(0).contiguous();
    std::vector<std::int64_t> mine_counts(mine.data_ptr<std::int64_t>(),
                                          mine.data_ptr<std::int64_t>() + per_rank_);
    at::Tensor y =
        experts_.forward_grouped(rows.index_select(0, by_expert), mine_counts, options().padded);
    if (rows.size(0) > 0) y = at::zeros_like(y).index_copy(0, by_expert, y);
    at::Tensor back = dist::all_to_all(y, g_, recv, send);
    at::Tensor w =
        r.weights.reshape({-1}).index_select(0, groups.order).unsqueeze(1).to(back.scalar_type());
    return combine_by_token(back * w, groups.order, tokens.size(0), k);
  }

 private:
  dist::Group& g_;
  std::int64_t per_rank_ = 0, first_ = 0;
  ExpertWeights experts_;
};

class ExpertParallelFeature : public Feature {
 public:
  void declare_options(Schema& s, const std::string& prefix) const override {
    s.add_int(prefix + "size", 2)
        .range(1, 1024)
        .describe(
            "Ranks the experts of every moe layer are split over (the ep mesh dimension, carved "
            "out of the data-parallel ranks, and the context-parallel ones when context parallel is on: "
            "it must divide their product and the expert count).");
  }

  void plan_mesh(const Config& c, dist::MeshPlan& plan) const override {
    // ep is carved out of the data-parallel ranks (consecutive indices);
    // edp, the rest, joins the ranks holding the same experts.
    plan.carve(kExperts, static_cast<int>(c.get_int(kSize)), kExpertReplicas, "expert_parallel", dist::MeshRole::kSplit);
  }

  void validate(const FeatureContext& ctx, ConfigErrors& e) const override {
    const Config& c = ctx.config;
    if (!c.ok({kSize})) return;
    const auto P = c.get_int(kSize);
    if (!ctx.model.uses("moe")) {
      e.add("features.expert_parallel.enabled", "true",
            "model '" + ctx.model.name + "' has no experts to split (it builds no moe layer)",
            "model.moe.num_experts > 0, or disable expert_parallel");
      return;
    }
    // That ep divides dp is the mesh's own rule (resolve_mesh).
    ctx.model.check_divides("experts", P, kSize, e);
  }

  void install(FeatureRuntime& rt) override {
    rt.model().layers().replace("moe", "expert_parallel",
                                [](const LayerSpec& s, BuildContext& ctx) {
                                  return std::make_shared<ExpertParallelMoe>(s, ctx);
                                });
  }
};

}  // namespace
}  // namespace hp::expert_parallel

HP_FEATURE_PLUGIN(hp::expert_parallel::ExpertParallelFeature)
