#pragma once
// Datasets come from a registry: `data.type` names an entry, which says
// which batch inputs it produces (checked against the inputs the model
// reads) and the range of its token values, and makes the dataset. The
// shipped ones (text, synthetic, field) are registered on first use; an
// application may register its own.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "framework/util/registry.h"

namespace hp {

class Config;
class RawConfig;
class ConfigErrors;
class Dataset;
struct ModelInfo;

struct DatasetEntry {
  std::string name;
  std::string doc;
  /// Names of the batch inputs it produces ("tokens", "field").
  std::vector<std::string> inputs;
  /// Tokens take values in [0, token_range) (0: it has no tokens).
  std::int64_t token_range = 0;
  /// Rules on the data options (may be empty).
  std::function<void(const Config&, ConfigErrors&)> validate;
  std::function<std::shared_ptr<Dataset>(const Config&)> make;
  /// Fills options the user left unset from the dataset itself, before the
  /// config is resolved (the token corpus: model.vocab_size from its
  /// tokenizer). May be empty.
  std::function<void(RawConfig&)> complete;
  /// It knows its documents (Dataset::documents): data.document_attention.
  bool has_documents = false;
};

using DatasetRegistry = Registry<DatasetEntry>;

/// `data.type: tokens` (framework/data/token_dataset.cpp).
void register_tokens_dataset(DatasetRegistry& r);

/// Runs every dataset's `complete` on a raw config.
void complete_data_options(RawConfig& raw);

/// The process's dataset registry.
DatasetRegistry& datasets();

/// Rules between the config's dataset and model (inputs, token range), and
/// the dataset's own; adds config errors.
void check_data_against_model(const Config& config, const ModelInfo& model, ConfigErrors& errors);

}  // namespace hp
