#include "hp/memory/allocator.h"

#include <dlfcn.h>
#include <malloc.h>
#include <mimalloc.h>  // the option's number only: mimalloc is reached through dlsym

namespace hp::memory {

namespace {
void* symbol(const char* name) { return dlsym(RTLD_DEFAULT, name); }
}  // namespace

bool mimalloc_serves_malloc() {
  // An executable that links mimalloc first resolves malloc to mimalloc's
  // own entry (an alias of mi_malloc); a library that merely loads it does not.
  void* mi = symbol("mi_malloc");
  return mi != nullptr && mi == symbol("malloc");
}

std::string allocator_name() {
  if (!mimalloc_serves_malloc()) return "glibc malloc";
  auto version = reinterpret_cast<int (*)()>(symbol("mi_version"));
  if (!version) return "mimalloc";
  const int v = version();
  return "mimalloc " + std::to_string(v / 100) + "." + std::to_string(v % 100 / 10) + "." + std::to_string(v % 10);
}

void keep_freed_memory() {
  if (mimalloc_serves_malloc()) {
    if (auto disable = reinterpret_cast<void (*)(mi_option_t)>(symbol("mi_option_disable")))
      disable(mi_option_allow_decommit);
    return;
  }
  constexpr int kGiB = 1 << 30;
  mallopt(M_MMAP_THRESHOLD, kGiB);
  mallopt(M_TRIM_THRESHOLD, kGiB);
}

}  // namespace hp::memory
