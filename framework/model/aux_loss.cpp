#include "framework/model/aux_loss.h"

#include <ATen/ATen.h>

namespace hp {

namespace {
thread_local AuxLossScope* current = nullptr;
}

AuxLossScope::AuxLossScope() : previous_(current) { current = this; }
AuxLossScope::~AuxLossScope() { current = previous_; }

void add_aux_loss(const std::string& name, const at::Tensor& sum) {
  if (current) current->add(name, sum);
}

at::Tensor AuxLossScope::total() const {
  at::Tensor t;
  for (const auto& [name, v] : items_) t = t.defined() ? t + v : v;
  return t;
}

}  // namespace hp
