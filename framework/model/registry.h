#pragma once
// Models come from a registry, as layer kinds and features do. A model
// entry declares its options, its own rules, and what it states about
// itself (ModelInfo: kinds, split sizes, inputs), and describes its blocks.
// `model.type` names an entry. The shipped models (gpt, mlp, unet) are
// registered on first use; an application registers its own before it
// builds a Trainer (see examples/custom_model).
#include <cstdint>
#include <functional>
#include <string>

#include "hp/model/model_info.h"
#include "framework/util/registry.h"

namespace hp {

class Config;
class ConfigErrors;
class Schema;
struct ModelDescription;

struct ModelEntry {
  std::string name;
  std::string doc;
  /// Declares the model's options under "model."; an option another model
  /// already declared (same path) is left as it is.
  std::function<void(Schema&)> declare_options;
  /// Rules among the model's own options (may be empty).
  std::function<void(const Config&, ConfigErrors&)> validate;
  /// Kinds, split sizes and inputs; block costs are filled in from describe.
  std::function<ModelInfo(const Config&)> info;
  std::function<ModelDescription(const Config&)> describe;
};

using ModelRegistry = Registry<ModelEntry>;

/// The process's model registry.
ModelRegistry& models();

/// The ModelInfo of the config's `model.type`, block costs included.
ModelInfo model_info(const Config& config);
/// The description of the config's `model.type`.
ModelDescription describe_model(const Config& config);

/// The llama's FFN width when model.ffn_hidden is 0: two thirds of 4 x
/// hidden, rounded up to a multiple of 256 (Llama's rule).
std::int64_t llama_ffn_width(std::int64_t hidden);

/// Declares `path` with `declare` unless some model already did.
void declare_once(Schema& schema, const std::string& path, const std::function<void(Schema&)>& declare);

}  // namespace hp
