#pragma once
// An explicit, keyed registry: entries are added by a function call (never
// by a static initialiser), a duplicate name is refused, and an unknown
// name is answered with the names there are.
#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

namespace hp {

template <typename Entry>
class Registry {
 public:
  explicit Registry(std::string what) : what_(std::move(what)) {}

  /// Adds `entry` (which has a `name`); throws std::invalid_argument on a
  /// duplicate name.
  void add(Entry entry) {
    if (find(entry.name)) throw std::invalid_argument(what_ + " '" + entry.name + "' is registered twice");
    entries_.push_back(std::move(entry));
  }
  const Entry* find(const std::string& name) const {
    for (const auto& e : entries_) {
      if (e.name == name) return &e;
    }
    return nullptr;
  }
  const Entry& get(const std::string& name) const {
    if (const Entry* e = find(name)) return *e;
    std::string known;
    for (const auto& n : names()) known += (known.empty() ? "" : ", ") + n;
    throw std::invalid_argument("no " + what_ + " named '" + name + "' (registered: " + known + ")");
  }
  /// Names in registration order.
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& e : entries_) out.push_back(e.name);
    return out;
  }
  const std::vector<Entry>& entries() const { return entries_; }

 private:
  std::string what_;
  std::vector<Entry> entries_;
};

}  // namespace hp
