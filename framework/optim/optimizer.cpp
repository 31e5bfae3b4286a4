#include "hp/optim/optimizer.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <cmath>

#include "hp/config/config.h"
#include "framework/optim/adam_kernel.h"

namespace hp {

OptimizerOptions OptimizerOptions::from(const Config& c) {
  OptimizerOptions o;
  const std::string& type = c.get_string("optimizer.type");
  o.kind = type == "sgd" ? OptimizerKind::kSgd : type == "adam" ? OptimizerKind::kAdam : OptimizerKind::kAdamW;
  o.weight_decay = c.get_float("optimizer.weight_decay");
  o.momentum = c.get_float("optimizer.momentum");
  o.beta1 = c.get_float("optimizer.beta1");
  o.beta2 = c.get_float("optimizer.beta2");
  o.eps = c.get_float("optimizer.eps");
  o.grad_clip = c.get_float("optimizer.grad_clip");
  return o;
}

OptimizerOptions OptimizerOptions::for_param(const std::string& name, double* lr_scale) const {
  OptimizerOptions o = *this;
  o.param_hypers.reset();
  *lr_scale = 1.0;
  if (param_hypers) {
    auto it = param_hypers->find(name);
    if (it != param_hypers->end()) {
      o.weight_decay = it->second.weight_decay;
      *lr_scale = it->second.lr_scale;
    }
  }
  return o;
}

std::map<std::string, ParamHyper> resolve_param_groups(const GroupPolicy& policy,
                                                       const std::vector<ParamEntry>& params) {
  std::map<std::string, ParamHyper> out;
  for (const auto& p : params) out[p.spec.name] = policy.of(p.spec.name, p.spec.global_shape, p.embedding);
  return out;
}

std::vector<std::string> OptimizerOptions::state_names() const {
  if (kind == OptimizerKind::kSgd) return momentum != 0 ? std::vector<std::string>{"momentum"} : std::vector<std::string>{};
  return {"exp_avg", "exp_avg_sq"};
}

ScheduleOptions ScheduleOptions::from(const Config& c) {
  ScheduleOptions s;
  s.lr = c.get_float("optimizer.lr");
  s.min_lr = c.get_float("optimizer.min_lr");
  s.warmup_steps = c.get_int("optimizer.warmup_steps");
  s.max_steps = c.get_int("training.max_steps");
  s.cosine = c.get_string("optimizer.schedule") != "constant";
  return s;
}

double learning_rate(const ScheduleOptions& s, std::int64_t step) {
  if (s.warmup_steps > 0 && step < s.warmup_steps) {
    return s.lr * static_cast<double>(step + 1) / static_cast<double>(s.warmup_steps);
  }
  if (!s.cosine) return s.lr;
  const double span = static_cast<double>(std::max<std::int64_t>(1, s.max_steps - s.warmup_steps));
  const double progress = std::min(1.0, static_cast<double>(step - s.warmup_steps) / span);
  return s.min_lr + 0.5 * (s.lr - s.min_lr) * (1.0 + std::cos(M_PI * progress));
}

void apply_update(const OptimizerOptions& o, std::int64_t steps, double lr, at::Tensor p, at::Tensor g,
                  std::vector<at::Tensor>& state) {
  if (o.kind == OptimizerKind::kSgd) {
    if (o.weight_decay != 0) g = g.add(p, o.weight_decay);
    if (o.momentum != 0) {
      at::Tensor& buf = state[0];
      if (steps == 1) buf.copy_(g);
      else buf.mul_(o.momentum).add_(g);
      g = buf;
    }
    p.add_(g, -lr);
    return;
  }
  at::Tensor& m = state[0];
  at::Tensor& v = state[1];
  const double t = static_cast<double>(steps);
  const double bc1 = 1.0 - std::pow(o.beta1, t);
  const double bc2 = 1.0 - std::pow(o.beta2, t);
  const auto fusable = [&](const at::Tensor& x) {
    return x.scalar_type() == at::kFloat && x.is_contiguous() && x.numel() == p.numel() && x.device().is_cpu();
  };
  if (fusable(p) && fusable(g) && fusable(m) && fusable(v)) {
    AdamScalars s;
    if (o.kind == OptimizerKind::kAdamW) s.decay = static_cast<float>(1.0 - lr * o.weight_decay);
    else s.l2 = static_cast<float>(o.weight_decay);
    s.beta1 = static_cast<float>(o.beta1);
    s.one_minus_beta1 = static_cast<float>(1.0 - o.beta1);
    s.beta2 = static_cast<float>(o.beta2);
    s.one_minus_beta2 = static_cast<float>(1.0 - o.beta2);
    s.sqrt_bc2 = static_cast<float>(std::sqrt(bc2));
    s.eps = static_cast<float>(o.eps);
    s.step = static_cast<float>(-lr / bc1);
    adam_fused(s, p.numel(), p.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>());
    // Written through their data as in-place operations would: versions move.
    for (const at::Tensor* x : {&p, &m, &v}) x->unsafeGetTensorImpl()->bump_version();
    return;
  }
  // The same update as tensor operations (other dtypes, strided tensors).
  if (o.kind == OptimizerKind::kAdamW) {
    p.mul_(1.0 - lr * o.weight_decay);
  } else if (o.weight_decay != 0) {
    g = g.add(p, o.weight_decay);
  }
  m.mul_(o.beta1).add_(g, 1.0 - o.beta1);
  v.mul_(o.beta2).addcmul_(g, g, 1.0 - o.beta2);
  at::Tensor denom = (v.sqrt() / std::sqrt(bc2)).add_(o.eps);
  p.addcdiv_(m, denom, -lr / bc1);
}

ModelStateBytes Optimizer::model_state(const std::vector<ParamEntry>& params) {
  ModelStateBytes m;
  for (const auto& p : params) {
    const double bytes = static_cast<double>(p.tensor.numel()) * static_cast<double>(p.tensor.element_size());
    m.params += bytes;
    m.grads += bytes;
  }
  m.optimizer = static_cast<double>(state_bytes());
  return m;
}

std::int64_t Optimizer::state_bytes() {
  std::int64_t n = 0;
  for (const auto& e : state()) n += static_cast<std::int64_t>(e.tensor.nbytes());
  return n;
}

void zero_gradients(const std::vector<ParamEntry>& params) {
  for (const auto& p : params) {
    auto& g = const_cast<at::Tensor&>(p.tensor).mutable_grad();
    if (g.defined()) g.zero_();
    else g = at::zeros_like(p.tensor);
  }
}

std::vector<ParamEntry> named_state(const OptimizerOptions& o, const std::vector<ShardSpec>& specs,
                                    const std::vector<std::vector<at::Tensor>>& state) {
  std::vector<ParamEntry> out;
  const auto names = o.state_names();
  for (std::size_t i = 0; i < specs.size(); ++i) {
    for (std::size_t k = 0; k < names.size(); ++k) {
      ParamEntry e{specs[i], state[i][k]};
      e.spec.name = names[k] + "/" + specs[i].name;
      out.push_back(e);
    }
  }
  return out;
}

std::vector<at::Tensor> fresh_state(const OptimizerOptions& o, const at::Tensor& like) {
  std::vector<at::Tensor> s;
  for (std::size_t k = 0; k < o.state_names().size(); ++k) s.push_back(at::zeros_like(like));
  return s;
}

namespace {

class LocalOptimizer : public NamedStateOptimizer {
 public:
  LocalOptimizer(OptimizerOptions o, std::vector<ParamEntry> params) : NamedStateOptimizer(o), params_(std::move(params)) {
    for (const auto& p : params_) {
      add_state(p.spec, p.tensor);
      scale_.push_back(1.0);
      per_param_.push_back(o_.for_param(p.spec.name, &scale_.back()));
    }
  }
  void step(double lr) override {
    c10::NoGradGuard no_grad;
    ++steps_;
    for (std::size_t i = 0; i < params_.size(); ++i) {
      at::Tensor g = params_[i].tensor.grad();
      if (g.defined()) apply_update(per_param_[i], steps_, lr * scale_[i], params_[i].tensor, g, state_[i]);
    }
  }
  void zero_grad() override { zero_gradients(params_); }

 private:
  std::vector<ParamEntry> params_;
  std::vector<OptimizerOptions> per_param_;  ///< each parameter's group's weight decay
  std::vector<double> scale_;                ///< each parameter's learning-rate scale
};

}  // namespace

std::unique_ptr<Optimizer> make_optimizer(const OptimizerOptions& options, const std::vector<ParamEntry>& params) {
  return std::make_unique<LocalOptimizer>(options, params);
}

}  // namespace hp
