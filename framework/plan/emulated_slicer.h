#pragma once
// ZeRO stages 2 and 3's gradient reduction as its memory goes, without the
// communication (one process), for the planner's calibration: the
// gradients cut into buckets of distributed.bucket_size_mb in reverse
// order by the reducers' own rule (hp/optim/buckets.h); once a bucket's
// gradients of a micro-batch are complete (the trainer's BucketLauncher
// hooks), a flat copy of them and the received half are made and the
// whole gradients released; at most kBucketsInFlight buckets travel, the
// oldest then summed into the rank's half (made at setup). The
// released-gradients calibration runs it, so its peak shows what whole
// gradients and these buffers cost among a backward's activations, the
// pool's gaps included: at four ranks stages 2 and 3 measured 10-16 MiB
// under a model of the gradients alone.
#include <ATen/core/Tensor.h>

#include <cstddef>
#include <deque>
#include <memory>
#include <vector>

#include "hp/model/build_context.h"

namespace hp {
class BucketLauncher;
}

namespace hp::plan {

class EmulatedSlicer {
 public:
  /// Over `params` (their tensors shared, not copied), buckets of at most
  /// `bucket_bytes` (a parameter larger than that alone).
  EmulatedSlicer(const std::vector<ParamEntry>& params, double bucket_bytes);
  ~EmulatedSlicer();
  EmulatedSlicer(const EmulatedSlicer&) = delete;
  EmulatedSlicer& operator=(const EmulatedSlicer&) = delete;

  /// Before a step of `micro_batches` backwards.
  void begin_step(int micro_batches);
  /// After the step's last backward: what is left launched and summed.
  void end_backward();
  /// Bytes of the rank's halves (kept between steps, as ZeRO keeps them).
  double half_bytes() const;

  /// Indices into the parameters, per bucket, in launch order.
  const std::vector<std::vector<std::size_t>>& buckets() const { return buckets_; }
  /// Each bucket's half: the first half of its flat gradients (parameters
  /// in the bucket's order), summed over the launches so far.
  const std::vector<at::Tensor>& halves() const { return halves_; }
  /// The most buckets left travelling after a launch so far (flat copy and
  /// half kept; a launch makes its copies before the oldest is summed).
  std::size_t peak_in_flight() const { return peak_in_flight_; }
  /// Buckets launched so far.
  std::size_t launches() const { return launches_; }

 private:
  void launch(std::size_t b);
  void finish_oldest();
  struct InFlight {
    std::size_t bucket;
    at::Tensor flat, half;
  };
  std::vector<ParamEntry> params_;
  std::vector<std::vector<std::size_t>> buckets_;
  std::vector<at::Tensor> halves_;
  std::deque<InFlight> in_flight_;
  std::size_t peak_in_flight_ = 0, launches_ = 0;
  std::unique_ptr<BucketLauncher> launcher_;  // last: its hooks go quiet first
};

}  // namespace hp::plan
