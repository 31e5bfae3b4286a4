// The `mixed_precision` feature: bf16 compute copies of the weights and bf16
// activations between layers, fp32 master weights, gradients and optimizer
// state (docs/rfc/0014-mixed-precision.md). It sets the precision policy the
// layers, the gradient reducer and ZeRO read; the policy op by op is in the
// RFC. Options use FSDP2's words: param_dtype, reduce_dtype.
#include "hp/comm/context.h"
#include "hp/config/config.h"
#include "hp/config/errors.h"
#include "hp/config/schema.h"
#include "hp/logging/logging.h"
#include "hp/model/extensions.h"
#include "hp/model/model_info.h"
#include "hp/model/precision.h"
#include "hp/plugin/feature_runtime.h"
#include "hp/plugin/plugin_export.h"

namespace hp::mixed_precision {

namespace {

const char* kParam = "features.mixed_precision.param_dtype";
const char* kReduce = "features.mixed_precision.reduce_dtype";
const char* kKernel = "features.mixed_precision.product_kernel";

at::ScalarType dtype_of(const std::string& s) { return s == "bf16" ? at::kBFloat16 : at::kFloat; }

class MixedPrecisionFeature : public Feature {
 public:
  void declare_options(Schema& s, const std::string& prefix) const override {
    s.add_enum(prefix + "param_dtype", "bf16", {"bf16", "fp32"})
        .describe("Type of the weights' compute copies and of the activations between layers; the master "
                  "weights, their gradients and the optimizer state stay fp32.")
        .note("fp16 and fp8 are not supported");
    s.add_enum(prefix + "reduce_dtype", "fp32", {"fp32", "bf16"})
        .describe("Type gradients cross ranks in when they are summed (bf16: half the bytes, summed in fp32 "
                  "where they arrive; the result is fp32 again).");
    s.add_enum(prefix + "product_kernel", "auto", {"auto", "native", "widen"})
        .describe("How products of bf16 operands run: native = ATen's bf16 product (oneDNN; bf16 instructions "
                  "on a CPU with AVX512_BF16, a slow reference loop on a CPU without AVX-512); widen = the "
                  "operands widened to fp32 for the fp32 BLAS, the result rounded to bf16; auto = native "
                  "where the CPU has AVX512_BF16, else widen.");
  }

  void validate(const FeatureContext& ctx, ConfigErrors& e) const override {
    if (!ctx.model.uses("embedding.vocab")) {
      e.add("features.mixed_precision.enabled", "true",
            "needs a model whose token embedding starts the activation stream (model '" + ctx.model.name +
                "' has no embedding.vocab layer)",
            "false, or model.type: gpt | mlp");
    }
  }

  void install(FeatureRuntime& rt) override {
    const Config& c = rt.config();
    PrecisionPolicy p;
    p.param_dtype = dtype_of(c.get_string(kParam));
    p.reduce_dtype = dtype_of(c.get_string(kReduce));
    rt.model().set_precision("mixed_precision", p);
    const std::string kernel = c.get_string(kKernel);
    const bool bf16_cpu = precision::cpu_has_avx512_bf16();
    const auto k = kernel == "native" || (kernel == "auto" && bf16_cpu) ? precision::ProductKernel::kNative
                                                                         : precision::ProductKernel::kWiden;
    precision::set_product_kernel(k);
    if (rt.dist().rank() != 0) return;
    auto log = log::logger();
    log->info("mixed precision: compute copies and activations {}, gradient sums in {}, masters and optimizer "
              "state fp32; bf16 products: {} ({})",
              dtype_name(p.param_dtype), dtype_name(p.reduce_dtype), precision::to_string(k), kernel);
    if (!p.mixed() || bf16_cpu) return;
    if (k == precision::ProductKernel::kWiden) {
      log->warn("mixed precision: this CPU lacks avx512_bf16, so bf16 products run on the fp32 BLAS (operands "
                "widened, results rounded): expect about fp32's speed, not bf16's (~2x on an avx512_bf16 CPU); "
                "activation memory and communicated bytes are still halved");
    } else {
      log->warn("mixed precision: {} native on a CPU without avx512_bf16: ATen's bf16 products run a slow path "
                "here (measured 16x slower than fp32 without AVX-512); product_kernel: widen runs at fp32's speed",
                kKernel);
    }
  }
};

}  // namespace

}  // namespace hp::mixed_precision

HP_FEATURE_PLUGIN(hp::mixed_precision::MixedPrecisionFeature)
