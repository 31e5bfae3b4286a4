// The `zero` feature (ZeRO stages 1, 2 and 3): optimizer state (stage 1),
// gradients (stage 2) and parameters (stage 3) sharded over the
// replicating groups. A stage is a composition (Composition::of_stage) of
// three units working from one setup (slices.h: every parameter cut over
// its shard group, the buckets):
//  - the sharded optimizer state (sharded_optimizer.h), every stage;
//  - gradient slicing and reduction (grad_slicer.h): the gradients' partial
//    sums redistributed to this rank's slices, the full gradients kept
//    (stage 1) or released once sent (stages 2 and 3);
//  - the parameters' residency (param_residency.h): whole, the updated
//    slices gathered after the step (stages 1 and 2), or released between
//    uses and gathered per block with prefetch (stage 3).
// The numbers are stage 1's at every stage, bitwise (the same sums).
#include "hp/memory/block_cache.h"
#include "hp/memory/large_pool.h"
#include "hp/config/config.h"
#include "hp/metrics/registry.h"
#include "hp/model/extensions.h"
#include "hp/plugin/feature_runtime.h"
#include "hp/plugin/plugin_export.h"
#include "plugins/zero/grad_slicer.h"
#include "plugins/zero/param_residency.h"
#include "plugins/zero/sharded_optimizer.h"
#include "plugins/zero/slices.h"

namespace hp::zero {

namespace {

const char* kStage = "features.zero.stage";
const char* kPerMicroBatch = "features.zero.reduce_per_micro_batch";

class ZeroFeature : public Feature {
 public:
  void declare_options(Schema& s, const std::string& prefix) const override {
    s.add_int(prefix + "stage", 1).range(1, 3)
        .describe("ZeRO stage: 1 shards the optimizer state over the data-parallel replicas; 2 also the gradients "
                  "(a rank keeps only its slices' gradients once they are reduce-scattered); 3 also the parameters "
                  "(each block's are gathered before its forward and its backward, and released after). Every "
                  "stage computes stage 1's numbers bitwise when the gradients are reduced once a step "
                  "(reduce_per_micro_batch: false); per micro-batch (the default) within the parity bars.");
    s.add_int(prefix + "prefetch", 1).range(0, 64)
        .describe("Stage 3: how many blocks ahead (in forward; behind, in backward) a block's parameter gather is "
                  "issued while the current block computes.");
    s.add_bool(prefix + "block_cache", true)
        .describe("Stage 3: serve blocks of 256 KiB and more (a gathered block's storage, its gather buffers, the "
                  "activations) from mappings of their own, freed ones kept for reuse by size class (eight per "
                  "doubling, so an MoE's routing-sized buffers are reused too), instead of "
                  "glibc's heap, where blocks gathered and freed between the activations fragment it and the "
                  "process holds far more than it uses. Not used when run.large_block_pool's pool is in place (it "
                  "keeps freed blocks for reuse itself, with less memory).")
        .note("12 x 768 GPT, dp=2: peak resident memory 2152 -> 1487 MiB (bench/results/bench_zero.md)");
    s.add_int(prefix + "block_cache_mb", 256)
        .range(0, 1 << 20)
        .describe("Stage 3 with block_cache: at most this many MiB of freed blocks kept for reuse (the oldest are "
                  "unmapped first; blocks a whole step did not ask for go back after it). 0 keeps none: the least "
                  "memory, every large block mapped and faulted in anew. When a rank sums the full gradients of "
                  "several micro-batches (reduce_per_micro_batch: false) the cache keeps their bytes on top: they "
                  "are in use at the peak anyway, and otherwise they are faulted in anew every step.")
        .note("12 x 768 GPT, dp=2: step 1.10-1.21x -> 1.00-1.05x plain dp's with the gradients kept on top, "
              "peak unchanged (bench/results/bench_zero.md)");
    s.add_bool(prefix + "reduce_per_micro_batch", true)
        .describe("Stages 2 and 3: reduce-scatter each micro-batch's gradients as soon as its backward has produced "
                  "them and add the slices up (as DeepSpeed and FSDP do), so no rank holds full gradients across "
                  "micro-batches: the sums run in another order than stage 1's, within the parity bars, not bitwise. "
                  "false sums the micro-batches locally first and reduces once: stage 1's numbers bitwise, the full "
                  "gradients held until the last micro-batch. Stage 1 (which keeps the full gradients) and "
                  "distributed.overlap: false (the rounds are launched from backward) reduce once.")
        .note("12 x 768 GPT, dp=2, 2 micro-batches a rank: training peak of plain dp's 0.92x (once a step) -> "
              "0.76x at stage 2, 0.81x -> 0.63x at stage 3 (bench/results/bench_zero.md)");
    s.add_bool(prefix + "reshard_after_forward", true)
        .describe("Stage 3: release a block's gathered parameters after its forward (gathered again for its "
                  "backward); false keeps them until the step's end: less communication, more memory.");
  }

  // Stage 1 with reduce_per_micro_batch: true (the default) reduces once a
  // step, said in the option's text. It is not refused when set: a run's
  // resolved config.yaml states every default, and it must run again.

  void install(FeatureRuntime& rt) override {
    const Config& c = rt.config();
    ZeroOptions o;
    o.parts = Composition::of_stage(static_cast<int>(c.get_int(kStage)));
    o.prefetch = static_cast<int>(c.get_int("features.zero.prefetch"));
    o.reshard_after_forward = c.get_bool("features.zero.reshard_after_forward");
    o.per_micro_batch = c.get_bool(kPerMicroBatch);
    // The large block pool (run.large_block_pool) already keeps freed blocks
    // for reuse, best fit: the cache on top of it held more (GPT 4 x 256 at
    // dp=2, micro-batch 4: 157 against 142 MiB above start, MoE GPT 512
    // against 497; step time the same).
    const bool block_cache = o.parts.shard_params && c.get_bool("features.zero.block_cache") &&
                             !memory::large_block_pool_installed();
    o.block_cache_bytes = block_cache ? static_cast<std::size_t>(c.get_int("features.zero.block_cache_mb")) << 20 : 0;
    if (block_cache) memory::use_block_cache(kBlockCacheMin, o.block_cache_bytes);
    metrics::Gauge* gauge = rt.has_metrics()
        ? &rt.metrics().gauge("hp_zero_optimizer_state_bytes", "Optimizer state bytes this rank holds under zero.")
        : nullptr;
    // The one setup: the slices and the parameters' residency, made once
    // for the run's parameters by whichever collaborator is asked for first
    // (the optimizer, then the reducer, for the same parameters), from the
    // options read here.
    auto units = std::make_shared<Units>();
    // The precision policy is read when the model exists (whichever
    // feature sets it may install after this one).
    const ModelExtensions* model = &rt.model();
    auto setup = [units, o, model](const std::vector<ParamEntry>& params, dist::DistributedContext& d) {
      if (!units->plan) {
        ZeroOptions with = o;
        with.reduce_dtype = model->precision().reduce_dtype;
        with.param_dtype = model->precision().param_dtype;
        units->plan = std::make_shared<SlicePlan>(params, d, with);
        units->residency = make_param_residency(units->plan);
      }
    };
    rt.set_optimizer("zero", [units, setup, gauge](const OptimizerOptions& opt, const std::vector<ParamEntry>& params,
                                                   dist::DistributedContext& d) -> std::unique_ptr<Optimizer> {
      setup(params, d);
      auto out = make_sharded_optimizer(opt, units->plan, units->residency);
      if (gauge) gauge->set(static_cast<double>(out->state_bytes()));
      return out;
    });
    rt.set_grad_reducer("zero", [units, setup](const ReducerOptions& ro, const std::vector<ParamEntry>& params,
                                               dist::DistributedContext& d) -> std::unique_ptr<GradReducer> {
      setup(params, d);
      // The reducer's options are the runtime's (distributed.bucket_size_mb
      // and distributed.overlap, unless a caller gives others); nothing has
      // read them yet.
      units->plan->options.bucket_bytes = ro.bucket_bytes;
      units->plan->options.overlap = ro.overlap;
      return make_grad_slicer(units->plan, units->residency);
    });
    // The parameters' residency follows the blocks; a step starts from the
    // slices; a save, an evaluation or a load reads or writes whole ones.
    BlockObserver watch;
    watch.before = [units](int block) {
      if (units->residency) units->residency->before_block(block);
    };
    watch.after = [units](int block, const Activations& in, const Activations& out) {
      if (units->residency) units->residency->after_block(block, in, out);
    };
    rt.model().add_block_observer("zero", watch);
    rt.add_hook(StepEvent::kStepBegin, "zero", [units](StepContext&) {
      if (units->residency) units->residency->step_begin();
    });
    for (StepEvent e : {StepEvent::kSave, StepEvent::kEval, StepEvent::kLoad}) {
      rt.add_hook(e, "zero", [units, e](StepContext&) {
        if (!units->residency) return;
        units->residency->wait_all();
        if (e != StepEvent::kEval) units->residency->materialize();
      });
    }
  }

 private:
  struct Units {
    std::shared_ptr<SlicePlan> plan;
    std::shared_ptr<ParamResidency> residency;
  };
};

}  // namespace
}  // namespace hp::zero

HP_FEATURE_PLUGIN(hp::zero::ZeroFeature)
