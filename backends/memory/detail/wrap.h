#pragma once
// What the block cache and the large block pool share when they install
// themselves as c10's CPU allocator: the allocator in place, which serves
// the requests below their threshold and frees, through its raw deleter,
// the blocks it handed out before them.
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <stdexcept>
#include <string>

namespace hp::memory::detail {

/// The CPU allocator in place; throws, naming `who`, when it has no raw
/// deleter (its blocks could not be told from the new allocator's).
inline c10::Allocator* allocator_to_wrap(const std::string& who) {
  c10::Allocator* before = c10::GetCPUAllocator();
  if (before->raw_deleter() == nullptr) {
    throw std::runtime_error(who + ": the CPU allocator in place has no raw deleter, so blocks it allocated "
                             "could not be told from the " + who + "'s; run without the " + who);
  }
  return before;
}

}  // namespace hp::memory::detail
