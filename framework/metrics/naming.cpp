#include "framework/metrics/naming.h"

#include <array>
#include <cctype>
#include <cstdint>
#include <stdexcept>
#include <vector>

namespace hp::metrics {
namespace {

bool is_lower_alpha(char c) { return c >= 'a' && c <= 'z'; }
bool is_upper_alpha(char c) { return c >= 'A' && c <= 'Z'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string quoted(const std::string& s) { return "'" + s + "'"; }

// The snake_case spelling of a rejected name, offered as the fix.
std::string snake_case(const std::string& name) {
  std::string out;
  for (std::size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    if (is_upper_alpha(c)) {
      if (i > 0 && (is_lower_alpha(name[i - 1]) || is_digit(name[i - 1]))) out += '_';
      out += static_cast<char>(c - 'A' + 'a');
    } else if (is_lower_alpha(c) || is_digit(c) || c == '_') {
      out += c;
    } else {
      out += '_';
    }
  }
  if (out.empty() || is_digit(out[0])) out.insert(out.begin(), '_');
  return out;
}

// Index of the first character outside the Prometheus syntax, or npos.
// `allow_colon` distinguishes metric names from label names.
std::size_t first_bad_char(const std::string& name, bool allow_colon) {
  for (std::size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool ok = is_lower_alpha(c) || is_upper_alpha(c) || c == '_' ||
                    (allow_colon && c == ':') || (i > 0 && is_digit(c));
    if (!ok) return i;
  }
  return std::string::npos;
}

std::string describe_char(char c) {
  if (std::isprint(static_cast<unsigned char>(c))) return quoted(std::string(1, c));
  return "byte " + std::to_string(static_cast<unsigned>(static_cast<unsigned char>(c)));
}

std::vector<std::string> words(const std::string& name) {
  std::vector<std::string> out(1);
  for (char c : name) {
    if (c == '_') {
      out.emplace_back();
    } else {
      out.back() += c;
    }
  }
  return out;
}

// Abbreviated units and the base unit to spell out instead.
struct UnitFix {
  const char* word;
  const char* base;
};
constexpr std::array<UnitFix, 18> kAbbreviations = {{
    {"s", "seconds"},
    {"sec", "seconds"},
    {"secs", "seconds"},
    {"ms", "seconds"},
    {"us", "seconds"},
    {"ns", "seconds"},
    {"min", "seconds"},
    {"mins", "seconds"},
    {"hr", "seconds"},
    {"hrs", "seconds"},
    {"kb", "bytes"},
    {"mb", "bytes"},
    {"gb", "bytes"},
    {"tb", "bytes"},
    {"kib", "bytes"},
    {"mib", "bytes"},
    {"gib", "bytes"},
    {"tib", "bytes"},
}};
constexpr std::array<const char*, 15> kPrefixes = {"nano", "micro", "milli", "centi", "deci",
                                                   "deca", "hecto", "kilo",  "mega",  "giga",
                                                   "tera", "kibi",  "mebi",  "gibi",  "tebi"};
constexpr std::array<const char*, 7> kBaseUnits = {"seconds", "bytes", "meters", "grams",
                                                   "joules",  "volts", "amperes"};
constexpr std::array<const char*, 4> kLongerTimeUnits = {"minutes", "hours", "days", "weeks"};
constexpr std::array<const char*, 4> kTypeWords = {"counter", "gauge", "histogram", "summary"};

// The base unit `word` should be written as, or "" when `word` is fine.
std::string base_unit_for(const std::string& word) {
  for (const auto& fix : kAbbreviations) {
    if (word == fix.word) return fix.base;
  }
  for (const char* unit : kLongerTimeUnits) {
    if (word == unit) return "seconds";
  }
  for (const char* prefix : kPrefixes) {
    for (const char* base : kBaseUnits) {
      if (word == std::string(prefix) + base) return base;
    }
  }
  return "";
}

void fail(const std::string& message) { throw std::invalid_argument(message); }

bool is_valid_utf8(const std::string& text) {
  std::size_t i = 0;
  while (i < text.size()) {
    const auto lead = static_cast<unsigned char>(text[i]);
    if (lead < 0x80) {
      ++i;
      continue;
    }
    std::size_t extra = 0;
    std::uint32_t code = 0;
    std::uint32_t min_code = 0;
    if ((lead & 0xE0) == 0xC0) {
      extra = 1;
      code = lead & 0x1Fu;
      min_code = 0x80;
    } else if ((lead & 0xF0) == 0xE0) {
      extra = 2;
      code = lead & 0x0Fu;
      min_code = 0x800;
    } else if ((lead & 0xF8) == 0xF0) {
      extra = 3;
      code = lead & 0x07u;
      min_code = 0x10000;
    } else {
      return false;
    }
    if (extra >= text.size() - i) return false;
    for (std::size_t k = 1; k <= extra; ++k) {
      const auto next = static_cast<unsigned char>(text[i + k]);
      if ((next & 0xC0) != 0x80) return false;
      code = (code << 6) | (next & 0x3Fu);
    }
    // Overlong forms, UTF-16 surrogates and code points past Unicode's end.
    if (code < min_code || (code >= 0xD800 && code <= 0xDFFF) || code > 0x10FFFF) return false;
    i += extra + 1;
  }
  return true;
}

}  // namespace

void check_metric_name(const std::string& name, MetricType type) {
  const std::string what = std::string(to_string(type)) + " " + quoted(name);
  if (name.empty()) fail(std::string("a ") + to_string(type) + " was given an empty name");
  const std::size_t bad = first_bad_char(name, /*allow_colon=*/true);
  if (bad != std::string::npos) {
    fail("metric name " + quoted(name) + " is invalid: " + describe_char(name[bad]) +
         " at position " + std::to_string(bad) +
         " is not allowed (Prometheus metric names match [a-zA-Z_:][a-zA-Z0-9_:]*); use " +
         quoted(snake_case(name)));
  }
  if (name.find(':') != std::string::npos) {
    fail("metric name " + quoted(name) +
         " contains ':', which Prometheus reserves for recording rules; use " +
         quoted(snake_case(name)));
  }
  for (char c : name) {
    if (is_upper_alpha(c)) {
      fail("metric name " + quoted(name) +
           " is not snake_case (lower-case letters, digits and '_'); use " +
           quoted(snake_case(name)));
    }
  }
  const bool has_total = ends_with(name, "_total");
  if (type == MetricType::kCounter && !has_total) {
    fail(what + " must end in '_total' (the Prometheus convention for counters); use " +
         quoted(name + "_total"));
  }
  if (type != MetricType::kCounter && has_total) {
    fail(what +
         " must not end in '_total': only counters do; drop the suffix or make it a counter");
  }
  for (const char* suffix : {"_bucket", "_count", "_sum"}) {
    if (ends_with(name, suffix)) {
      fail(what + " must not end in " + quoted(suffix) +
           ": a histogram's own series end in _bucket, _count and _sum; choose another name");
    }
  }
  for (const std::string& word : words(name)) {
    for (const char* type_word : kTypeWords) {
      if (word == type_word) {
        fail(what + " contains the type word " + quoted(word) +
             ": the # TYPE line already says what it is; drop it from the name");
      }
    }
    const std::string base = base_unit_for(word);
    if (!base.empty()) {
      std::string message = what + " uses the unit " + quoted(word);
      message += ": Prometheus names use base units spelled out; use '_";
      message += base;
      message += "' and convert the value";
      fail(message);
    }
  }
}

void check_label_name(const std::string& label, const std::string& owner) {
  if (label.empty()) fail("a label name of " + owner + " is empty");
  const std::size_t bad = first_bad_char(label, /*allow_colon=*/false);
  if (bad != std::string::npos) {
    fail("label name " + quoted(label) + " of " + owner +
         " is invalid: " + describe_char(label[bad]) + " at position " + std::to_string(bad) +
         " is not allowed (Prometheus label names match [a-zA-Z_][a-zA-Z0-9_]*); use " +
         quoted(snake_case(label)));
  }
  if (label.compare(0, 2, "__") == 0) {
    fail("label name " + quoted(label) + " of " + owner +
         " starts with '__', which Prometheus reserves for its own labels; drop the leading "
         "underscores");
  }
  for (char c : label) {
    if (is_upper_alpha(c)) {
      fail("label name " + quoted(label) + " of " + owner +
           " is not snake_case (lower-case letters, digits and '_'); use " +
           quoted(snake_case(label)));
    }
  }
}

void check_label_value(const std::string& value, const std::string& label,
                       const std::string& owner) {
  if (!is_valid_utf8(value)) {
    fail("the value of label " + quoted(label) + " of " + owner +
         " is not valid UTF-8, which the Prometheus text format requires");
  }
}

void check_help(const std::string& help, const std::string& metric) {
  if (help.empty()) {
    fail("metric " + quoted(metric) + " has no help text; say what it measures and in which unit");
  }
  if (!is_valid_utf8(help)) {
    fail("the help text of metric " + quoted(metric) +
         " is not valid UTF-8, which the Prometheus text format requires");
  }
}

}  // namespace hp::metrics
