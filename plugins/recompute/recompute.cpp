// The `recompute` feature: drop the inner activations of blocks in forward
// and recompute them in backward, trading compute for memory.
//   granularity: full      -> whole transformer blocks
//                selective -> only the attention core (scores, softmax, values)
//   blocks: all | N        -> every block, or the first N
#include <cstdlib>

#include "hp/config/config.h"
#include "hp/model/extensions.h"
#include "hp/model/model_info.h"
#include "hp/plugin/feature_runtime.h"
#include "hp/plugin/plugin_export.h"
#include "plugins/recompute/checkpoint_function.h"

namespace hp::recompute {

namespace {

const char* kGranularity = "features.recompute.granularity";
const char* kBlocks = "features.recompute.blocks";

/// -1 for "all", else N >= 1; 0 when the text is neither.
long long parse_blocks(const std::string& s) {
  if (s == "all") return -1;
  char* end = nullptr;
  long long n = std::strtoll(s.c_str(), &end, 10);
  return (!s.empty() && *end == '\0' && n >= 1) ? n : 0;
}

class RecomputeFeature : public Feature {
 public:
  void declare_options(Schema& s, const std::string& prefix) const override {
    s.add_enum(prefix + "granularity", "full", {"full", "selective"})
        .describe("full: recompute whole blocks; selective: only the attention core.");
    s.add_string(prefix + "blocks", "all")
        .describe("Which transformer blocks to recompute.")
        .note("all, or N >= 1 for the first N blocks");
  }

  void validate(const FeatureContext& ctx, ConfigErrors& e) const override {
    const Config& c = ctx.config;
    if (!c.ok({kBlocks})) return;
    const auto& b = c.get_string(kBlocks);
    if (parse_blocks(b) == 0) {
      e.add(kBlocks, b, "must be 'all' or a whole number >= 1", "all, 1, 2, ...");
    } else if (const SplitSize* layers = ctx.model.size("layers");
               layers && parse_blocks(b) > layers->value) {
      e.add(kBlocks, b, "is more than " + layers->key + " = " + std::to_string(layers->value),
            "all, or 1 .. " + std::to_string(layers->value));
    }
    if (c.get_string(kGranularity) == "selective" && !ctx.model.uses("attention.heads")) {
      e.add(kGranularity, "selective",
            "needs a model with attention (model '" + ctx.model.name +
                "' has no attention.heads layer)",
            "full");
    }
  }

  void install(FeatureRuntime& rt) override {
    const long long n = parse_blocks(rt.config().get_string(kBlocks));
    WrapperFilter applies = [n](int, const std::string& name) {
      const std::string prefix = "blocks.";
      if (name.compare(0, prefix.size(), prefix) != 0) return false;
      if (n < 0) return true;
      char* end = nullptr;
      const long long index = std::strtoll(name.c_str() + prefix.size(), &end, 10);
      return *end == '\0' && index < n;
    };
    const std::string scope =
        rt.config().get_string(kGranularity) == "full" ? "block" : "attention.core";
    rt.model().add_wrapper(scope, "recompute", &checkpointed, applies);
    // Proof that recompute ran: the regions this rank replayed in the step's
    // backward (0 would mean nothing was recomputed).
    take_replay_count();
    rt.add_hook(StepEvent::kStepEnd, "recompute", [](StepContext& ctx) {
      const auto n = static_cast<double>(take_replay_count());
      if (ctx.figures) (*ctx.figures)["recompute_regions_replayed"] = n;
    });
  }
};

}  // namespace
}  // namespace hp::recompute

HP_FEATURE_PLUGIN(hp::recompute::RecomputeFeature)
