// The `tensor_parallel` feature: split every layer kind's weights over
// `size` ranks (the tp mesh dimension), with no change to model code.
#include "backends/dist/mesh.h"
#include "framework/config/config.h"
#include "framework/model/extensions.h"
#include "framework/model/model_info.h"
#include "framework/plugin/feature_runtime.h"
#include "framework/plugin/plugin_export.h"
#include "plugins/tensor_parallel/layers.h"

namespace hp::tensor_parallel {

namespace {

const char* kSize = "features.tensor_parallel.size";
const char* kSequence = "features.tensor_parallel.sequence_parallel";

class TensorParallelFeature : public Feature {
 public:
  void declare_options(Schema& s, const std::string& prefix) const override {
    s.add_int(prefix + "size", 2).range(1, 1024)
        .describe("Ranks each layer's weights are split over (the tp mesh dimension).");
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
    // The sizes the model says a split must divide; the vocabulary may be
    // split unevenly.
    for (const char* role : {"heads", "hidden", "ffn"}) ctx.model.check_divides(role, T, kSize, e);
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

  void plan_mesh(const Config& c, dist::MeshPlan& plan) const override {
    plan.claim("tp", static_cast<int>(c.get_int(kSize)), "tensor_parallel", dist::MeshRole::kSplit);
  }

  void install(FeatureRuntime& rt) override {
    Options o;
    o.sequence_parallel = rt.config().get_bool(kSequence);
    replace_kinds(rt.model().layers(), "tensor_parallel", o);
  }
};

}  // namespace
}  // namespace hp::tensor_parallel

HP_FEATURE_PLUGIN(hp::tensor_parallel::TensorParallelFeature)
