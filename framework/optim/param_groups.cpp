#include "hp/optim/param_groups.h"

#include <yaml-cpp/yaml.h>

#include <sstream>

#include "hp/config/config.h"
#include "hp/config/errors.h"

namespace hp {

const char* decay_on_name(DecayOn d) {
  switch (d) {
    case DecayOn::kMatrices: return "matrices";
    case DecayOn::kMatricesAndEmbeddings: return "matrices_and_embeddings";
    case DecayOn::kAll: return "all";
  }
  return "?";
}

bool glob_match(const std::string& pattern, const std::string& name) {
  // Iterative wildcard match: on a mismatch after a `*`, let that star
  // take one more character.
  std::size_t p = 0, n = 0, star = std::string::npos, mark = 0;
  while (n < name.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == name[n])) {
      ++p;
      ++n;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      mark = n;
    } else if (star != std::string::npos) {
      p = star + 1;
      n = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

namespace {
constexpr const char* kKey = "optimizer.groups";
constexpr const char* kLegal =
    "a list of {match: GLOB, weight_decay: X >= 0, lr_scale: Y > 0, name: N}, e.g. "
    "[{match: \"*.norm*\", weight_decay: 0}, {match: \"embed*\", lr_scale: 0.1}]";
}  // namespace

std::vector<GroupRule> parse_group_rules(const std::vector<std::string>& items, ConfigErrors* errors) {
  std::vector<GroupRule> out;
  auto bad = [&](const std::string& item, const std::string& rule) {
    if (errors) {
      errors->add(kKey, item, rule, kLegal);
      return;
    }
    throw ConfigException(kKey, item, rule, kLegal);
  };
  for (std::size_t i = 0; i < items.size(); ++i) {
    const std::string where = "item " + std::to_string(i);
    YAML::Node node;
    try {
      node = YAML::Load(items[i]);
    } catch (const std::exception&) {
      bad(items[i], where + " is not a mapping");
      continue;
    }
    if (!node.IsMap()) {
      bad(items[i], where + " is not a mapping");
      continue;
    }
    GroupRule r;
    r.name = "groups[" + std::to_string(i) + "]";
    bool ok = true;
    for (const auto& kv : node) {
      const std::string key = kv.first.as<std::string>();
      try {
        if (key == "match") {
          r.match = kv.second.as<std::string>();
        } else if (key == "name") {
          r.name = kv.second.as<std::string>();
        } else if (key == "weight_decay") {
          r.weight_decay = kv.second.as<double>();
          if (*r.weight_decay < 0 || *r.weight_decay > 10) {
            bad(items[i], where + ": weight_decay " + kv.second.as<std::string>() + " is outside [0, 10]");
            ok = false;
          }
        } else if (key == "lr_scale") {
          r.lr_scale = kv.second.as<double>();
          if (!(r.lr_scale > 0) || r.lr_scale > 1000) {
            bad(items[i], where + ": lr_scale " + kv.second.as<std::string>() + " is outside (0, 1000]");
            ok = false;
          }
        } else {
          bad(items[i], where + ": unknown key '" + key + "' (known: match, weight_decay, lr_scale, name)");
          ok = false;
        }
      } catch (const YAML::Exception&) {
        bad(items[i], where + ": '" + key + "' has a value of the wrong type");
        ok = false;
      }
    }
    if (ok && r.match.empty()) {
      bad(items[i], where + " has no match pattern");
      ok = false;
    }
    if (ok && !r.weight_decay && r.lr_scale == 1.0) {
      bad(items[i], where + " sets neither weight_decay nor lr_scale (it would change nothing)");
      ok = false;
    }
    if (ok) out.push_back(r);
  }
  return out;
}

GroupPolicy GroupPolicy::from(const Config& c) {
  GroupPolicy p;
  p.weight_decay = c.get_float("optimizer.weight_decay");
  const std::string& on = c.get_string("optimizer.weight_decay_on");
  p.on = on == "all" ? DecayOn::kAll : on == "matrices_and_embeddings" ? DecayOn::kMatricesAndEmbeddings
                                                                       : DecayOn::kMatrices;
  p.rules = parse_group_rules(c.get_string_list("optimizer.groups"));
  return p;
}

ParamHyper GroupPolicy::of(const std::string& name, const std::vector<std::int64_t>& global_shape,
                           bool embedding) const {
  const bool decays = on == DecayOn::kAll ||
                      (global_shape.size() >= 2 && (!embedding || on == DecayOn::kMatricesAndEmbeddings));
  ParamHyper h{decays ? "decay" : "no_decay", decays ? weight_decay : 0.0, 1.0};
  for (const auto& r : rules) {
    if (!glob_match(r.match, name)) continue;
    h.group = r.name;
    if (r.weight_decay) h.weight_decay = *r.weight_decay;
    h.lr_scale = r.lr_scale;
    break;
  }
  return h;
}

std::string GroupPolicy::describe() const {
  std::ostringstream o;
  o << "weight_decay " << weight_decay << " on " << decay_on_name(on);
  for (const auto& r : rules) {
    o << "; " << r.name << " (" << r.match << ":";
    if (r.weight_decay) o << " weight_decay " << *r.weight_decay;
    if (r.lr_scale != 1.0) o << " lr_scale " << r.lr_scale;
    o << ")";
  }
  return o.str();
}

}  // namespace hp
