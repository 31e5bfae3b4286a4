#include "hp/config/errors.h"

namespace hp {

std::string ConfigIssue::format() const {
  std::string s = "config error: " + path;
  if (!value.empty()) s += " = " + value;
  s += ": " + rule;
  if (!legal.empty()) s += " (legal: " + legal + ")";
  return s;
}

void ConfigErrors::add(std::string path, std::string value, std::string rule, std::string legal) {
  issues_.push_back({std::move(path), std::move(value), std::move(rule), std::move(legal)});
}

std::string ConfigErrors::format() const {
  std::string out;
  for (const auto& i : issues_) out += i.format() + "\n";
  return out;
}

void ConfigErrors::throw_if_any() const {
  if (!issues_.empty()) throw ConfigException(*this);
}

namespace {
std::string lines_of(const std::vector<ConfigIssue>& issues) {
  std::string out;
  for (std::size_t i = 0; i < issues.size(); ++i) {
    if (i) out += "\n";
    out += issues[i].format();
  }
  return out;
}
}  // namespace

ConfigException::ConfigException(const ConfigErrors& errors)
    : std::runtime_error(lines_of(errors.issues())), issues_(errors.issues()) {}

ConfigException::ConfigException(std::string path, std::string value, std::string rule,
                                 std::string legal)
    : ConfigException([&] {
        ConfigErrors e;
        e.add(std::move(path), std::move(value), std::move(rule), std::move(legal));
        return e;
      }()) {}

}  // namespace hp
