#include "hp/fault/fault.h"

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

namespace hp::fault {

namespace {

// The named points. One line each: name, action, where it fires.
const std::vector<Point> kPoints = {
    {"checkpoint.after_files", Action::kKill,
     "a checkpoint writer, after a shard file's data is written (before the rank's manifest part)"},
    {"checkpoint.before_rename", Action::kKill,
     "checkpoint commit (rank 0), after manifest.json, state.json and config.yaml are written, "
     "before "
     "step_X.tmp is renamed to step_X"},
    {"checkpoint.before_latest", Action::kKill,
     "checkpoint commit (rank 0), after the rename, before `latest` is moved"},
    {"checkpoint.async_write", Action::kThrow,
     "sharded_checkpoint's background write on every rank, before its first file: the write fails, "
     "the run "
     "stops at the next step naming rank, file and tensor"},
};

std::vector<std::string> requested() {
  std::vector<std::string> out;
  const char* v = std::getenv(kVariable);
  if (v == nullptr) return out;
  std::string s(v);
  std::size_t begin = 0;
  while (begin <= s.size()) {
    auto end = s.find(',', begin);
    if (end == std::string::npos) end = s.size();
    std::string name = s.substr(begin, end - begin);
    const auto first = name.find_first_not_of(" \t");
    const auto last = name.find_last_not_of(" \t");
    name = first == std::string::npos ? "" : name.substr(first, last - first + 1);
    if (!name.empty()) out.push_back(name);
    begin = end + 1;
  }
  return out;
}

const Point* find(const std::string& name) {
  for (const auto& p : kPoints) {
    if (name == p.name) return &p;
  }
  return nullptr;
}

}  // namespace

const std::vector<Point>& points() { return kPoints; }

const char* action_name(Action a) { return a == Action::kKill ? "kill" : "throw"; }

std::string legal_points() {
  std::string out;
  for (const auto& p : kPoints) out += (out.empty() ? "" : ", ") + std::string(p.name);
  return out;
}

std::string unknown_points() {
  std::string out;
  for (const auto& name : requested()) {
    if (!find(name)) out += (out.empty() ? "" : ", ") + name;
  }
  return out;
}

void check_environment() {
  const std::string unknown = unknown_points();
  if (unknown.empty()) return;
  throw std::invalid_argument(std::string(kVariable) + " = " + std::getenv(kVariable) +
                              ": unknown fault point " + unknown + " (legal: " + legal_points() +
                              "; several separated by commas)");
}

bool armed(const char* point) {
  if (!find(point)) {
    throw std::logic_error(std::string("fault point '") + point +
                           "' is not in the table of backends/fault/fault.cpp; add its line there");
  }
  for (const auto& name : requested()) {
    if (name == point) return true;
  }
  return false;
}

void hit(const char* point, const std::string& what) {
  if (!armed(point)) return;
  if (find(point)->action == Action::kKill) {
    std::raise(SIGKILL);
    return;
  }
  throw std::runtime_error((what.empty() ? std::string("fault point ") + point : what) +
                           ": injected failure (" + kVariable + "=" + point + ")");
}

}  // namespace hp::fault
