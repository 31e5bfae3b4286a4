#include "hp/trainer/executor.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <optional>

#include "hp/comm/flight_recorder.h"
#include "hp/profile/trace.h"
#include "hp/model/aux_loss.h"

namespace hp {

at::Tensor take_aux_losses(const AuxLossScope& scope, double scale, StepReport& report) {
  for (const auto& [name, v] : scope.items()) report.aux_sums[name] += v.detach().item<double>();
  at::Tensor total = scope.total();
  return total.defined() ? total * scale : total;
}

DropoutSite dropout_site(const StepWork& work, std::int64_t mb) {
  return {work.step, work.first_sample ? work.first_sample(mb) : 0,
          work.documents ? work.documents(mb) : at::Tensor()};
}

std::string StepExecutor::describe_schedule(int micro_batches) const {
  std::string out = "schedule sequential: 1 rank, " + std::to_string(micro_batches) +
                    " micro-batch" + (micro_batches == 1 ? "" : "es") +
                    " (F forward, B backward; chunk.micro-batch)\n  rank 0:";
  for (int mb = 0; mb < micro_batches; ++mb) {
    out += " F0." + std::to_string(mb) + " B0." + std::to_string(mb);
  }
  return out + "\n";
}

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
      namespace flight = dist::flight;
      flight::set_phase(work.backward ? flight::Phase::kForward : flight::Phase::kEval, static_cast<int>(mb));
      profile::Span fwd(work.backward ? "compute" : "eval", "forward");
      fwd.arg("mb", mb).arg("chunk", 0);
      DropoutSiteGuard site(dropout_site(work, mb));
      Batch b = work.batch(mb);
      // Auxiliary losses (and the statistics behind them) belong to training
      // steps only, not to evaluation.
      std::optional<AuxLossScope> aux;
      if (work.backward) aux.emplace();
      auto out = model.forward(b.inputs);
      auto lo = model.loss->forward(out, b.targets);
      at::Tensor extra = aux ? take_aux_losses(*aux, work.loss_scale, r) : at::Tensor();
      if (work.after_forward) work.after_forward();
      fwd.end();
      if (work.backward) {
        flight::set_phase(flight::Phase::kBackward, static_cast<int>(mb));
        profile::Span bwd("compute", "backward");
        bwd.arg("mb", mb).arg("chunk", 0);
        at::Tensor total = lo.sum * work.loss_scale;
        if (extra.defined()) total = total + extra;
        total.backward();
      }
      r.loss_sum += lo.sum.item<double>();
      r.tokens += static_cast<double>(lo.count);
    }
    return r;
  }
};

}  // namespace

std::unique_ptr<StepExecutor> make_sequential_executor() { return std::make_unique<SequentialExecutor>(); }

}  // namespace hp
