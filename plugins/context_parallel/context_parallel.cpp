// The `context_parallel` feature: every sequence split over `size` ranks (the
// cp mesh dimension, role "sequence": parameters replicated, gradients
// summed over it as over data parallel, the batch not split over it). The
// sequence is cut into 2 x size chunks and rank r holds chunks r and
// 2 size - 1 - r, so every rank gets the same share of causal attention work;
// attention reaches the other ranks' keys and values by ring attention. The
// framework follows the layout this feature sets (the batch cut, position
// rows, dropout masks by global position, the loss summed over cp).
#include <string>

#include "hp/comm/context.h"
#include "hp/comm/mesh.h"
#include "hp/config/config.h"
#include "hp/model/extensions.h"
#include "hp/model/model_info.h"
#include "hp/plugin/feature_runtime.h"
#include "hp/plugin/plugin_export.h"
#include "plugins/context_parallel/ring_attention.h"

namespace hp::context_parallel {

namespace {

const char* kSize = "features.context_parallel.size";
const char* kBlock = "features.context_parallel.block";
const char* kDim = "cp";

class ContextParallelFeature : public Feature {
 public:
  void declare_options(Schema& s, const std::string& prefix) const override {
    s.add_int(prefix + "size", 2).range(1, 1024)
        .describe("Ranks every sequence is split over (the cp mesh dimension): each holds 2 of 2 x size chunks, "
                  "chunk r and chunk 2 x size - 1 - r. Needs model.seq_len divisible by 2 x size.");
    s.add_int(prefix + "block", 128).range(1, 1048576)
        .describe("Query and key block length inside each chunk of ring attention: no score matrix is larger than "
                  "block x block (need not divide the chunk).");
  }

  void validate(const FeatureContext& ctx, ConfigErrors& e) const override {
    const Config& c = ctx.config;
    if (!c.ok({kSize})) return;
    const auto cp = c.get_int(kSize);
    const std::string value = std::to_string(cp);
    if (c.world_size() % cp != 0) {
      e.add(kSize, value, "must divide the world size " + std::to_string(c.world_size()),
            "a divisor of " + std::to_string(c.world_size()));
    }
    const SplitSize* seq = ctx.model.size("sequence");
    if (!seq || !ctx.model.uses("attention.heads")) {
      e.add(kSize, value,
            "model '" + ctx.model.name + "' is not a sequence model with attention (context parallel splits the "
            "positions that attention connects)",
            "disable features.context_parallel for model " + ctx.model.name);
      return;
    }
    if (seq->value % (2 * cp) != 0) {
      e.add(kSize, value,
            "needs the sequence length = " + std::to_string(seq->value) + " (" + seq->key +
                ") divisible by 2 x size = " + std::to_string(2 * cp),
            "a size whose double divides " + std::to_string(seq->value));
    }
  }

  void plan_mesh(const Config& c, dist::MeshPlan& plan) const override {
    plan.claim(kDim, static_cast<int>(c.get_int(kSize)), "context_parallel", dist::MeshRole::kSequence);
  }

  void install(FeatureRuntime& rt) override {
    dist::Group& g = rt.dist().group(kDim);
    if (g.size() == 1) return;  // one rank holds whole sequences: nothing to lay out
    rt.model().set_sequence_layout("context_parallel", balanced_layout(g, rt.config().get_int(kBlock)));
    // Where the ring's time went this step: block compute, and waits for a
    // message still in flight (the rest of its transfer hid behind compute).
    take_ring_times();
    rt.add_hook(StepEvent::kStepEnd, "context_parallel", [](StepContext& ctx) {
      const RingTimes t = take_ring_times();
      if (!ctx.figures) return;
      (*ctx.figures)["cp_ring_compute_seconds"] = t.compute_seconds;
      (*ctx.figures)["cp_ring_wait_seconds"] = t.wait_seconds;
      (*ctx.figures)["cp_ring_steps"] = static_cast<double>(t.steps);
    });
  }
};

}  // namespace
}  // namespace hp::context_parallel

HP_FEATURE_PLUGIN(hp::context_parallel::ContextParallelFeature)
