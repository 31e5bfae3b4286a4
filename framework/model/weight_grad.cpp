#include "hp/model/weight_grad.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/autograd.h>

#include <atomic>

namespace hp::wgrad {

namespace {

thread_local bool t_split = false;
thread_local Collect* t_collect = nullptr;

std::atomic<std::uint64_t> g_input{0}, g_weight{0}, g_deferred{0};

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

/// W of one item: the products autograd's addmm / mm backward computes for
/// a weight used transposed (gY^T X) and the bias (gY summed to its shape).
void run_item(const WeightGradItem& it) {
  c10::NoGradGuard no_grad;
  const std::int64_t out = it.weight.size(0), in = it.weight.size(1);
  const at::Tensor gy = it.grad_out.reshape({-1, out});
  const at::Tensor x = it.input.reshape({-1, in});
  const at::Tensor gw = gy.t().mm(x);
  g_weight.fetch_add(1);
  at::Tensor& g = const_cast<at::Tensor&>(it.weight).mutable_grad();
  if (g.defined()) {
    g.add_(gw);
  } else {
    g = gw;
  }
  if (it.bias.defined()) {
    const at::Tensor gb = it.grad_out.sum_to_size(it.bias.sizes());
    at::Tensor& h = const_cast<at::Tensor&>(it.bias).mutable_grad();
    if (h.defined()) {
      h.add_(gb);
    } else {
      h = gb;
    }
  }
}

/// x W^T + b whose backward is B only: the input's gradient here, W queued
/// into the thread's Collect (or run at once without one). The parameters
/// are kept in saved_data (the same tensors, so W sums into their .grad).
struct SplitLinear : torch::autograd::Function<SplitLinear> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
    const bool bias = b.numel() > 0;
    ctx->save_for_backward({x});
    ctx->saved_data["w"] = w;
    ctx->saved_data["b"] = b;
    ctx->saved_data["bias"] = bias;
    return at::linear(x, w, bias ? b : at::Tensor());
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor x = ctx->get_saved_variables()[0];
    const at::Tensor w = ctx->saved_data["w"].toTensor();
    const at::Tensor b = ctx->saved_data["bias"].toBool() ? ctx->saved_data["b"].toTensor() : at::Tensor();
    const at::Tensor& gy = grads[0];
    at::Tensor gx;
    if (ctx->needs_input_grad(0)) {
      // As addmm's backward: gY W, back to the input's shape.
      gx = gy.reshape({-1, w.size(0)}).mm(w).view(x.sizes());
      g_input.fetch_add(1);
    }
    WeightGradItem item{x, gy, w, b};
    if (t_collect) {
      g_deferred.fetch_add(1);
      t_collect->push(std::move(item));
    } else {
      run_item(item);
    }
    return {gx, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

std::size_t WeightGradQueue::run(const std::function<void(const at::Tensor&)>& ready) {
  c10::NoGradGuard no_grad;
  const std::size_t n = items_.size();
  for (const auto& it : items_) {
    run_item(it);
    if (ready) {
      ready(it.weight);
      if (it.bias.defined()) ready(it.bias);
    }
  }
  items_.clear();
  return n;
}

std::int64_t WeightGradQueue::bytes() const {
  std::int64_t n = 0;
  for (const auto& it : items_) n += static_cast<std::int64_t>(it.input.nbytes() + it.grad_out.nbytes());
  return n;
}

SplitForward::SplitForward() : previous_(t_split) { t_split = true; }
SplitForward::~SplitForward() { t_split = previous_; }
bool splitting() { return t_split; }

Collect::Collect() : previous_(t_collect) { t_collect = this; }
Collect::~Collect() { t_collect = previous_; }
WeightGradQueue Collect::take() {
  WeightGradQueue out;
  std::swap(out, queue_);
  return out;
}

Counters counters() { return {g_input.load(), g_weight.load(), g_deferred.load()}; }
void reset_counters() {
  g_input = 0;
  g_weight = 0;
  g_deferred = 0;
}

at::Tensor split_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  return SplitLinear::apply(x.contiguous(), w, b.defined() ? b : at::empty({0}, w.options()));
}

}  // namespace hp::wgrad
