#include "hp/memory/large_pool.h"

#include "backends/memory/detail/wrap.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

namespace hp::memory {

namespace {

constexpr std::size_t kPage = 4096;
/// Address space reserved at a time (pages are resident only once touched).
constexpr std::size_t kRegion = std::size_t{1} << 30;

std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

class LargePool final : public c10::Allocator {
 public:
  LargePool(c10::Allocator* fallback, std::size_t min_bytes) : fallback_(fallback), min_bytes_(min_bytes) {}

  c10::DataPtr allocate(std::size_t n) const override {
    if (n < min_bytes_) return fallback_->allocate(n);
    void* p = take(round_up(n, kPage));
    return {p, p, &LargePool::free_any, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &LargePool::free_any; }

  LargePoolStats stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

  static void free_any(void* p);
  c10::DeleterFnPtr fallback_deleter = nullptr;

 private:
  struct Region {
    char* base = nullptr;
    std::size_t size = 0;
    std::size_t top = 0;  ///< bytes below it handed out at least once
  };

  /// The smallest free block that fits (the lowest address among equals),
  /// split; else the region's untouched top. mu_ held.
  void* take(std::size_t size) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = by_size_.lower_bound({size, nullptr});
    char* p = nullptr;
    if (it != by_size_.end()) {
      p = it->second;
      const std::size_t have = it->first;
      by_size_.erase(it);
      by_addr_.erase(p);
      if (have > size) add_free(p + size, have - size);
    } else {
      p = from_top(size);
    }
    live_[p] = size;
    stats_.in_use_bytes += size;
    stats_.peak_in_use_bytes = std::max(stats_.peak_in_use_bytes, stats_.in_use_bytes);
    return p;
  }

  /// Extends the last region's handed-out part (taking a free block that
  /// ends at its top along), or reserves a new region.
  char* from_top(std::size_t size) const {
    if (!regions_.empty()) {
      Region& r = regions_.back();
      char* start = r.base + r.top;
      // A free block ending at the top joins the new block.
      auto last = by_addr_.empty() ? by_addr_.end() : std::prev(by_addr_.end());
      if (last != by_addr_.end() && last->first + last->second == start && last->first >= r.base) {
        const std::size_t need = size - last->second;
        if (r.top + need <= r.size) {
          char* p = last->first;
          by_size_.erase({last->second, p});
          by_addr_.erase(last);
          r.top += need;
          stats_.touched_bytes = std::max(stats_.touched_bytes, total_top());
          return p;
        }
      }
      if (r.top + size <= r.size) {
        r.top += size;
        stats_.touched_bytes = std::max(stats_.touched_bytes, total_top());
        return start;
      }
    }
    const std::size_t bytes = std::max(kRegion, round_up(size, kRegion));
    void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) {
      throw std::runtime_error("large block pool: reserving " + std::to_string(bytes) +
                               " bytes of address space: " + std::strerror(errno) +
                               " (out of address space, or vm.overcommit_memory=2 with too little commit "
                               "left; run.large_block_pool=false runs without the pool)");
    }
    regions_.push_back({static_cast<char*>(m), bytes, size});
    ++stats_.regions;
    stats_.touched_bytes = std::max(stats_.touched_bytes, total_top());
    return static_cast<char*>(m);
  }
  std::size_t total_top() const {
    std::size_t t = 0;
    for (const auto& r : regions_) t += r.top;
    return t;
  }

  void add_free(char* p, std::size_t size) const {
    by_addr_[p] = size;
    by_size_.insert({size, p});
  }

 public:
  bool give_back(void* vp) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(vp);
    if (it == live_.end()) return false;
    char* p = static_cast<char*>(vp);
    std::size_t size = it->second;
    live_.erase(it);
    stats_.in_use_bytes -= size;
    // Joins the free neighbours on both sides.
    auto next = by_addr_.lower_bound(p);
    if (next != by_addr_.end() && p + size == next->first && same_region(p, next->first)) {
      size += next->second;
      by_size_.erase({next->second, next->first});
      next = by_addr_.erase(next);
    }
    if (next != by_addr_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == p && same_region(prev->first, p)) {
        p = prev->first;
        size += prev->second;
        by_size_.erase({prev->second, prev->first});
        by_addr_.erase(prev);
      }
    }
    add_free(p, size);
    return true;
  }

 private:
  bool same_region(const char* a, const char* b) const {
    for (const auto& r : regions_) {
      const bool in_a = a >= r.base && a < r.base + r.size, in_b = b >= r.base && b < r.base + r.size;
      if (in_a || in_b) return in_a && in_b;
    }
    return false;
  }

  c10::Allocator* fallback_;
  const std::size_t min_bytes_;
  mutable std::mutex mu_;
  mutable std::vector<Region> regions_;
  mutable std::set<std::pair<std::size_t, char*>> by_size_;
  mutable std::map<char*, std::size_t> by_addr_;
  mutable std::unordered_map<void*, std::size_t> live_;
  mutable LargePoolStats stats_;
};

std::mutex g_install;
LargePool* g_pool = nullptr;  // never destroyed: blocks outlive every owner

void LargePool::free_any(void* p) {
  if (g_pool->give_back(p)) return;
  g_pool->fallback_deleter(p);
}

}  // namespace

void use_large_block_pool(std::size_t min_bytes) {
  std::lock_guard<std::mutex> lock(g_install);
  if (g_pool != nullptr) return;
  c10::Allocator* before = detail::allocator_to_wrap("large block pool");
  g_pool = new LargePool(before, std::max(min_bytes, kPage));
  g_pool->fallback_deleter = before->raw_deleter();
  c10::SetCPUAllocator(g_pool, /*priority=*/1);
}

bool large_block_pool_installed() {
  std::lock_guard<std::mutex> lock(g_install);
  return g_pool != nullptr;
}

LargePoolStats large_block_pool_stats() {
  std::lock_guard<std::mutex> lock(g_install);
  return g_pool == nullptr ? LargePoolStats{} : g_pool->stats();
}

}  // namespace hp::memory
