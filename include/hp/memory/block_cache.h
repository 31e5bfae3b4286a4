#pragma once
// A CPU allocator for large blocks that keeps freed blocks for reuse by
// size, in mappings of their own, instead of glibc's heap. A training step
// allocates the same large sizes in the same order every step; when blocks
// of very different lifetimes share one heap (ZeRO stage 3 gathers a
// block's parameters and frees them again between the activations), glibc's
// heap fragments and the process holds far more than it uses, since a heap
// only shrinks from its top. Here a block of at least the threshold is one
// mapping; a freed one waits in a list of its size class (eight per
// doubling) for the next request of that class (no page faults again),
// and trim() returns those no step needed (a low-water mark per class),
// so a size used once (a save gathering everything, the model's
// construction) goes back to the system.
// Smaller requests go to the allocator installed before. Process-wide and
// never uninstalled (blocks outlive every owner); thread-safe.
#include <cstddef>

namespace hp::memory {

struct BlockCacheStats {
  std::size_t in_use_bytes = 0;  ///< blocks handed out and not freed
  std::size_t cached_bytes = 0;  ///< freed blocks kept for reuse
  std::size_t peak_bytes = 0;    ///< most in use + cached at once
  std::size_t maps = 0;          ///< mappings made (a miss each)
  std::size_t reuses = 0;        ///< requests served from the cache
  std::size_t evictions = 0;     ///< cached blocks unmapped to stay under the cap
};

/// Makes the cache the CPU allocator for blocks of at least `min_bytes`
/// (from now on; what was allocated before is freed where it came from),
/// keeping at most `max_cached_bytes` of freed blocks (the ones freed
/// longest ago are unmapped first). Installing again only changes the two.
void use_block_cache(std::size_t min_bytes, std::size_t max_cached_bytes);
/// Whether use_block_cache was called in this process.
bool block_cache_installed();
/// Unmaps the cached blocks that stayed unused since the previous trim
/// (call once per step, at the same point of each).
void trim_block_cache();
/// Unmaps every cached block (after a one-off burst of frees: the whole
/// parameters released when they are first sharded, or after a save).
void release_block_cache();
BlockCacheStats block_cache_stats();

}  // namespace hp::memory
