#include "framework/trainer/executor.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

namespace hp {

namespace {

class SequentialExecutor : public StepExecutor {
 public:
  std::vector<int> place(const ModelDescription& desc) override {
    std::vector<int> all(desc.blocks.size());
    for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int>(i);
    return all;
  }
  bool computes_loss() const override { return true; }
  StepReport run(BuiltModel& model, const StepWork& work) override {
    StepReport r;
    c10::AutoGradMode grad(work.backward);
    for (std::int64_t mb = 0; mb < work.micro_batches; ++mb) {
      Batch b = work.batch(mb);
      auto out = model.forward(make_activations({{"tokens", b.tokens}}));
      auto lo = model.loss->forward(out, b.targets);
      if (work.after_forward) work.after_forward();
      if (work.backward) (lo.sum * work.loss_scale).backward();
      r.loss_sum += lo.sum.item<double>();
      r.tokens += static_cast<double>(lo.count);
    }
    return r;
  }
};

}  // namespace

std::unique_ptr<StepExecutor> make_sequential_executor() { return std::make_unique<SequentialExecutor>(); }

}  // namespace hp
