// The `expert_parallel` feature: the experts of every `moe` layer split
// over `size` ranks (the ep mesh dimension, carved out of the data-parallel
// ranks and, with context parallel, the cp ranks: Megatron's folding of
// experts over what attention sees as cp x dp). Each rank routes its own tokens exactly as one
// process would (include/hp/model/moe.h), sends each kept assignment to the
// rank of its expert with an uneven all-to-all (counts exchanged first),
// runs its experts on what it received, and gets the outputs back with the
// reverse all-to-all; the backward of each exchange is the other. A token's
// outputs are then weighted and summed in ascending expert order, as the
// dense layer does. Expert parameters are stacked [experts, ...] and split
// on dimension 0; their gradients are summed over what the carve leaves of
// the data ranks (the mesh's expert-data-parallel dimension, edp), the
// router's over dp (and cp).
#include <ATen/ATen.h>

#include "hp/comm/autograd.h"
#include "hp/comm/context.h"
#include "hp/comm/mesh.h"
#include "hp/config/config.h"
#include "hp/model/extensions.h"
#include "hp/model/model_info.h"
#include "hp/model/moe.h"
#include "hp/plugin/feature_runtime.h"
#include "hp/plugin/plugin_export.h"

namespace hp::expert_parallel {

namespace {

const char* kSize = "features.expert_parallel.size";
const char* kTensorSize = "features.expert_parallel.tensor_size";
// The dimension this plugin registers (plan_mesh), named once: experts are
// split over kExperts; the mesh names what the carve leaves of the data
// ranks, and their gradients are summed over it (grad_sync_dims).
const char* kExperts = "ep";

/// The mesh's one base split dimension (the residual stream's tensor
/// parallel), which expert tensor parallel splits each expert's FFN over.
std::string stream_split_dim(const dist::ProcessMesh& mesh) {
  std::string found;
  for (const auto& d : mesh.dims()) {
    if (d.role != dist::MeshRole::kSplit) continue;
    if (!found.empty()) {
      throw std::invalid_argument("features.expert_parallel.tensor_size: the mesh has two split dimensions (" + found +
                                  ", " + d.name + "); expert tensor parallel needs exactly one");
    }
    found = d.name;
  }
  return found;
}

class ExpertParallelMoe : public MoeLayer {
 public:
  /// `split_ffn`: expert tensor parallel (etp = the stream's tp size): each
  /// expert's FFN split over the stream's split dimension, fc1 by output
  /// features and fc2 by input features, one all-reduce of the received
  /// rows' outputs; etp = 1 keeps whole experts.
  ExpertParallelMoe(const LayerSpec& s, BuildContext& ctx, bool split_ffn)
      : MoeLayer(s, ctx), g_(*ctx.group(kExperts)) {
    const std::int64_t E = options().num_experts, P = g_.size();
    per_rank_ = E / P;
    first_ = g_.rank() * per_rank_;
    const std::string tp = split_ffn ? stream_split_dim(ctx.dist().mesh()) : "";
    if (tp.empty()) {
      experts_ = make_experts(ctx, {{kExperts, dist::Placement::shard(0)}});
      return;
    }
    tp_ = ctx.group(tp);
    experts_ = make_experts(ctx, {{kExperts, dist::Placement::shard(0)}}, tp);
    if (experts_.b2.defined()) {
      // The partial outputs carry no bias: b2 is added once, after the sum over tp.
      b2_ = experts_.b2;
      experts_.b2 = at::zeros({per_rank_, hidden_}, b2_.options());
    }
  }

 protected:
  /// The experts of this rank on rows grouped by local expert (`counts`).
  at::Tensor run_experts(const at::Tensor& rows, const std::vector<std::int64_t>& counts) const {
    if (!tp_) return experts_.forward_grouped(rows, counts, options().compute);
    // Every tp rank holds the same rows: the input's gradient is partial
    // over the FFN slices (summed over tp in backward), the output summed.
    at::Tensor y = dist::reduce_from_group(
        experts_.forward_grouped(dist::copy_to_group(rows, *tp_), counts, options().compute), *tp_);
    at::Tensor expert_of =
        at::repeat_interleave(at::arange(per_rank_, at::kLong), at::tensor(counts, at::kLong));
    return b2_.defined() ? y + b2_.index_select(0, expert_of) : y;
  }

  at::Tensor dispatch(const at::Tensor& tokens, const Routing& r) override {
    const std::int64_t P = g_.size(), E = options().num_experts;
    if (P == 1 && !tp_) return dispatch_locally(experts_, 0, tokens, r, options().compute);
    // This rank's kept assignments, by expert, then token (one stable sort).
    ExpertGroups groups = group_by_expert(r, 0, E);
    const auto& per_expert = groups.counts;
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
    at::Tensor rows = dist::all_to_all(rows_by_expert(tokens, groups), g_, send, recv);
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
    at::Tensor inverse = at::empty_like(by_expert).index_copy_(0, by_expert, at::arange(by_expert.size(0), at::kLong));
    at::Tensor y = run_experts(permute_rows(rows, by_expert, inverse), mine_counts);
    if (rows.size(0) > 0) y = permute_rows(y, inverse, by_expert);
    at::Tensor back = dist::all_to_all(y, g_, recv, send);
    return combine_weighted(back, r, groups);
  }

 private:
  dist::Group& g_;
  dist::Group* tp_ = nullptr;  ///< expert tensor parallel: the stream's split group
  std::int64_t per_rank_ = 0, first_ = 0;
  ExpertWeights experts_;
  at::Tensor b2_;  ///< with tp_: the whole fc2 bias of the local experts
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
    s.add_int(prefix + "tensor_size", 1)
        .range(1, 1024)
        .describe(
            "Expert tensor parallel (etp): 1 keeps every expert's FFN whole; the size of the mesh's split "
            "dimension (tensor_parallel.size) splits each expert's FFN over it as well, so an expert group is "
            "etp x ep ranks.");
  }

  void plan_mesh(const Config& c, dist::MeshPlan& plan) const override {
    // ep is carved out of the data-parallel ranks (consecutive indices);
    // the rest, which the mesh names (edp), joins the ranks holding the same
    // experts.
    plan.carve(kExperts, static_cast<int>(c.get_int(kSize)), "expert_parallel", dist::MeshRole::kSplit);
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
    if (!c.ok({kTensorSize})) return;
    const auto etp = c.get_int(kTensorSize);
    if (etp == 1) return;
    // The one base split dimension of the mesh (the stream's tensor parallel).
    int split = 1, splits = 0;
    std::string by = "tensor_parallel";
    for (const auto& [dim, claim] : ctx.mesh.claims) {
      if (claim.role != dist::MeshRole::kSplit) continue;
      split = claim.size;
      by = claim.by;
      ++splits;
    }
    if (splits != 1 || etp != split) {
      const bool one = splits == 1;
      e.add(kTensorSize, std::to_string(etp),
            "expert tensor parallel splits each expert's FFN over the mesh's split dimension, " +
                (one ? "of size " + std::to_string(split) + " (" + by + ")" : std::string("and none is claimed")),
            one && split > 1 ? "1 or " + std::to_string(split)
                             : std::string("1 (enable tensor_parallel with size > 1 to split experts)"));
      return;
    }
    ctx.model.check_divides("expert_ffn", etp, kTensorSize, e);
  }

  void install(FeatureRuntime& rt) override {
    const bool split_ffn = rt.config().get_int(kTensorSize) > 1;
    rt.model().layers().replace("moe", "expert_parallel",
                                [split_ffn](const LayerSpec& s, BuildContext& ctx) {
                                  return std::make_shared<ExpertParallelMoe>(s, ctx, split_ffn);
                                });
  }
};

}  // namespace
}  // namespace hp::expert_parallel

HP_FEATURE_PLUGIN(hp::expert_parallel::ExpertParallelFeature)
