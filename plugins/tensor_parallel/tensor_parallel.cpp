// The `tensor_parallel` feature: split every layer kind's weights over
// `size` ranks (the tp mesh dimension), with no change to model code.
#include <algorithm>

#include "hp/comm/mesh.h"
#include "hp/config/config.h"
#include "hp/model/extensions.h"
#include "hp/model/model_info.h"
#include "hp/plugin/feature_runtime.h"
#include "hp/plugin/plugin_export.h"
#include "plugins/tensor_parallel/layers.h"

namespace hp::tensor_parallel {

namespace {

const char* kSize = "features.tensor_parallel.size";
const char* kSequence = "features.tensor_parallel.sequence_parallel";

/// The module kinds with a degree of their own: option, short name (the
/// prefix of its mesh dimensions), what it is.
struct ModuleKind {
  const char* option;
  const char* kind;
  const char* prefix;
  const char* what;
  const char* layer;  ///< the model's layer kind it re-lays out (ModelInfo::uses)
  const char* absent; ///< when a language model builds none of it, why (or "")
};
const ModuleKind kModules[] = {
    {"attention_size", "attention", "attn", "attention (qkv and output projections, by whole heads)",
     "attention.heads", ""},
    {"ffn_size", "ffn", "ffn", "the dense FFN (and a MoE layer's shared experts)", "mlp",
     "; every layer is a MoE layer without shared experts"},
    {"embedding_size", "embedding", "embed", "the token embedding (vocabulary split, uneven allowed)",
     "embedding.vocab", ""},
    {"lm_head_size", "lm_head", "head", "the LM head and its vocabulary-parallel loss", "loss.cross_entropy", ""},
};
std::string key_of(const ModuleKind& m) { return std::string("features.tensor_parallel.") + m.option; }

/// A module kind's degree: its option, or `size` when 0.
std::int64_t degree(const Config& c, const ModuleKind& m) {
  const auto d = c.get_int(key_of(m));
  return d == 0 ? c.get_int(kSize) : d;
}
/// The mesh dimensions of a module kind's view: the stream's tp (inner) x
/// the data-parallel neighbours it gathers (outer) x the rest of dp.
ModuleDims dims_of(const ModuleKind& m) {
  const std::string p = m.prefix;
  return {p + "_tp_inner", p + "_tp_outer", p + "_tp"};
}
std::string remainder_of(const ModuleKind& m) { return std::string(m.prefix) + "_dp"; }

class TensorParallelFeature : public Feature {
 public:
  void declare_options(Schema& s, const std::string& prefix) const override {
    s.add_int(prefix + "size", 2).range(1, 1024)
        .describe("Ranks each layer's weights are split over (the tp mesh dimension): the residual stream's "
                  "degree, and every module kind's whose own size is 0.");
    for (const auto& m : kModules) {
      s.add_int(prefix + m.option, 0)
          .range(0, 1024)
          .describe(std::string("Tensor-parallel degree of ") + m.what +
                    "; 0: size. A multiple of size: the module gathers the samples of degree / size "
                    "neighbouring data-parallel ranks and splits its weights degree ways.");
    }
    s.add_bool(prefix + "sequence_parallel", false)
        .describe("Split the activations between the parallel regions (LayerNorm, dropout, residual) "
                  "along the sequence over tp: all-gather before and reduce-scatter after each region "
                  "instead of all-reduce. Needs model.seq_len divisible by size.");
  }

  void validate(const FeatureContext& ctx, ConfigErrors& e) const override {
    const Config& c = ctx.config;
    if (!c.ok({kSize})) return;
    const auto T = c.get_int(kSize);
    if (c.world_size() % T != 0) {
      e.add(kSize, std::to_string(T), "must divide the world size " + std::to_string(c.world_size()),
            "a divisor of " + std::to_string(c.world_size()));
    }
    for (const auto& m : kModules)
      if (!c.ok({key_of(m).c_str()})) return;
    // The sizes the model says a split must divide (heads by attention's
    // degree, the FFN width by the FFN's); the vocabulary may be split unevenly.
    ctx.model.check_divides("hidden", T, kSize, e);
    ctx.model.check_divides("heads", degree(c, kModules[0]), option_key(c, kModules[0]), e);
    ctx.model.check_divides("ffn", degree(c, kModules[1]), option_key(c, kModules[1]), e);
    validate_kv_heads(ctx, T, e);
    validate_modules(ctx, T, e);
    if (c.ok({kSequence}) && c.get_bool(kSequence)) {
      if (!ctx.model.size("sequence")) {
        e.add(kSequence, "true",
              "model '" + ctx.model.name + "' cannot be split along its sequence (it states no sequence size; "
              "the unet reshapes along its grid)",
              "false for model " + ctx.model.name);
      } else if (ctx.model.uses("moe")) {
        e.add(kSequence, "true",
              "a mixture-of-experts model routes and balances per whole sequence, which a sequence split does not "
              "see (not supported yet)",
              "false for a model with experts");
      } else if (ctx.model.size("sequence")->value % T != 0) {
        const SplitSize& s = *ctx.model.size("sequence");
        e.add(kSize, std::to_string(T),
              "sequence_parallel needs the sequence length = " + std::to_string(s.value) + " (" + s.key +
                  ") divisible by it",
              "a divisor of " + std::to_string(s.value));
      }
    }
  }

  /// Grouped-query attention: key/value heads are split over attention's
  /// degree when it divides them, and shared (each by degree / kv_heads
  /// ranks, its gradient summed over them) when they divide it.
  static void validate_kv_heads(const FeatureContext& ctx, std::int64_t T, ConfigErrors& e) {
    const Config& c = ctx.config;
    const auto A = degree(c, kModules[0]);
    const std::string key = option_key(c, kModules[0]);
    if (const SplitSize* kv = ctx.model.size("kv_heads")) {
      const std::int64_t n = kv->value;
      if (n % A != 0 && A % n != 0) {
        e.add(key, std::to_string(A),
              "the key/value head count = " + std::to_string(n) + " (" + kv->key +
                  ") neither is divisible by it nor divides it: key/value heads are split over the attention's "
                  "ranks, or shared by whole groups of them",
              "a divisor or a multiple of " + std::to_string(n) + " (that divides the head count)");
      } else if (n % A != 0 && A > T) {
        e.add(key, std::to_string(A),
              "sharing the " + std::to_string(n) + " key/value heads (" + kv->key +
                  ") over an attention degree above features.tensor_parallel.size = " + std::to_string(T) +
                  " is not supported yet",
              "a divisor of " + std::to_string(n) + ", or the stream's size");
      }
    }
    if (ctx.model.uses("norm.heads") && A > T) {
      e.add(key, std::to_string(A),
            "a model with a QK-norm (model.qk_norm) runs attention at the stream's degree only (not supported yet "
            "above features.tensor_parallel.size = " + std::to_string(T) + ")",
            "0 (= size)");
    }
  }

  /// The key a module kind's degree comes from: its own option, or size.
  static std::string option_key(const Config& c, const ModuleKind& m) {
    return c.get_int(key_of(m)) == 0 ? std::string(kSize) : key_of(m);
  }

  /// Per-module degrees: each a multiple of the stream's, gathering from
  /// neighbours that exist, on a model and mesh the re-layout handles.
  static void validate_modules(const FeatureContext& ctx, std::int64_t T, ConfigErrors& e) {
    const Config& c = ctx.config;
    const bool language_model =
        ctx.model.uses("embedding.vocab") && (ctx.model.uses("mlp") || ctx.model.uses("attention.heads"));
    std::vector<const ModuleKind*> above;
    for (const auto& m : kModules) {
      const auto D = degree(c, m);
      if (D == T) continue;
      const std::string v = std::to_string(D);
      if (D % T != 0) {
        e.add(key_of(m), v,
              "must be a multiple of features.tensor_parallel.size = " + std::to_string(T) +
                  " (the residual stream's degree: a module gathers the samples of degree / size data-parallel "
                  "neighbours)",
              "0 (= size) or a multiple of " + std::to_string(T));
        continue;
      }
      if (c.world_size() % D != 0) {
        e.add(key_of(m), v, "must divide the world size " + std::to_string(c.world_size()),
              "0 (= size) or a divisor of " + std::to_string(c.world_size()) + " that is a multiple of " +
                  std::to_string(T));
        continue;
      }
      // (A model of none of these kinds is refused whole, below.)
      if (language_model && !ctx.model.uses(m.layer)) {
        e.add(key_of(m), v,
              "model '" + ctx.model.name + "' builds no " + m.layer + " layer for this degree to split (" + m.what +
                  m.absent + ")",
              "0 (= size)");
        continue;
      }
      // That degree / size divides the data-parallel size of a stage is the
      // mesh's own rule (the view is refused when resolved), so a stage
      // with too few replicas is reported there, never here.
      above.push_back(&m);
    }
    if (above.empty()) return;
    const ModuleKind& first = *above.front();
    const std::string v = std::to_string(degree(c, first));
    if (!language_model) {
      e.add(key_of(first), v,
            "model '" + ctx.model.name + "' is not a language model built from embedding, attention or FFN and "
            "LM head kinds, which per-module degrees re-lay out",
            "0 (= size) for model " + ctx.model.name);
    }
    for (const auto& [dim, claim] : ctx.mesh.claims) {
      if (claim.role == dist::MeshRole::kSequence) {
        e.add(key_of(first), v,
              "per-module degrees with " + claim.by + " (" + dim +
                  ") are not supported yet: a module gathers whole samples of its neighbours",
              "0 (= size), or disable " + claim.by);
      }
    }
    const std::string& order = ctx.mesh.order;
    const auto dims = dist::order_dims(order);
    const auto tp_at = std::find(dims.begin(), dims.end(), "tp");
    const auto dp_at = std::find(dims.begin(), dims.end(), dist::ProcessMesh::data_dim());
    if (tp_at != dims.end() && dp_at != dims.end() && dp_at < tp_at) {
      e.add("distributed.mesh_order", order,
            "per-module tensor-parallel degrees need tp inside dp (a module's ranks are the stream's tp ranks "
            "of neighbouring data-parallel replicas)",
            "an order with tp before dp, e.g. tp-dp-pp, or \"\" (by role)");
    }
    if (!ctx.model.shared_parameter_key.empty() &&
        degree(c, kModules[2]) != degree(c, kModules[3])) {
      e.add(option_key(c, kModules[3]), std::to_string(degree(c, kModules[3])),
            "the LM head shares the token embedding's weight (" + ctx.model.shared_parameter_key +
                "), so its degree must equal the embedding's, " + std::to_string(degree(c, kModules[2])),
            "the embedding's degree, or " + ctx.model.shared_parameter_key + ": false");
    }
  }

  void plan_mesh(const Config& c, dist::MeshPlan& plan) const override {
    const int T = static_cast<int>(c.get_int(kSize));
    plan.claim("tp", T, "tensor_parallel", dist::MeshRole::kSplit);
    // A module above the stream's degree: a view of the tp x dp ranks as
    // the stream's tp (inner) x the neighbours it gathers (outer) x the rest.
    for (const auto& m : kModules) {
      const auto D = degree(c, m);
      // The stream's own, or refused by validate.
      if (D == T || D % T != 0 || c.world_size() % D != 0) continue;
      const ModuleDims d = dims_of(m);
      plan.view(dist::MeshView{std::string("tensor_parallel.") + m.kind,
                               {"tp", dist::ProcessMesh::data_dim()},
                               {{d.inner, T, dist::MeshRole::kSplit, "tensor_parallel"},
                                {d.outer, static_cast<int>(D / T), dist::MeshRole::kSplit, "tensor_parallel"},
                                {remainder_of(m), 0, dist::MeshRole::kReplicate, "tensor_parallel"}},
                               "tensor_parallel"});
      plan.flatten(d.flat, {d.inner, d.outer}, "tensor_parallel");
    }
  }

  void install(FeatureRuntime& rt) override {
    Options o;
    o.sequence_parallel = rt.config().get_bool(kSequence);
    for (const auto& m : kModules)
      if (degree(rt.config(), m) != rt.config().get_int(kSize)) o.modules[m.kind] = dims_of(m);
    replace_kinds(rt.model().layers(), "tensor_parallel", o);
  }
};

}  // namespace
}  // namespace hp::tensor_parallel

HP_FEATURE_PLUGIN(hp::tensor_parallel::TensorParallelFeature)
