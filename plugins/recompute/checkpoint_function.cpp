#include "plugins/recompute/checkpoint_function.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/autograd.h>

#include <atomic>

#include "hp/model/aux_loss.h"
#include "hp/model/dropout.h"

namespace hp::recompute {

namespace {

std::atomic<std::int64_t> g_replays{0};

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

/// What backward needs besides the saved inputs; carried in a capsule.
struct State : torch::CustomClassHolder {
  ForwardFn inner;
  std::vector<std::string> in_keys, out_keys;
  /// Auxiliary losses the region added (MoE load balancing): returned as
  /// extra outputs so their gradients reach the replayed region.
  std::vector<std::string> aux_names;
  at::Tensor rng;    // CPU generator state before the forward
  DropoutSite site;  // the micro-batch the forward ran for
};

Activations pack(const std::vector<std::string>& keys, const variable_list& values) {
  Activations a;
  for (std::size_t i = 0; i < keys.size(); ++i) a.insert(keys[i], values[i]);
  return a;
}

struct Recompute : torch::autograd::Function<Recompute> {
  // The inputs come as a TensorList: autograd records a TensorList argument
  // as tensor inputs, but a std::vector<Tensor> would pass as an opaque value
  // and nothing would flow back.
  static variable_list forward(AutogradContext* ctx, at::TensorList input_list,
                               c10::intrusive_ptr<State> state) {
    variable_list inputs = input_list.vec();
    auto gen = at::detail::getDefaultCPUGenerator();
    state->rng = gen.get_state();
    state->site = current_dropout_site();
    Activations out;
    variable_list outs;
    {
      AuxLossScope aux(/*replay=*/false);
      out = state->inner(pack(state->in_keys, inputs));
      for (const auto& item : out) {
        state->out_keys.push_back(item.key());
        outs.push_back(item.value());
      }
      for (const auto& [name, v] : aux.items()) {
        state->aux_names.push_back(name);
        outs.push_back(v);
      }
    }
    ctx->save_for_backward(inputs);
    ctx->saved_data["state"] = c10::IValue::make_capsule(state);
    return outs;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto state = c10::static_intrusive_pointer_cast<State>(ctx->saved_data["state"].toCapsule());
    variable_list saved = ctx->get_saved_variables();
    variable_list inputs;
    for (const auto& t : saved) {
      at::Tensor d = t.detach();
      // Float inputs get gradients; the engine drops those nobody needs.
      if (d.is_floating_point()) d.requires_grad_(true);
      inputs.push_back(d);
    }
    auto gen = at::detail::getDefaultCPUGenerator();
    at::Tensor now = gen.get_state();
    gen.set_state(state->rng);
    g_replays.fetch_add(1, std::memory_order_relaxed);
    Activations out;
    std::vector<at::Tensor> aux_values;
    {
      torch::AutoGradMode enable(true);
      AuxLossScope aux(/*replay=*/true);
      DropoutSiteGuard site(state->site);
      out = state->inner(pack(state->in_keys, inputs));
      for (const auto& item : aux.items()) aux_values.push_back(item.second);
    }
    gen.set_state(now);
    variable_list outs, out_grads;
    std::size_t i = 0;
    for (const auto& item : out) {
      if (item.value().requires_grad() && i < grads.size() && grads[i].defined()) {
        outs.push_back(item.value());
        out_grads.push_back(grads[i]);
      }
      ++i;
    }
    for (const auto& v : aux_values) {
      if (v.requires_grad() && i < grads.size() && grads[i].defined()) {
        outs.push_back(v);
        out_grads.push_back(grads[i]);
      }
      ++i;
    }
    if (!outs.empty()) torch::autograd::backward(outs, out_grads);
    variable_list result;
    for (const auto& in : inputs) result.push_back(in.requires_grad() ? in.grad() : at::Tensor());
    result.push_back(at::Tensor());  // for the state argument
    return result;
  }
};

}  // namespace

std::int64_t take_replay_count() { return g_replays.exchange(0, std::memory_order_relaxed); }

Activations checkpointed(const ForwardFn& inner, const Activations& in) {
  if (!torch::GradMode::is_enabled()) return inner(in);
  auto state = c10::make_intrusive<State>();
  state->inner = inner;
  variable_list inputs;
  for (const auto& item : in) {
    state->in_keys.push_back(item.key());
    inputs.push_back(item.value());
  }
  variable_list outs = Recompute::apply(at::TensorList(inputs), state);
  // The region's auxiliary losses, now differentiable through this node.
  for (std::size_t a = 0; a < state->aux_names.size(); ++a) {
    add_aux_loss(state->aux_names[a], outs[state->out_keys.size() + a]);
  }
  outs.resize(state->out_keys.size());
  return pack(state->out_keys, outs);
}

}  // namespace hp::recompute
