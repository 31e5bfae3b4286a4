#pragma once
// Which weight decay and learning-rate scale each parameter is optimized
// with: named groups matched by pattern over the global parameter name
// (optimizer.groups, first match wins), and for the rest the default rule
// (optimizer.weight_decay_on): by default no decay on one-dimensional
// parameters (norm gains, biases) and on embedding tables, as Megatron's
// no_weight_decay_cond, nanoGPT and torchtitan's recipes do. A function of
// the name, the global shape and whether the model marked it an embedding,
// so every layout and ZeRO stage resolves the same groups. Free of LibTorch.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace hp {

class Config;
class ConfigErrors;

/// optimizer.weight_decay_on: which parameters outside the named groups get
/// optimizer.weight_decay.
enum class DecayOn {
  kMatrices,                ///< parameters of two or more dimensions, not embeddings
  kMatricesAndEmbeddings,   ///< the same, embeddings too
  kAll,                     ///< every parameter (the behaviour before groups existed)
};
const char* decay_on_name(DecayOn d);

/// One entry of optimizer.groups: {match: GLOB, weight_decay: X, lr_scale: Y, name: N}.
struct GroupRule {
  std::string name;   ///< "groups[i]" unless given
  std::string match;  ///< glob over the global parameter name: * any run of characters, ? one
  std::optional<double> weight_decay;  ///< unset: the default rule's decay for the parameter
  double lr_scale = 1.0;
};

/// Parses optimizer.groups' items (each a flow map as YAML reads it). A bad
/// item is added to `errors` under optimizer.groups (key, value, rule, legal
/// values) when given, else thrown as ConfigException.
std::vector<GroupRule> parse_group_rules(const std::vector<std::string>& items, ConfigErrors* errors = nullptr);

/// `*` matches any run of characters (dots included), `?` any one.
bool glob_match(const std::string& pattern, const std::string& name);

/// A parameter's resolved hyperparameters.
struct ParamHyper {
  std::string group;  ///< the rule's name, or "decay" / "no_decay"
  double weight_decay = 0.0;
  double lr_scale = 1.0;
};

struct GroupPolicy {
  double weight_decay = 0.0;  ///< optimizer.weight_decay
  DecayOn on = DecayOn::kMatrices;
  std::vector<GroupRule> rules;
  /// From a validated config.
  static GroupPolicy from(const Config& c);
  ParamHyper of(const std::string& name, const std::vector<std::int64_t>& global_shape, bool embedding) const;
  /// "weight_decay_on: matrices; groups: norms (*.norm*: weight_decay 0), ..."
  std::string describe() const;
};

}  // namespace hp
