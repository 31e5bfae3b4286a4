#pragma once
// The backward of a weight-bearing product split in two (zero-bubble
// pipeline schedules): B, the gradient of the layer's input, on the
// critical path, and W, the gradients of its weight and bias, deferrable.
//
// While a SplitForward is active on a thread, precision::linear builds its
// product as a function whose backward computes the input's gradient only
// and hands W (the layer's input, the output's gradient, the parameters) to
// the Collect active on the backward's thread; W runs later, from
// WeightGradQueue::run, as plain products accumulated into the parameters'
// .grad: no second pass of autograd over the graph and no replay of a
// recomputed forward (what it needs was kept). Without a Collect the
// backward computes W at once (the numbers of an unsplit backward).
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <vector>

namespace hp::wgrad {

/// One deferred weight gradient, summed into weight.grad (and bias.grad).
/// A product (`grads` empty): gW = gY^T X and gb = gY summed to the bias.
/// Any other layer (`grads` set): what `grads()` returns, {gW, gb or
/// undefined}, from what its B kept (`input`, `grad_out` and its own
/// captures: an embedding's ids, a norm's row statistics).
struct WeightGradItem {
  at::Tensor input;      ///< the layer's input X, [..., in] (a product's)
  at::Tensor grad_out;   ///< the output's gradient gY, [..., out]
  at::Tensor weight;     ///< the parameter, [out, in] for a product
  at::Tensor bias;       ///< the bias parameter, or undefined
  std::function<std::vector<at::Tensor>()> grads;  ///< a non-product layer's W
  /// A layer that sums its own gradients into .grad (the packed expert
  /// FFNs, whose products add into .grad): run instead of the above; `also`
  /// lists its parameters beyond weight and bias, for the ready cues.
  std::function<void()> apply;
  std::vector<at::Tensor> also;
};

/// The W work of one backward (a chunk and micro-batch), in the order B
/// produced it.
class WeightGradQueue {
 public:
  /// Runs every item (gradient mode off, no autograd) and empties the queue;
  /// `ready(param)` is called after each parameter's gradient is summed (a
  /// reducer's cue). Returns the items run.
  std::size_t run(const std::function<void(const at::Tensor&)>& ready = nullptr);
  std::size_t size() const { return items_.size(); }
  bool empty() const { return items_.empty(); }
  /// Bytes the queue keeps alive (inputs and output gradients).
  std::int64_t bytes() const;
  void push(WeightGradItem item) { items_.push_back(std::move(item)); }

 private:
  std::vector<WeightGradItem> items_;
};

/// While alive (on this thread): the forwards build split products.
class SplitForward {
 public:
  SplitForward();
  ~SplitForward();
  SplitForward(const SplitForward&) = delete;
  SplitForward& operator=(const SplitForward&) = delete;

 private:
  bool previous_;
};
bool splitting();

/// While alive (on the backward's thread): split products queue their W here.
class Collect {
 public:
  Collect();
  ~Collect();
  Collect(const Collect&) = delete;
  Collect& operator=(const Collect&) = delete;
  /// What was queued so far (the queue is left empty).
  WeightGradQueue take();
  void push(WeightGradItem item) { queue_.push(std::move(item)); }

 private:
  WeightGradQueue queue_;
  Collect* previous_;
};

/// Products counted since the last reset (tests: B computes no weight
/// gradient, W no input gradient).
struct Counters {
  std::uint64_t input_grad_products = 0;   ///< B's
  std::uint64_t weight_grad_products = 0;  ///< W's, at once or deferred
  std::uint64_t deferred = 0;              ///< W items queued into a Collect
};
Counters counters();
void reset_counters();

/// Whether a Collect is active on this thread: a split backward queues W.
bool collecting();
/// Queues `item` into this thread's Collect, or runs it at once.
void defer(WeightGradItem item);

/// The product for precision::linear (fp32): a split one while splitting.
at::Tensor split_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b);

/// The other weight-bearing layers, split while splitting (the weight
/// requires its gradient and gradient mode is on), otherwise ATen's op:
/// - embedding: B nothing (integer ids have no gradient), W ATen's
///   embedding backward (the rows' gradients summed per id);
/// - layer norm (fp32): B the input's gradient, W the weight's and bias's,
///   each from ATen's layer-norm backward with only its outputs asked for;
/// - scale (x * w over the last dimension, RMS norm's weight): B gY w,
///   W (gY x) summed to w's shape: mul's backward, in two.
at::Tensor embedding(const at::Tensor& weight, const at::Tensor& ids);
at::Tensor layer_norm(const at::Tensor& x, std::int64_t dim, const at::Tensor& w, const at::Tensor& b,
                      double eps);
at::Tensor scale(const at::Tensor& x, const at::Tensor& w);

}  // namespace hp::wgrad
