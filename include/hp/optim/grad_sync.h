#pragma once
// The gradient reducer collaborator: what happens to gradients between
// backward and the optimizer step. The built-in one all-reduces them in
// buckets over each parameter's grad_sync dimensions; a feature (zero) may
// reduce-scatter instead. Clipping and the global norm work from the
// ShardSpecs and the mesh roles, so a replicated parameter counts once, a
// split one is summed over its split groups, and every pipeline stage
// (partition) contributes.
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hp/comm/redistribute.h"
#include "hp/model/build_context.h"

namespace hp {

namespace dist {
class DistributedContext;
}

struct ReducerOptions {
  double bucket_bytes = 25.0 * 1024 * 1024;
  /// Launch each bucket's reduction during backward, as soon as its last
  /// gradient is accumulated (false: all of them after backward). The
  /// trainer sets it from `distributed.overlap`, whose default is true; false
  /// here is for a caller that builds a reducer itself and runs no hooks.
  bool overlap = false;
  /// After the first step, cut the buckets again in the order the gradients
  /// arrived in (with overlap; the trainer sets it from
  /// `distributed.rebuild_buckets`).
  bool rebuild_buckets = false;
  /// Gradients (fp32) are summed across ranks in this type (bf16: half the
  /// bytes, summed in fp32 where they arrive; PrecisionPolicy::reduce_dtype).
  at::ScalarType reduce_dtype = at::kFloat;
  /// The type of the compute copies of the weights (a reducer that gathers
  /// parameters, ZeRO-3, gathers them in this type).
  at::ScalarType param_dtype = at::kFloat;
};

/// The redistribution options of gradient sums under `o`: fp32 gradients
/// summed as themselves, or crossing in o.reduce_dtype.
inline dist::RedistributeOptions sum_options(const ReducerOptions& o) {
  dist::RedistributeOptions r;
  if (o.reduce_dtype != at::kFloat) r.reduce_dtype = o.reduce_dtype;
  return r;
}

class GradReducer {
 public:
  virtual ~GradReducer() = default;
  /// Sums gradients over the replicating groups. The loss is already
  /// divided by the global token count, so the sum is the average.
  virtual void reduce() = 0;
  /// Called at the step's start with the micro-batches this rank runs in
  /// it (normally one gradient per parameter each).
  virtual void begin_step(int /*micro_batches*/) {}
  /// Called once the step's last backward has run, before any hook or
  /// collective of the step's end: a reducer that launched reductions during
  /// backward launches the rest now, so every rank issues them in the same
  /// order before anything else. reduce() waits for them.
  virtual void backward_done() {}
  /// Scales gradients so the global norm is at most `max_norm` (0: off);
  /// returns the norm before clipping.
  virtual double clip(double max_norm) = 0;
  /// The reduced gradients this rank holds, each with a ShardSpec naming
  /// the slice of the full gradient (for parity dumps).
  virtual std::vector<ParamEntry> gradients() const = 0;
  /// Figures of the step just reduced, for metrics.jsonl and /metrics
  /// (the bucketed reducer: grad_buckets, grad_buckets_early).
  virtual void report(std::map<std::string, double>& /*figures*/) const {}
  /// A gradient was summed into `param`'s .grad outside autograd (a
  /// deferred weight gradient, include/hp/model/weight_grad.h): counted as
  /// its accumulation hook would count it, so its bucket waits for it.
  virtual void accumulated(const at::Tensor& /*param*/) {}
};

/// Launches buckets of parameters' gradient reductions during backward, as
/// soon as each bucket has the step's last gradient of all its parameters.
/// LibTorch 1.13 has no post-accumulate-grad hook: a post-hook on each
/// parameter's AccumulateGrad node counts the gradients it accumulates (once
/// per backward that reaches it: micro-batches, pipeline schedules and
/// recompute regions all just fire it). The first step counts (and only
/// counts, unless guess_first_step gave it counts to go by); from the
/// second a parameter is complete at that count, and the buckets at the
/// head of a queue are handed to `launch` as soon as they are complete,
/// strictly in queue order, so every rank issues one queue's reductions in
/// the same order whatever order its gradients arrive in. flush() launches
/// the rest (backward_done), queue by queue. Used by the bucketed reducer
/// (all-reduce) and zero (reduce-scatter).
///
/// With learn_rounds(), a queue launches each of its buckets R times a step,
/// R the greatest common divisor of its parameters' gradient counts in the
/// first step (the micro-batches: a parameter used twice a micro-batch
/// counts two), once per round of gradients (the caller releases what it
/// sent, so each launch carries that round's gradients). A queue holding a
/// parameter the first step gave no gradient launches once.
class BucketLauncher {
 public:
  /// `buckets[b]`: indices into `params`. `queues[q]`: bucket indices in
  /// launch order, every bucket in one queue. `hooked[q]`: whether hooks may
  /// launch queue q's buckets (false: only flush). With `overlap` false, or
  /// when nothing is hooked, no hook is installed and flush launches all.
  BucketLauncher(const std::vector<ParamEntry>& params, std::vector<std::vector<std::size_t>> buckets,
                 std::vector<std::vector<std::size_t>> queues, std::vector<bool> hooked, bool overlap, int rank,
                 std::function<void(std::size_t)> launch);
  ~BucketLauncher();
  BucketLauncher(const BucketLauncher&) = delete;
  BucketLauncher& operator=(const BucketLauncher&) = delete;

  /// Launches every bucket not launched yet, queue by queue, in order (and,
  /// for a queue of several rounds, the rounds its hooks did not reach).
  void flush();
  /// Launch in rounds (see above), learned from the first step.
  void learn_rounds() { learn_rounds_ = true; }
  /// Rounds a step of queue q (1 until learned).
  int rounds(std::size_t q) const { return queue_rounds_[q]; }
  /// Before the first step: each parameter is expected to get `per_step`
  /// gradients in it (one per micro-batch), so its buckets launch from the
  /// hooks already (with learn_rounds, once per micro-batch) instead of all
  /// at flush; only for a caller that releases what it sends (a parameter
  /// getting more than guessed sends the rest again at flush). The first
  /// step still counts, and the counts replace the guess.
  void guess_first_step(int per_step);
  /// After the step's reductions are waited: the first step's counts are
  /// learned; everything is reset for the next step.
  void end_step();
  /// Buckets launched from hooks (during backward) in the last step ended.
  std::size_t early() const { return last_early_; }
  std::size_t size() const { return buckets_.size(); }

  /// From the hooks: parameter `i` accumulated a gradient.
  void accumulated(std::size_t i);
  /// The same for a parameter named by its tensor (a deferred weight
  /// gradient summed outside autograd); ignored for one not launched here.
  void accumulated(const at::Tensor& param);

  /// The parameters in the order their first gradient arrived in the first
  /// step (hooked ones only; empty without hooks).
  const std::vector<std::size_t>& first_arrivals() const { return arrivals_; }
  /// Each parameter's gradients a step, learned from the first step.
  const std::vector<int>& counts() const { return expected_; }
  /// Takes another launcher's learned counts (over the same parameters) as
  /// if this one had counted the first step.
  void learn_counts(const std::vector<int>& counts);

 private:
  void launch_ready(std::size_t q);
  void launch_bucket(std::size_t b);
  /// Whether bucket b's parameters all have their gradients of its next round.
  bool ready(std::size_t b) const;
  std::vector<std::string> names_;
  std::map<const void*, std::size_t> index_of_;  ///< a parameter's TensorImpl -> its index
  std::vector<std::vector<std::size_t>> buckets_;
  std::vector<std::vector<std::size_t>> queues_;
  std::vector<bool> hooked_;
  int rank_;
  std::function<void(std::size_t)> launch_;
  std::vector<int> bucket_of_, queue_of_;
  std::vector<int> fires_, expected_;
  std::vector<bool> never_;       ///< per bucket: never ready from hooks (flush launches it)
  std::vector<int> launches_;     ///< per bucket: launched this step
  std::vector<bool> late_;        ///< per bucket: a gradient beyond the first step's guess after it went
  std::vector<std::size_t> next_;  ///< per queue
  std::vector<int> round_;         ///< per queue: the round its next launch belongs to
  std::vector<int> queue_rounds_;  ///< per queue: rounds a step (1 unless learn_rounds_)
  bool learn_rounds_ = false;
  bool learned_ = false;
  bool flushed_ = false;
  bool provisional_ = false;  ///< the first step, launching on guess_first_step's counts
  std::size_t early_ = 0, last_early_ = 0;
  std::vector<std::size_t> arrivals_;  ///< first step: parameters by first gradient
  struct Hooks;
  std::unique_ptr<Hooks> hooks_;
};

/// Bucketed all-reduce over each parameter's grad_sync dimensions. Buckets are
/// cut once, in reverse parameter order, per group list, at most
/// options.bucket_bytes each. With options.overlap each bucket is launched
/// (over the list's first group) from a post-hook on its parameters'
/// gradient accumulators as soon as all of them have received the step's
/// last gradient, in bucket order; the remaining groups of the list and the
/// copy back run in reduce(). The numbers are bitwise those of the blocking
/// path: same buckets, same operations, same order per group.
std::unique_ptr<GradReducer> make_bucketed_reducer(const ReducerOptions& options, const std::vector<ParamEntry>& params,
                                                   dist::DistributedContext& dist);

/// Global L2 norm of `grads`: squares summed per split group (each group of
/// a composite split in turn), then over the partition role. Collective:
/// every rank of the job calls it with entries of the same split groups.
double global_grad_norm(dist::DistributedContext& dist, const std::vector<ParamEntry>& grads);

/// Multiplies every tensor of `grads` by max_norm / norm when norm > max_norm > 0.
void clip_to(const std::vector<ParamEntry>& grads, double norm, double max_norm);

/// Sums each tensor of `tensors` over `groups` (in order) in flat buckets
/// of at most `bucket_bytes`, in place.
void all_reduce_bucketed(dist::DistributedContext& dist, const std::vector<std::string>& groups,
                         const std::vector<at::Tensor>& tensors, double bucket_bytes);

}  // namespace hp
