#include "framework/model/tensor_dump.h"

#include <ATen/ATen.h>

#include <atomic>
#include <map>
#include <mutex>

#include "hp/model/aux_loss.h"
#include "hp/model/dropout.h"

namespace hp::tensor_dump {

namespace {

std::atomic<unsigned> g_configured{kNothing};
std::atomic<unsigned> g_open{kNothing};
std::mutex g_mutex;
std::vector<std::pair<std::string, at::Tensor>> g_records;
std::map<std::string, int> g_seen;

}  // namespace

void configure(unsigned what) { g_configured.store(what); }
unsigned configured() { return g_configured.load(); }

void begin_step(unsigned what) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_records.clear();
  g_seen.clear();
  // Activations include the routing.
  if (what & kActivations) what |= kRouting;
  g_open.store(what);
}

std::vector<std::pair<std::string, at::Tensor>> end_step() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_open.store(kNothing);
  g_seen.clear();
  return std::move(g_records);
}

bool recording(What what) {
  if ((g_open.load(std::memory_order_relaxed) & what) == 0) return false;
  return aux_loss_collecting() && !aux_loss_replaying();
}

void record(const std::string& name, const std::string& what, const at::Tensor& t) {
  std::string key = name + ":" + what + "@s" + std::to_string(current_dropout_site().first_sample);
  at::Tensor copy = t.detach().clone().contiguous();
  std::lock_guard<std::mutex> lock(g_mutex);
  const int n = ++g_seen[key];
  if (n > 1) key += "#" + std::to_string(n);
  g_records.emplace_back(std::move(key), std::move(copy));
}

}  // namespace hp::tensor_dump
