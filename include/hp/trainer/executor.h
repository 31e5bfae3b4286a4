#pragma once
// How one step runs the model's blocks over the micro-batches. The default
// (sequential) executor builds every block and runs each micro-batch's
// forward then backward in turn. A feature may install its own through
// FeatureRuntime::set_executor: pipeline_parallel builds only its stage's
// blocks and runs a pipeline schedule.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hp/data/dataset.h"
#include "hp/model/dropout.h"
#include "hp/model/model.h"

namespace hp {

class AuxLossScope;  // include/hp/model/aux_loss.h

/// What the trainer asks of one step (or one evaluation).
struct StepWork {
  std::int64_t micro_batches = 0;
  /// Micro-batch `mb` of this rank's share of the global batch.
  std::function<Batch(std::int64_t mb)> batch;
  /// Each micro-batch's loss sum is multiplied by this before backward
  /// (1 / global tokens, so gradients are the per-token mean).
  double loss_scale = 1.0;
  /// False for evaluation: forward only, no autograd graph.
  bool backward = true;
  /// Called after each forward that produced a loss (the after_forward hook).
  std::function<void()> after_forward;
  /// Called after a deferred weight gradient is summed into a parameter's
  /// .grad (zero-bubble schedules' W): the reducer's cue, as autograd's
  /// accumulation hooks are for the others. May be empty.
  std::function<void(const at::Tensor& param)> weight_ready;
  /// The step, and the global index of micro-batch `mb`'s first sample: an
  /// executor computes each micro-batch under DropoutSiteGuard({step,
  /// first_sample(mb)}) (include/hp/model/dropout.h).
  std::int64_t step = 0;
  std::function<std::int64_t(std::int64_t mb)> first_sample;
  /// With `data.document_attention`: micro-batch `mb`'s document numbers
  /// ([samples, seq] by global position), put in its dropout site; empty
  /// otherwise.
  std::function<at::Tensor(std::int64_t mb)> documents;
};

/// The dropout site of micro-batch `mb` of `work`.
DropoutSite dropout_site(const StepWork& work, std::int64_t mb);

struct StepReport {
  /// Summed per-token loss and token count of this rank's micro-batches
  /// (both 0 on ranks that do not compute the loss).
  double loss_sum = 0;
  double tokens = 0;
  /// Auxiliary loss sums by name, over the micro-batches this rank ran
  /// (blocks on any stage may add them).
  std::map<std::string, double> aux_sums;
  /// Executor figures of the step, exported as gauges `hp_<name>` and
  /// written to metrics.jsonl (e.g. pipeline_idle_fraction).
  std::map<std::string, double> figures;
};

/// What a step of `micro_batches` micro-batches looks like from this rank,
/// known before it runs (hp-plan and hp-train --dry-run ask).
struct StepShape {
  /// The most micro-batches whose activations this rank holds at once, in
  /// units of all its blocks (a chunk of an interleaved stage counts its
  /// share).
  double in_flight = 1;
  /// The share of the step this rank waits, with a forward costing 1 and a
  /// backward 2 everywhere (the schedule's own bubble).
  double idle_fraction = 0;
  /// Zero-bubble schedules: the most micro-batches (same units as
  /// in_flight) whose B ran and whose W waits, holding their layers'
  /// output gradients; 0 otherwise.
  double weight_pending = 0;
};

class StepExecutor {
 public:
  virtual ~StepExecutor() = default;
  /// The step's shape; the sequential one: one micro-batch at a time, no wait.
  virtual StepShape shape(int micro_batches) const {
    (void)micro_batches;
    return {};
  }
  /// The step's schedule for every rank that runs it, as a table (one line
  /// per stage: its forwards, backwards and weight-gradient actions in
  /// order), for --dry-run; the sequential one: each micro-batch's
  /// forward then backward.
  virtual std::string describe_schedule(int micro_batches) const;
  /// Indices (model order) of the blocks this rank builds.
  virtual std::vector<int> place(const ModelDescription& desc) = 0;
  /// Whether this rank computes the loss (and so builds the loss block).
  virtual bool computes_loss() const = 0;
  /// Runs forward (and backward) of every micro-batch of the step.
  virtual StepReport run(BuiltModel& model, const StepWork& work) = 0;
};

/// Every block on this rank; micro-batches one after the other.
std::unique_ptr<StepExecutor> make_sequential_executor();

/// Adds what an AuxLossScope collected to `report.aux_sums` and returns its
/// total times `scale` (undefined when nothing was added). For executors
/// that back-propagate a chunk's auxiliary losses with its outputs.
at::Tensor take_aux_losses(const AuxLossScope& scope, double scale, StepReport& report);

}  // namespace hp
