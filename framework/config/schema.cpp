#include "hp/config/schema.h"

#include <cmath>
#include <sstream>
#include <stdexcept>

#include "framework/util/strings.h"

namespace hp {

namespace {
std::string num(double d) {
  if (std::floor(d) == d && std::fabs(d) < 1e15) return std::to_string(static_cast<long long>(d));
  std::ostringstream os;
  os << d;
  return os.str();
}
}  // namespace

std::string OptionSpec::legal() const {
  std::string base;
  switch (type) {
    case OptionType::kBool: base = "true or false"; break;
    case OptionType::kEnum: base = "one of: " + join(choices); break;
    case OptionType::kString: base = "a string"; break;
    case OptionType::kStringList: base = "a list of strings"; break;
    case OptionType::kInt:
    case OptionType::kFloat:
    case OptionType::kIntList: {
      std::string what = type == OptionType::kInt     ? "an integer"
                         : type == OptionType::kFloat ? "a number"
                                                      : "a list of integers";
      if (min && max) {
        base = what + (type == OptionType::kIntList ? ", each in [" : " in [") + num(*min) + ", " +
               num(*max) + "]";
      } else if (min) {
        base = what + (type == OptionType::kIntList ? ", each >= " : " >= ") + num(*min);
      } else if (max) {
        base = what + (type == OptionType::kIntList ? ", each <= " : " <= ") + num(*max);
      } else {
        base = what;
      }
      break;
    }
  }
  if (!empty_list_word.empty()) base += ", or " + empty_list_word;
  if (!legal_note.empty()) base += "; " + legal_note;
  return base;
}

OptionSpec& Schema::add(OptionSpec spec) {
  if (index_.count(spec.path)) {
    throw std::logic_error("internal error: option '" + spec.path +
                           "' declared twice, please report");
  }
  index_[spec.path] = specs_.size();
  specs_.push_back(std::move(spec));
  return specs_.back();
}

OptionSpec& Schema::add_bool(const std::string& path, bool def) {
  OptionSpec s;
  s.path = path;
  s.type = OptionType::kBool;
  s.default_value = def;
  return add(std::move(s));
}
OptionSpec& Schema::add_int(const std::string& path, std::int64_t def) {
  OptionSpec s;
  s.path = path;
  s.type = OptionType::kInt;
  s.default_value = def;
  return add(std::move(s));
}
OptionSpec& Schema::add_float(const std::string& path, double def) {
  OptionSpec s;
  s.path = path;
  s.type = OptionType::kFloat;
  s.default_value = def;
  return add(std::move(s));
}
OptionSpec& Schema::add_string(const std::string& path, std::string def) {
  OptionSpec s;
  s.path = path;
  s.type = OptionType::kString;
  s.default_value = std::move(def);
  return add(std::move(s));
}
OptionSpec& Schema::add_enum(const std::string& path, std::string def,
                             std::vector<std::string> choices) {
  OptionSpec s;
  s.path = path;
  s.type = OptionType::kEnum;
  s.default_value = std::move(def);
  s.choices = std::move(choices);
  return add(std::move(s));
}
OptionSpec& Schema::add_int_list(const std::string& path, std::vector<std::int64_t> def) {
  OptionSpec s;
  s.path = path;
  s.type = OptionType::kIntList;
  s.default_value = std::move(def);
  return add(std::move(s));
}
OptionSpec& Schema::add_string_list(const std::string& path, std::vector<std::string> def) {
  OptionSpec s;
  s.path = path;
  s.type = OptionType::kStringList;
  s.default_value = std::move(def);
  return add(std::move(s));
}

const OptionSpec* Schema::find(const std::string& path) const {
  auto it = index_.find(path);
  return it == index_.end() ? nullptr : &specs_[it->second];
}

std::vector<std::string> Schema::paths_under(const std::string& prefix) const {
  std::vector<std::string> out;
  for (const auto& s : specs_) {
    if (s.path.compare(0, prefix.size(), prefix) == 0) out.push_back(s.path);
  }
  return out;
}

std::string Schema::to_markdown(const std::string& prefix) const {
  std::string out =
      "| key | type | default | required | meaning | legal range | error behaviour |\n"
      "| --- | --- | --- | --- | --- | --- | --- |\n";
  for (const auto& s : specs_) {
    if (s.path.compare(0, prefix.size(), prefix) != 0) continue;
    std::string legal = s.legal();
    out += "| `" + s.path + "` | " + type_name(s.type) + " | `" + to_string(s.default_value) +
           "` | " + (s.required ? "yes" : "no") + " | " + s.doc + " | " + legal +
           " | refused before start, exit 2 |\n";
  }
  return out;
}

}  // namespace hp
