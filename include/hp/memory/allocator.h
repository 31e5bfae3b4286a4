#pragma once
// Which malloc this process runs and how it keeps freed memory.
//
// hyperparallel's executables (hp-train, hp-plan, hp-eval, hp-generate)
// link mimalloc (Debian's libmimalloc2.0) ahead of glibc, so it serves
// every allocation of the process, LibTorch's tensors included. glibc's
// heap fragments under buffers whose sizes change from step to step (a
// MoE's expert buffers follow the routing): its resident size kept growing
// for 20 steps (the MoE GPT of 4 x 256: 709 MiB above start after 12 steps,
// 789 after 36) where mimalloc's stays flat (542). A program that links
// hp::framework alone keeps the malloc it has; link hp::allocator for
// mimalloc (docs/toolchain.md).
#include <string>

namespace hp::memory {

/// "mimalloc 2.0.9" when mimalloc serves malloc, else "glibc malloc".
std::string allocator_name();
/// True when mimalloc serves this process's malloc.
bool mimalloc_serves_malloc();
/// Freed memory stays in the process for the next step instead of going back
/// to the system and being page-faulted in again (mimalloc: no decommit;
/// glibc: no mmap below 1 GiB, the heap's top trimmed only above 1 GiB).
void keep_freed_memory();

}  // namespace hp::memory
