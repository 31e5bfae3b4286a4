#include "hp/config/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <sstream>
#include <stdexcept>

#include "framework/util/strings.h"

namespace hp {

std::string RawEntry::shown() const {
  switch (kind) {
    case Kind::kScalar: return scalar.empty() ? "\"\"" : scalar;
    case Kind::kList: return "[" + join(items) + "]";
    case Kind::kMap: return "{...}";
    case Kind::kNull: return "(nothing)";
  }
  return "";
}

namespace {

[[noreturn]] void internal(const std::string& what) {
  throw std::logic_error("internal error: " + what + ", please report");
}

std::string where(const std::string& origin, const YAML::Node& n) {
  if (origin == "--set") return origin;
  auto m = n.Mark();
  return origin + ":" + std::to_string(m.line + 1);
}

}  // namespace

void RawConfig::add_node_entries(const std::string& path, const void* node_ptr,
                                 const std::string& origin) {
  const YAML::Node& node = *static_cast<const YAML::Node*>(node_ptr);
  RawEntry e;
  e.path = path;
  e.origin = where(origin, node);
  if (node.IsMap()) {
    e.kind = RawEntry::Kind::kMap;
    if (!path.empty()) entries_.push_back(e);
    for (const auto& kv : node) {
      std::string key = kv.first.as<std::string>();
      YAML::Node child = kv.second;
      add_node_entries(path.empty() ? key : path + "." + key, &child, origin);
    }
  } else if (node.IsSequence()) {
    e.kind = RawEntry::Kind::kList;
    for (const auto& item : node) {
      if (item.IsMap()) {
        // A list of mappings (optimizer.groups) keeps each item as its flow
        // YAML text; the option that takes them parses and checks it.
        YAML::Emitter flow;
        flow << YAML::Flow << item;
        e.items.push_back(flow.c_str());
        continue;
      }
      if (!item.IsScalar()) {
        throw ConfigException(path, "[...]", "lists may hold only plain values or mappings (" + e.origin + ")",
                              "a flat list such as [1, 2]");
      }
      e.items.push_back(item.as<std::string>());
    }
    entries_.push_back(e);
  } else if (node.IsNull()) {
    e.kind = RawEntry::Kind::kNull;
    if (!path.empty()) entries_.push_back(e);
  } else {
    e.kind = RawEntry::Kind::kScalar;
    e.scalar = node.as<std::string>();
    entries_.push_back(e);
  }
}

RawConfig RawConfig::parse_string(const std::string& yaml, const std::string& origin) {
  RawConfig raw;
  YAML::Node root;
  try {
    root = YAML::Load(yaml);
  } catch (const YAML::Exception& ex) {
    throw ConfigException(origin + ":" + std::to_string(ex.mark.line + 1) + ":" +
                              std::to_string(ex.mark.column + 1),
                          "", "not valid YAML: " + ex.msg, "");
  }
  if (!root.IsNull() && !root.IsMap()) {
    throw ConfigException(origin, "", "the top level must be a mapping of sections",
                          join(top_level_sections()));
  }
  if (root.IsMap()) raw.add_node_entries("", &root, origin);
  return raw;
}

RawConfig RawConfig::parse_file(const std::string& file) {
  FILE* f = std::fopen(file.c_str(), "rb");
  if (!f) {
    throw ConfigException(file, "", std::string("cannot read the config file: ") +
                                        std::strerror(errno), "a readable YAML file");
  }
  std::string text;
  char buf[65536];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
  std::fclose(f);
  return parse_string(text, file);
}

void RawConfig::remove_subtree(const std::string& path) {
  entries_.erase(std::remove_if(entries_.begin(), entries_.end(),
                                [&](const RawEntry& e) {
                                  return e.path == path ||
                                         e.path.compare(0, path.size() + 1, path + ".") == 0;
                                }),
                 entries_.end());
}

void RawConfig::set(const std::string& path, const std::string& yaml_value) {
  YAML::Node node;
  try {
    node = YAML::Load(yaml_value);
  } catch (const YAML::Exception& ex) {
    throw ConfigException(path, yaml_value, "override value is not valid YAML: " + ex.msg, "");
  }
  remove_subtree(path);
  // Every parent must exist as a mapping entry so sections are recognised.
  auto parts = split(path, '.');
  std::string prefix;
  for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
    prefix = prefix.empty() ? parts[i] : prefix + "." + parts[i];
    if (!find(prefix)) {
      RawEntry m;
      m.path = prefix;
      m.kind = RawEntry::Kind::kMap;
      m.origin = "--set";
      entries_.push_back(m);
    } else if (find(prefix)->kind != RawEntry::Kind::kMap) {
      remove_subtree(prefix);
      RawEntry m;
      m.path = prefix;
      m.kind = RawEntry::Kind::kMap;
      m.origin = "--set";
      entries_.push_back(m);
    }
  }
  add_node_entries(path, &node, "--set");
}

void RawConfig::apply_override(const std::string& assignment) {
  auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0) {
    throw ConfigException("--set", assignment, "an override must look like key.path=value",
                          "e.g. --set training.max_steps=100");
  }
  std::string path = assignment.substr(0, eq);
  for (const auto& part : split(path, '.')) {
    if (part.empty()) {
      throw ConfigException("--set", assignment, "the key path has an empty component",
                            "e.g. --set training.max_steps=100");
    }
  }
  set(path, assignment.substr(eq + 1));
}

const RawEntry* RawConfig::find(const std::string& path) const {
  for (const auto& e : entries_) {
    if (e.path == path) return &e;
  }
  return nullptr;
}

std::vector<std::string> RawConfig::feature_names() const {
  std::vector<std::string> out;
  const std::string prefix = "features.";
  for (const auto& e : entries_) {
    if (e.path.compare(0, prefix.size(), prefix) != 0) continue;
    std::string name = e.path.substr(prefix.size());
    name = name.substr(0, name.find('.'));
    if (std::find(out.begin(), out.end(), name) == out.end()) out.push_back(name);
  }
  return out;
}

// ---------------------------------------------------------------------------
// Config

bool Config::has(const std::string& path) const {
  return std::find(order_.begin(), order_.end(), path) != order_.end();
}

const ConfigValue& Config::value(const std::string& path) const {
  auto it = std::find(order_.begin(), order_.end(), path);
  if (it == order_.end()) internal("config option '" + path + "' is not declared");
  return values_[static_cast<std::size_t>(it - order_.begin())];
}

template <typename T>
static const T& typed(const Config& c, const std::string& path) {
  const auto& v = c.value(path);
  if (!std::holds_alternative<T>(v)) internal("config option '" + path + "' read as wrong type");
  return std::get<T>(v);
}

bool Config::get_bool(const std::string& p) const { return typed<bool>(*this, p); }
std::int64_t Config::get_int(const std::string& p) const { return typed<std::int64_t>(*this, p); }
double Config::get_float(const std::string& p) const { return typed<double>(*this, p); }
const std::string& Config::get_string(const std::string& p) const {
  return typed<std::string>(*this, p);
}
const std::vector<std::int64_t>& Config::get_int_list(const std::string& p) const {
  return typed<std::vector<std::int64_t>>(*this, p);
}
const std::vector<std::string>& Config::get_string_list(const std::string& p) const {
  return typed<std::vector<std::string>>(*this, p);
}

bool Config::ok(std::initializer_list<const char*> paths) const {
  for (const char* p : paths) {
    if (bad_.count(p)) return false;
  }
  return true;
}

std::vector<std::string> Config::enabled_features() const {
  std::vector<std::string> out;
  for (const auto& f : features_) {
    std::string key = "features." + f + ".enabled";
    if (has(key) && get_bool(key)) out.push_back(f);
  }
  return out;
}

namespace {

/// Options nested by path, children in declaration order.
struct YamlTree {
  std::string key;
  const ConfigValue* value = nullptr;
  std::vector<YamlTree> children;
  YamlTree& child(const std::string& k) {
    for (auto& c : children) {
      if (c.key == k) return c;
    }
    children.push_back(YamlTree{k, nullptr, {}});
    return children.back();
  }
};

void emit(YAML::Emitter& out, const YamlTree& node) {
  out << YAML::BeginMap;
  for (const auto& c : node.children) {
    out << YAML::Key << c.key << YAML::Value;
    if (!c.value) {
      emit(out, c);
      continue;
    }
    const ConfigValue& v = *c.value;
    if (auto l = std::get_if<std::vector<std::int64_t>>(&v)) {
      out << YAML::Flow << YAML::BeginSeq;
      for (auto x : *l) out << x;
      out << YAML::EndSeq;
    } else if (auto sl = std::get_if<std::vector<std::string>>(&v)) {
      out << YAML::Flow << YAML::BeginSeq;
      for (const auto& x : *sl) out << x;
      out << YAML::EndSeq;
    } else if (auto str = std::get_if<std::string>(&v)) {
      out << *str;
    } else {
      out << to_string(v);
    }
  }
  out << YAML::EndMap;
}

}  // namespace

std::string Config::to_yaml() const {
  YamlTree root;
  for (std::size_t i = 0; i < order_.size(); ++i) {
    YamlTree* node = &root;
    for (const auto& part : split(order_[i], '.')) node = &node->child(part);
    node->value = &values_[i];
  }
  YAML::Emitter out;
  emit(out, root);
  return std::string(out.c_str()) + "\n";
}

// ---------------------------------------------------------------------------
// resolve

namespace {

bool parse_int(const std::string& s, std::int64_t& out) {
  if (s.empty()) return false;
  const char* b = s.data();
  const char* e = s.data() + s.size();
  if (*b == '+') ++b;
  auto r = std::from_chars(b, e, out);
  return r.ec == std::errc() && r.ptr == e;
}

bool parse_float(const std::string& s, double& out) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  out = std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size() && errno == 0 && std::isfinite(out);
}

bool in_range(const OptionSpec& spec, double x) {
  return (!spec.min || x >= *spec.min) && (!spec.max || x <= *spec.max);
}

/// Converts one raw entry; returns false (after adding an issue) when refused.
bool convert(const OptionSpec& spec, const RawEntry& e, ConfigValue& out, ConfigErrors& errors) {
  auto refuse = [&](const std::string& rule) {
    errors.add(spec.path, e.shown(), rule, spec.legal());
    return false;
  };
  const bool list_type =
      spec.type == OptionType::kIntList || spec.type == OptionType::kStringList;
  if (e.kind == RawEntry::Kind::kMap) return refuse(std::string("expected ") + type_name(spec.type) + ", got a mapping");
  if (e.kind == RawEntry::Kind::kNull) return refuse("no value given");
  if (list_type && e.kind == RawEntry::Kind::kScalar && !spec.empty_list_word.empty() &&
      e.scalar == spec.empty_list_word) {
    if (spec.type == OptionType::kIntList) out = std::vector<std::int64_t>{};
    else out = std::vector<std::string>{};
    return true;
  }
  if (list_type && e.kind != RawEntry::Kind::kList) {
    return refuse(std::string("expected ") + type_name(spec.type) + ", got a single value");
  }
  if (!list_type && e.kind == RawEntry::Kind::kList) {
    return refuse(std::string("expected ") + type_name(spec.type) + ", got a list");
  }
  switch (spec.type) {
    case OptionType::kBool:
      if (e.scalar == "true" || e.scalar == "True") out = true;
      else if (e.scalar == "false" || e.scalar == "False") out = false;
      else return refuse("expected true or false");
      return true;
    case OptionType::kInt: {
      std::int64_t v;
      if (!parse_int(e.scalar, v)) return refuse("expected an integer");
      if (!in_range(spec, static_cast<double>(v))) return refuse("out of range");
      out = v;
      return true;
    }
    case OptionType::kFloat: {
      double v;
      if (!parse_float(e.scalar, v)) return refuse("expected a number");
      if (!in_range(spec, v)) return refuse("out of range");
      out = v;
      return true;
    }
    case OptionType::kString:
      out = e.scalar;
      return true;
    case OptionType::kEnum:
      if (std::find(spec.choices.begin(), spec.choices.end(), e.scalar) == spec.choices.end()) {
        std::string dym = did_you_mean(e.scalar, spec.choices);
        return refuse("not a known choice" + (dym.empty() ? "" : " (did you mean '" + dym + "'?)"));
      }
      out = e.scalar;
      return true;
    case OptionType::kIntList: {
      std::vector<std::int64_t> l;
      for (const auto& item : e.items) {
        std::int64_t v;
        if (!parse_int(item, v)) return refuse("element '" + item + "' is not an integer");
        if (!in_range(spec, static_cast<double>(v))) {
          return refuse("element " + item + " is out of range");
        }
        l.push_back(v);
      }
      out = l;
      return true;
    }
    case OptionType::kStringList:
      out = e.items;
      return true;
  }
  return false;
}

bool has_prefix(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0 &&
         (s.size() == prefix.size() || s[prefix.size()] == '.');
}

}  // namespace

Config resolve(std::shared_ptr<const Schema> schema, const RawConfig& raw, int world_size,
               ConfigErrors& errors, const std::set<std::string>& skip_prefixes) {
  Config cfg;
  cfg.schema_ = schema;
  cfg.world_size_ = world_size;
  cfg.features_ = raw.feature_names();

  // Sections: every proper prefix of a declared path, plus `features.<name>`.
  std::set<std::string> sections;
  std::map<std::string, std::vector<std::string>> children;  // parent -> child names
  for (const auto& s : schema->options()) {
    auto parts = split(s.path, '.');
    std::string prefix;
    for (std::size_t i = 0; i < parts.size(); ++i) {
      std::string parent = prefix;
      prefix = prefix.empty() ? parts[i] : prefix + "." + parts[i];
      auto& kids = children[parent];
      if (std::find(kids.begin(), kids.end(), parts[i]) == kids.end()) kids.push_back(parts[i]);
      if (i + 1 < parts.size()) sections.insert(prefix);
    }
  }
  for (const auto& top : top_level_sections()) {
    sections.insert(top);
    auto& kids = children[""];
    if (std::find(kids.begin(), kids.end(), top) == kids.end()) kids.push_back(top);
  }

  auto skipped = [&](const std::string& path) {
    for (const auto& p : skip_prefixes) {
      if (has_prefix(path, p)) return true;
    }
    return false;
  };

  std::map<std::string, const RawEntry*> given;
  std::vector<std::string> reported_unknown;
  for (const auto& e : raw.entries()) {
    if (skipped(e.path)) continue;
    bool under_reported = false;
    for (const auto& r : reported_unknown) under_reported |= has_prefix(e.path, r);
    if (under_reported) continue;
    if (schema->find(e.path)) {
      given[e.path] = &e;
      continue;
    }
    if (sections.count(e.path)) {
      if (e.kind != RawEntry::Kind::kMap && e.kind != RawEntry::Kind::kNull) {
        errors.add(e.path, e.shown(), "is a section and needs a mapping of options",
                   join(children[e.path]));
      }
      continue;
    }
    // Under a declared leaf (the user wrote a mapping where a value goes):
    // convert() reports it at the leaf.
    bool under_leaf = false;
    for (const auto& g : given) under_leaf |= has_prefix(e.path, g.first);
    if (under_leaf) continue;
    auto dot = e.path.rfind('.');
    std::string parent = dot == std::string::npos ? "" : e.path.substr(0, dot);
    std::string leaf = dot == std::string::npos ? e.path : e.path.substr(dot + 1);
    const auto& kids = children[parent];
    std::string dym = did_you_mean(leaf, kids);
    std::string rule = "unknown key";
    if (!dym.empty()) rule += " (did you mean '" + (parent.empty() ? dym : parent + "." + dym) + "'?)";
    errors.add(e.path, e.kind == RawEntry::Kind::kMap ? "" : e.shown(), rule,
               kids.empty() ? "" : "keys here: " + join(kids));
    reported_unknown.push_back(e.path);
  }

  for (const auto& spec : schema->options()) {
    ConfigValue v = spec.default_value;
    auto it = given.find(spec.path);
    if (it != given.end()) {
      cfg.user_set_.insert(spec.path);
      if (!convert(spec, *it->second, v, errors)) {
        cfg.bad_.insert(spec.path);
        v = spec.default_value;
      }
    } else if (spec.required && !skipped(spec.path)) {
      errors.add(spec.path, "", "required option is missing", spec.legal());
      cfg.bad_.insert(spec.path);
    }
    cfg.order_.push_back(spec.path);
    cfg.values_.push_back(std::move(v));
  }

  for (const auto& rule : schema->rules()) rule(cfg, errors);
  return cfg;
}

}  // namespace hp
