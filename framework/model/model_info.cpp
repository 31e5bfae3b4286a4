#include "hp/model/model_info.h"

#include "hp/config/errors.h"

namespace hp {

bool ModelInfo::check_divides(const std::string& role, std::int64_t by, const std::string& key,
                              ConfigErrors& errors) const {
  const SplitSize* s = size(role);
  if (!s || by <= 0 || s->value % by == 0) return true;
  errors.add(key, std::to_string(by),
             s->what + " = " + std::to_string(s->value) + " (" + s->key + ") is not divisible by it",
             "a divisor of " + std::to_string(s->value));
  return false;
}

}  // namespace hp
