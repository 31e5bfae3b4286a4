#pragma once
// What flows between blocks: a small ordered map of named tensors, so skip
// connections and several outputs can cross pipeline stages.
#include <torch/ordered_dict.h>
#include <ATen/core/Tensor.h>

#include <string>

namespace hp {

using Activations = torch::OrderedDict<std::string, at::Tensor>;

/// Builds Activations from {name, tensor} pairs.
inline Activations make_activations(
    std::initializer_list<std::pair<std::string, at::Tensor>> items) {
  Activations a;
  for (const auto& kv : items) a.insert(kv.first, kv.second);
  return a;
}

}  // namespace hp
