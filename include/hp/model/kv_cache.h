#pragma once
// Generation's key/value cache. While a KvCacheScope is alive, every
// attention layer stores the keys and values of the positions it computes
// (after rotary, before grouped heads are repeated) and, when decoding,
// attends over everything stored so far instead of only the positions of
// the forward. The generator says which global positions each sample's
// tokens stand at (prefill: 0..L-1 for every sample, right-padded prompts;
// decode: one position per sample, each at its own length), so prompts of
// different lengths share one batch. Layers that add position tables or
// rotary embeddings read the same positions.
//
// Entries are keyed by the attention layer and the micro-batch's first
// global sample (include/hp/model/dropout.h), so pipeline stages keep their
// own layers' caches and micro-batches of requests do not mix.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <utility>

namespace hp {

class KvCache {
 public:
  /// Room for `max_len` positions per sample; `first_sample` is the global
  /// index of this rank's first sample (positions() rows start there).
  KvCache(std::int64_t max_len, std::int64_t first_sample)
      : max_len_(max_len), first_sample_(first_sample) {}

  /// The positions of the forward about to run: [samples, T] int64, one row
  /// per sample this rank holds. `decoding` false: a prefill (T positions
  /// 0..T-1 for every sample; attention runs as in training); true: each
  /// sample's queries attend over the cache up to their own position.
  void set_positions(at::Tensor positions, bool decoding);
  bool decoding() const { return decoding_; }
  /// The positions of the micro-batch whose first global sample is
  /// `first_sample` and which holds `samples` samples.
  at::Tensor positions(std::int64_t first_sample, std::int64_t samples) const;

  /// Stores k and v ([samples, T, kv_heads, head_dim]) of `layer` for the
  /// micro-batch at `first_sample` at their positions; returns the cached
  /// keys and values [samples, L, kv_heads, head_dim], L one past the
  /// largest position stored, and the mask [samples, 1, T, L] (true: a key
  /// the query must not see: a later position).
  struct View {
    at::Tensor k, v, hidden;
  };
  View store(const void* layer, std::int64_t first_sample, const at::Tensor& k,
             const at::Tensor& v);

  /// Bytes the cache holds, and what one position of one sample takes
  /// (bytes / (samples x max_len) summed over layers).
  std::int64_t bytes() const;
  std::int64_t bytes_per_token() const;
  /// The terms of bytes_per_token(): attention layers on this rank, their
  /// key/value heads on this rank, the head width and the element size.
  struct Shape {
    std::int64_t layers = 0, kv_heads = 0, head_dim = 0, element_bytes = 0;
  };
  Shape shape() const;

 private:
  struct Entry {
    at::Tensor k, v;  // [samples, max_len, kv_heads, head_dim]
  };
  std::int64_t max_len_, first_sample_;
  bool decoding_ = false;
  at::Tensor positions_;
  std::map<std::pair<const void*, std::int64_t>, Entry> entries_;
};

/// Whether this process is generating (a GenerationScope is alive): MoE
/// routing is then dropless whatever model.moe.capacity_factor says, as
/// inference engines route (capacity ranks a whole training sequence, which
/// a prompt being continued is not).
bool generating();

class GenerationScope {
 public:
  GenerationScope();
  ~GenerationScope();
  GenerationScope(const GenerationScope&) = delete;
  GenerationScope& operator=(const GenerationScope&) = delete;
};

/// The cache of the generation in progress on this process (null: none).
KvCache* current_kv_cache();

/// Makes `cache` the current one for its lifetime.
class KvCacheScope {
 public:
  explicit KvCacheScope(KvCache* cache);
  ~KvCacheScope();
  KvCacheScope(const KvCacheScope&) = delete;
  KvCacheScope& operator=(const KvCacheScope&) = delete;

 private:
  KvCache* saved_;
};

/// Attention of one decode step: q [samples, T, heads, head_dim] over the
/// cached k and v (grouped heads repeated), the view's mask applied;
/// products in q's type, scores and softmax in fp32 (as causal_attention).
/// Returns [samples, T, heads * head_dim].
at::Tensor cached_attention(const at::Tensor& q, const KvCache::View& kv);

}  // namespace hp
