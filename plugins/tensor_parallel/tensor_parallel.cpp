// The `tensor_parallel` feature: split every layer kind's weights over
// `size` ranks (the tp mesh dimension), with no change to model code.
#include "backends/dist/mesh.h"
#include "framework/config/config.h"
#include "framework/model/extensions.h"
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

  void validate(const Config& c, ConfigErrors& e) const override {
    if (!c.ok({kSize})) return;
    const auto T = c.get_int(kSize);
    const std::string t = std::to_string(T);
    if (c.world_size() % T != 0) {
      e.add(kSize, t, "must divide the world size " + std::to_string(c.world_size()),
            "a divisor of " + std::to_string(c.world_size()));
    }
    auto divisible = [&](const char* key, std::int64_t value, const std::string& what) {
      if (value % T != 0) {
        e.add(kSize, t, what + " = " + std::to_string(value) + " (" + key + ") is not divisible by it",
              "a divisor of " + std::to_string(value));
      }
    };
    if (c.ok({"model.hidden", "model.heads", "model.ffn_hidden"})) {
      const auto H = c.get_int("model.hidden");
      const auto F = c.get_int("model.ffn_hidden") == 0 ? 4 * H : c.get_int("model.ffn_hidden");
      if (c.get_string("model.type") == "gpt") divisible("model.heads", c.get_int("model.heads"), "the head count");
      divisible("model.hidden", H, "the hidden size");
      divisible("model.ffn_hidden", F, "the FFN size");
    }
    if (c.ok({kSequence, "model.type"}) && c.get_bool(kSequence) && c.get_string("model.type") == "unet") {
      e.add(kSequence, "true", "the unet model reshapes along the grid (down/up-sampling), which a sequence "
            "split does not follow", "false for model.type unet");
    }
    if (c.ok({kSequence, "model.seq_len"}) && c.get_bool(kSequence) && c.get_int("model.seq_len") % T != 0) {
      e.add(kSize, t, "sequence_parallel needs the sequence length = " +
                          std::to_string(c.get_int("model.seq_len")) + " (model.seq_len) divisible by it",
            "a divisor of " + std::to_string(c.get_int("model.seq_len")));
    }
  }

  void plan_mesh(const Config& c, dist::MeshPlan& plan) const override {
    plan.claim("tp", static_cast<int>(c.get_int(kSize)), "tensor_parallel");
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
