#pragma once
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

namespace hp {

enum class OptionType { kBool, kInt, kFloat, kString, kEnum, kIntList, kStringList };

/// A resolved config value. Enums are stored as strings.
using ConfigValue = std::variant<bool, std::int64_t, double, std::string,
                                 std::vector<std::int64_t>, std::vector<std::string>>;

const char* type_name(OptionType t);
/// The value rendered as it would be written in YAML (flow style).
std::string to_string(const ConfigValue& v);

}  // namespace hp
