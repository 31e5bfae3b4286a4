#pragma once
// A CPU allocator for LibTorch's large tensors: one best-fit pool with
// free neighbours joined, in address space reserved a gigabyte at a time,
// instead of the malloc heap. A freed block is reused by the next request
// it fits (the rest stays free), so the resident size follows the largest
// set of blocks a step holds at once plus the gaps best fit leaves; where
// a block lands depends only on the sequence of large requests and frees.
// Under mimalloc the same sequence did not give the same resident size:
// its large blocks share 32 MiB segments with the small pages every thread
// touches, and a rank of the same run peaked 129 or 150 MiB above start
// (GPT 4 x 256, optimizer state sharded over 2 ranks) with the same large
// requests in the same order. Memory is kept for reuse, never returned (run.keep_freed_memory).
// Smaller requests go to the allocator installed before. Process-wide and
// never uninstalled; thread-safe.
#include <cstddef>

namespace hp::memory {

struct LargePoolStats {
  std::size_t in_use_bytes = 0;       ///< blocks handed out and not freed
  std::size_t peak_in_use_bytes = 0;  ///< most in use at once
  std::size_t touched_bytes = 0;      ///< the pool's extent: in use, free gaps and freed blocks
  std::size_t regions = 0;            ///< address-space reservations made
};

/// The size from which hp-train's tensors come from the pool: above
/// mimalloc's small pages (the threshold moved peaks by under 2 % between
/// 16 and 256 KiB).
constexpr std::size_t kLargeBlockMin = std::size_t{64} << 10;

/// Makes the pool the CPU allocator for blocks of at least `min_bytes`
/// (from now on; what was allocated before is freed where it came from).
/// Installing again does nothing.
void use_large_block_pool(std::size_t min_bytes);
bool large_block_pool_installed();
LargePoolStats large_block_pool_stats();

}  // namespace hp::memory
