#include "framework/optim/optimizer.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <cmath>

#include "framework/config/config.h"

namespace hp {

OptimizerOptions OptimizerOptions::from(const Config& c) {
  OptimizerOptions o;
  o.type = c.get_string("optimizer.type");
  o.weight_decay = c.get_float("optimizer.weight_decay");
  o.momentum = c.get_float("optimizer.momentum");
  o.beta1 = c.get_float("optimizer.beta1");
  o.beta2 = c.get_float("optimizer.beta2");
  o.eps = c.get_float("optimizer.eps");
  return o;
}

Optimizer::Optimizer(OptimizerOptions options, std::vector<ParamEntry> params)
    : o_(std::move(options)), params_(std::move(params)) {
  for (const auto& p : params_) {
    m_.push_back(at::zeros_like(p.tensor));
    v_.push_back(o_.type == "sgd" ? at::Tensor() : at::zeros_like(p.tensor));
  }
}

void Optimizer::zero_grad() {
  for (auto& p : params_) {
    auto& g = p.tensor.mutable_grad();
    if (g.defined()) g.zero_();
  }
}

void Optimizer::step(double lr) {
  c10::NoGradGuard no_grad;
  ++steps_;
  const double t = static_cast<double>(steps_);
  for (std::size_t i = 0; i < params_.size(); ++i) {
    at::Tensor p = params_[i].tensor;
    at::Tensor g = p.grad();
    if (!g.defined()) continue;
    if (o_.type == "sgd") {
      if (o_.weight_decay != 0) g = g.add(p, o_.weight_decay);
      if (o_.momentum != 0) {
        if (steps_ == 1) m_[i].copy_(g);
        else m_[i].mul_(o_.momentum).add_(g);
        g = m_[i];
      }
      p.add_(g, -lr);
      continue;
    }
    if (o_.type == "adamw") {
      p.mul_(1.0 - lr * o_.weight_decay);
    } else if (o_.weight_decay != 0) {
      g = g.add(p, o_.weight_decay);
    }
    m_[i].mul_(o_.beta1).add_(g, 1.0 - o_.beta1);
    v_[i].mul_(o_.beta2).addcmul_(g, g, 1.0 - o_.beta2);
    const double bc1 = 1.0 - std::pow(o_.beta1, t);
    const double bc2 = 1.0 - std::pow(o_.beta2, t);
    at::Tensor denom = (v_[i].sqrt() / std::sqrt(bc2)).add_(o_.eps);
    p.addcdiv_(m_[i], denom, -lr / bc1);
  }
}

std::vector<ParamEntry> Optimizer::state() {
  std::vector<ParamEntry> out;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    auto with = [&](const std::string& kind, const at::Tensor& t) {
      ParamEntry e{params_[i].spec, t};
      e.spec.name = kind + "/" + params_[i].spec.name;
      out.push_back(e);
    };
    if (o_.type == "sgd") {
      if (o_.momentum != 0) with("momentum", m_[i]);
    } else {
      with("exp_avg", m_[i]);
      with("exp_avg_sq", v_[i]);
    }
  }
  return out;
}

double learning_rate(const Config& c, std::int64_t step) {
  const double peak = c.get_float("optimizer.lr");
  const double floor = c.get_float("optimizer.min_lr");
  const auto warmup = c.get_int("optimizer.warmup_steps");
  const auto total = c.get_int("training.max_steps");
  if (warmup > 0 && step < warmup) return peak * static_cast<double>(step + 1) / static_cast<double>(warmup);
  if (c.get_string("optimizer.schedule") == "constant") return peak;
  const double span = static_cast<double>(std::max<std::int64_t>(1, total - warmup));
  const double progress = std::min(1.0, static_cast<double>(step - warmup) / span);
  return floor + 0.5 * (peak - floor) * (1.0 + std::cos(M_PI * progress));
}

}  // namespace hp
