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
void accumulate(const at::Tensor& param, const at::Tensor& grad) {
  at::Tensor& g = const_cast<at::Tensor&>(param).mutable_grad();
  if (g.defined()) {
    g.add_(grad);
  } else {
    g = grad;
  }
}

void run_item(const WeightGradItem& it) {
  c10::NoGradGuard no_grad;
  g_weight.fetch_add(1);
  if (it.apply) {
    it.apply();
    return;
  }
  if (it.grads) {
    const std::vector<at::Tensor> gs = it.grads();
    accumulate(it.weight, gs.at(0));
    if (it.bias.defined() && gs.size() > 1 && gs[1].defined()) accumulate(it.bias, gs[1]);
    return;
  }
  const std::int64_t out = it.weight.size(0), in = it.weight.size(1);
  const at::Tensor gy = it.grad_out.reshape({-1, out});
  const at::Tensor x = it.input.reshape({-1, in});
  const at::Tensor gw = gy.t().mm(x);
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
    defer(WeightGradItem{x, gy, w, b, nullptr});
    return {gx, at::Tensor(), at::Tensor()};
  }
};

/// Rows of `w` by `ids`: B has nothing to compute, W is ATen's embedding
/// backward (what autograd's embedding backward calls).
struct SplitEmbedding : torch::autograd::Function<SplitEmbedding> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& w, const at::Tensor& ids) {
    ctx->saved_data["w"] = w;
    ctx->saved_data["ids"] = ids;
    return at::embedding(w, ids);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor w = ctx->saved_data["w"].toTensor();
    const at::Tensor ids = ctx->saved_data["ids"].toTensor();
    const at::Tensor gy = grads[0];
    WeightGradItem item{at::Tensor(), gy, w, at::Tensor(), nullptr};
    const std::int64_t rows = w.size(0);
    item.grads = [gy, ids, rows] {
      return std::vector<at::Tensor>{at::embedding_backward(gy, ids, rows, -1, false, false)};
    };
    defer(std::move(item));
    return {at::Tensor(), at::Tensor()};
  }
};

/// Layer norm whose backward is B (the input's gradient) with W (the
/// weight's and the bias's) queued: ATen's layer-norm backward asked for
/// one side at a time, each output computed as the fused call computes it.
struct SplitLayerNorm : torch::autograd::Function<SplitLayerNorm> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w,
                            const at::Tensor& bias_or_empty, std::int64_t dim, double eps) {
    const at::Tensor b = bias_or_empty.numel() > 0 ? bias_or_empty : at::Tensor();
    auto [y, mean, rstd] = at::native_layer_norm(x, {dim}, w, b, eps);
    ctx->save_for_backward({x, mean, rstd});
    ctx->saved_data["w"] = w;
    ctx->saved_data["b"] = b;
    ctx->saved_data["dim"] = dim;
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto s = ctx->get_saved_variables();
    const at::Tensor w = ctx->saved_data["w"].toTensor(), b = ctx->saved_data["b"].toTensor();
    const std::int64_t dim = ctx->saved_data["dim"].toInt();
    const at::Tensor gy = grads[0];
    at::Tensor gx;
    if (ctx->needs_input_grad(0)) {
      gx = std::get<0>(at::native_layer_norm_backward(gy, s[0], {dim}, s[1], s[2], w, b, {true, false, false}));
      g_input.fetch_add(1);
    }
    WeightGradItem item{s[0], gy, w, b, nullptr};
    const at::Tensor x = s[0], mean = s[1], rstd = s[2];
    item.grads = [gy, x, mean, rstd, w, b, dim] {
      // The weight's and bias's gradients do not read the weight's values,
      // but ATen's kernel takes its pointer: an optimizer that shards the
      // parameters may have released its storage before W runs (gathered
      // for B, released at B's end), so the kernel gets ones of its shape.
      const at::Tensor gamma = w.storage().data() != nullptr ? w : at::ones_like(w);
      auto r = at::native_layer_norm_backward(gy, x, {dim}, mean, rstd, gamma, b, {false, true, b.defined()});
      return std::vector<at::Tensor>{std::get<1>(r), std::get<2>(r)};
    };
    defer(std::move(item));
    return {gx, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

/// x * w, w broadcast over the leading dimensions: B gY w, W (gY x) summed
/// to w's shape (mul's backward for each side).
struct SplitScale : torch::autograd::Function<SplitScale> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w) {
    ctx->save_for_backward({x});
    ctx->saved_data["w"] = w;
    return x * w;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor x = ctx->get_saved_variables()[0];
    const at::Tensor w = ctx->saved_data["w"].toTensor();
    const at::Tensor gy = grads[0];
    at::Tensor gx;
    if (ctx->needs_input_grad(0)) {
      gx = gy * w;
      g_input.fetch_add(1);
    }
    WeightGradItem item{x, gy, w, at::Tensor(), nullptr};
    item.grads = [gy, x, w] { return std::vector<at::Tensor>{(gy * x).sum_to_size(w.sizes())}; };
    defer(std::move(item));
    return {gx, at::Tensor()};
  }
};

/// Parameters themselves only (W sums into their .grad; a view's would be lost).
bool split_now(const at::Tensor& w) {
  return t_split && w.is_leaf() && w.requires_grad() && at::GradMode::is_enabled();
}

}  // namespace

bool collecting() { return t_collect != nullptr; }

void defer(WeightGradItem item) {
  if (t_collect) {
    g_deferred.fetch_add(1);
    t_collect->push(std::move(item));
  } else {
    run_item(item);
  }
}

at::Tensor embedding(const at::Tensor& weight, const at::Tensor& ids) {
  if (!split_now(weight)) return at::embedding(weight, ids);
  return SplitEmbedding::apply(weight, ids);
}

at::Tensor layer_norm(const at::Tensor& x, std::int64_t dim, const at::Tensor& w, const at::Tensor& b,
                      double eps) {
  if (!split_now(w) || (b.defined() && !b.is_leaf()) || x.scalar_type() != at::kFloat)
    return at::layer_norm(x, {dim}, w, b, eps);
  return SplitLayerNorm::apply(x.contiguous(), w, b.defined() ? b : at::empty({0}, w.options()), dim, eps);
}

at::Tensor scale(const at::Tensor& x, const at::Tensor& w) {
  if (!split_now(w) || x.scalar_type() != w.scalar_type()) return x * w;
  return SplitScale::apply(x, w);
}

std::size_t WeightGradQueue::run(const std::function<void(const at::Tensor&)>& ready) {
  c10::NoGradGuard no_grad;
  const std::size_t n = items_.size();
  for (const auto& it : items_) {
    run_item(it);
    if (ready) {
      ready(it.weight);
      if (it.bias.defined()) ready(it.bias);
      for (const at::Tensor& p : it.also) ready(p);
    }
  }
  items_.clear();
  return n;
}

std::int64_t WeightGradQueue::bytes() const {
  std::int64_t n = 0;
  for (const auto& it : items_) {
    for (const at::Tensor* t : {&it.input, &it.grad_out}) n += t->defined() ? static_cast<std::int64_t>(t->nbytes()) : 0;
  }
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
