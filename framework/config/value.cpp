#include "hp/config/value.h"

#include <sstream>

namespace hp {

const char* type_name(OptionType t) {
  switch (t) {
    case OptionType::kBool: return "bool";
    case OptionType::kInt: return "int";
    case OptionType::kFloat: return "float";
    case OptionType::kString: return "string";
    case OptionType::kEnum: return "enum";
    case OptionType::kIntList: return "list of int";
    case OptionType::kStringList: return "list of string";
  }
  return "?";
}

namespace {
std::string format_double(double d) {
  std::ostringstream os;
  os.precision(10);
  os << d;
  std::string s = os.str();
  // Keep a float recognisable as one when printed back as YAML.
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}
}  // namespace

std::string to_string(const ConfigValue& v) {
  struct Visitor {
    std::string operator()(bool b) const { return b ? "true" : "false"; }
    std::string operator()(std::int64_t i) const { return std::to_string(i); }
    std::string operator()(double d) const { return format_double(d); }
    std::string operator()(const std::string& s) const { return s.empty() ? "\"\"" : s; }
    std::string operator()(const std::vector<std::int64_t>& l) const {
      std::string out = "[";
      for (std::size_t i = 0; i < l.size(); ++i) out += (i ? ", " : "") + std::to_string(l[i]);
      return out + "]";
    }
    std::string operator()(const std::vector<std::string>& l) const {
      std::string out = "[";
      for (std::size_t i = 0; i < l.size(); ++i) out += (i ? ", " : "") + l[i];
      return out + "]";
    }
  };
  return std::visit(Visitor{}, v);
}

}  // namespace hp
