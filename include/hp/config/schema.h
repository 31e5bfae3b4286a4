#pragma once
// Every option is declared once: type, default, legal range and a one-line
// doc. The declaration drives validation, `--print-config` and the option
// tables in docs/rfc.
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "hp/config/value.h"

namespace hp {

class Config;
class ConfigErrors;

struct OptionSpec {
  std::string path;
  OptionType type = OptionType::kString;
  ConfigValue default_value;
  bool required = false;
  std::optional<double> min;  ///< numbers, and every element of an int list
  std::optional<double> max;
  std::vector<std::string> choices;  ///< kEnum
  std::string doc;
  /// Extra words for the legal range when min/max/choices do not say it all.
  std::string legal_note;
  /// Lists only: a word that may stand instead of a list and means the
  /// empty list (e.g. `balance: auto`); "" for none.
  std::string empty_list_word;

  /// "integer in [1, 65536]", "one of: sgd, adam, adamw", ...
  std::string legal() const;

  // Fluent setters, in the style of LibTorch's *Options structs.
  OptionSpec& range(double lo, double hi) { min = lo; max = hi; return *this; }
  OptionSpec& at_least(double lo) { min = lo; return *this; }
  OptionSpec& describe(std::string d) { doc = std::move(d); return *this; }
  OptionSpec& note(std::string n) { legal_note = std::move(n); return *this; }
  OptionSpec& require() { required = true; return *this; }
  OptionSpec& or_word(std::string w) { empty_list_word = std::move(w); return *this; }
};

/// A rule across several options; adds issues to `errors`.
using CrossRule = std::function<void(const Config&, ConfigErrors&)>;

/// The set of declared options. Declaration order is kept for printing.
class Schema {
 public:
  OptionSpec& add_bool(const std::string& path, bool def);
  OptionSpec& add_int(const std::string& path, std::int64_t def);
  OptionSpec& add_float(const std::string& path, double def);
  OptionSpec& add_string(const std::string& path, std::string def);
  OptionSpec& add_enum(const std::string& path, std::string def, std::vector<std::string> choices);
  OptionSpec& add_int_list(const std::string& path, std::vector<std::int64_t> def);
  OptionSpec& add_string_list(const std::string& path, std::vector<std::string> def);
  void add_rule(CrossRule rule) { rules_.push_back(std::move(rule)); }

  const OptionSpec* find(const std::string& path) const;
  const std::vector<OptionSpec>& options() const { return specs_; }
  const std::vector<CrossRule>& rules() const { return rules_; }
  /// Every declared path that starts with `prefix`.
  std::vector<std::string> paths_under(const std::string& prefix) const;

  /// Markdown table `key | type | default | required | meaning | legal range |
  /// error behaviour` of every option under `prefix` ("" for all).
  std::string to_markdown(const std::string& prefix = "") const;

 private:
  OptionSpec& add(OptionSpec spec);
  std::vector<OptionSpec> specs_;
  std::map<std::string, std::size_t> index_;
  std::vector<CrossRule> rules_;
};

/// Declares the framework's own options (run, model, data, training,
/// optimizer, distributed, checkpoint, metrics, logging, plugins) and the
/// cross-field rules that need no feature.
void declare_core_options(Schema& schema);

/// The top-level sections a config may have.
const std::vector<std::string>& top_level_sections();

}  // namespace hp
