#pragma once
// YAML in, typed config out. `RawConfig` is what the user wrote (file plus
// `--set` overrides); `resolve` checks it against a `Schema` and yields a
// `Config` with every declared option present (defaults filled in).
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "hp/config/errors.h"
#include "hp/config/schema.h"
#include "hp/config/value.h"

namespace hp {

/// One node of the user's YAML, flattened to a dotted path.
struct RawEntry {
  enum class Kind { kScalar, kList, kMap, kNull };
  std::string path;
  Kind kind = Kind::kScalar;
  std::string scalar;              ///< kScalar
  std::vector<std::string> items;  ///< kList (scalars only)
  std::string origin;              ///< "file.yaml:12" or "--set"
  std::string shown() const;       ///< the value as the user wrote it
};

class RawConfig {
 public:
  /// Throws ConfigException naming the file, line and column on bad YAML.
  static RawConfig parse_file(const std::string& file);
  static RawConfig parse_string(const std::string& yaml, const std::string& origin = "<string>");

  /// `a.b.c=value`; value is parsed as YAML (so `[1, 2]` is a list).
  void apply_override(const std::string& assignment);
  /// Sets a value programmatically (the C++ twin of an override).
  void set(const std::string& path, const std::string& yaml_value);

  const std::vector<RawEntry>& entries() const { return entries_; }
  const RawEntry* find(const std::string& path) const;
  /// Names that appear under `features`, in order of appearance.
  std::vector<std::string> feature_names() const;

 private:
  void remove_subtree(const std::string& path);
  void add_node_entries(const std::string& path, const void* yaml_node, const std::string& origin);
  std::vector<RawEntry> entries_;
};

/// The resolved, typed configuration.
class Config {
 public:
  Config() = default;

  bool has(const std::string& path) const;
  const ConfigValue& value(const std::string& path) const;
  bool get_bool(const std::string& path) const;
  std::int64_t get_int(const std::string& path) const;
  double get_float(const std::string& path) const;
  const std::string& get_string(const std::string& path) const;
  const std::vector<std::int64_t>& get_int_list(const std::string& path) const;
  const std::vector<std::string>& get_string_list(const std::string& path) const;
  /// Whether the user set this option (rather than taking the default).
  bool is_set(const std::string& path) const { return user_set_.count(path) > 0; }
  /// False when the option's own value was refused; cross-field rules skip
  /// such options so one mistake is reported once.
  bool ok(std::initializer_list<const char*> paths) const;

  /// Features with `features.<name>.enabled: true`, in declaration order.
  std::vector<std::string> enabled_features() const;
  /// Every feature named under `features`.
  const std::vector<std::string>& feature_names() const { return features_; }

  /// Nested YAML of every option, defaults filled in.
  std::string to_yaml() const;
  const Schema& schema() const { return *schema_; }

  /// World size the config is validated against (from --nproc or the
  /// launcher's environment).
  int world_size() const { return world_size_; }

 private:
  friend Config resolve(std::shared_ptr<const Schema>, const RawConfig&, int, ConfigErrors&,
                        const std::set<std::string>&);
  std::shared_ptr<const Schema> schema_;
  std::vector<std::string> order_;
  std::vector<ConfigValue> values_;
  std::vector<std::string> features_;
  std::set<std::string> user_set_;
  std::set<std::string> bad_;
  int world_size_ = 1;
};

/// Checks `raw` against `schema` (types, ranges, unknown keys with a
/// did-you-mean, then the schema's cross-field rules) and adds every problem
/// to `errors`. Issues under any of `skip_prefixes` are not reported (used for
/// features whose plugin already failed to load).
Config resolve(std::shared_ptr<const Schema> schema, const RawConfig& raw, int world_size,
               ConfigErrors& errors, const std::set<std::string>& skip_prefixes = {});

}  // namespace hp
