#include "hp/model/kv_cache.h"

#include <ATen/ATen.h>

#include <atomic>
#include <limits>
#include <stdexcept>
#include <string>

#include "hp/model/layers.h"
#include "hp/model/precision.h"

namespace hp {

namespace {
std::atomic<KvCache*> g_current{nullptr};
std::atomic<int> g_generating{0};
}  // namespace

bool generating() { return g_generating.load() > 0; }
GenerationScope::GenerationScope() { ++g_generating; }
GenerationScope::~GenerationScope() { --g_generating; }

KvCache* current_kv_cache() { return g_current.load(); }

KvCacheScope::KvCacheScope(KvCache* cache) : saved_(g_current.exchange(cache)) {}
KvCacheScope::~KvCacheScope() { g_current.store(saved_); }

void KvCache::set_positions(at::Tensor positions, bool decoding) {
  if (positions.dim() != 2 || positions.scalar_type() != at::kLong)
    throw std::invalid_argument("kv cache: positions must be [samples, T] int64");
  if (positions.numel() > 0 && positions.max().item<std::int64_t>() >= max_len_)
    throw std::invalid_argument("kv cache: position " +
                                std::to_string(positions.max().item<std::int64_t>()) +
                                " beyond the cache's " + std::to_string(max_len_) + " positions");
  positions_ = positions.contiguous();
  decoding_ = decoding;
}

at::Tensor KvCache::positions(std::int64_t first_sample, std::int64_t samples) const {
  const std::int64_t row = first_sample - first_sample_;
  if (!positions_.defined() || row < 0 || row + samples > positions_.size(0))
    throw std::invalid_argument(
        "generation: an attention layer holds samples [" + std::to_string(first_sample) + ", " +
        std::to_string(first_sample + samples) + ") but this rank generates " +
        std::to_string(positions_.defined() ? positions_.size(0) : 0) + " from " +
        std::to_string(first_sample_) +
        ": the key/value cache does not hold other ranks' requests (an attention module at a "
        "per-module degree above the residual stream's gathers them); run attention at the "
        "stream's degree, or generate without the cache");
  return positions_.narrow(0, row, samples);
}

KvCache::View KvCache::store(const void* layer, std::int64_t first_sample, const at::Tensor& k,
                             const at::Tensor& v) {
  const std::int64_t B = k.size(0), T = k.size(1);
  const at::Tensor pos = positions(first_sample, B);
  if (pos.size(1) != T)
    throw std::invalid_argument("kv cache: the forward holds " + std::to_string(T) +
                                " positions, the generator set " + std::to_string(pos.size(1)));
  Entry& e = entries_[{layer, first_sample}];
  if (!e.k.defined()) {
    e.k = at::zeros({B, max_len_, k.size(2), k.size(3)}, k.options());
    e.v = at::zeros({B, max_len_, v.size(2), v.size(3)}, v.options());
  }
  // Every sample writes its positions (a prefill's padding too: a later
  // decode step overwrites them before any query can see them).
  const at::Tensor index = pos.view({B, T, 1, 1}).expand({B, T, k.size(2), k.size(3)});
  e.k.scatter_(1, index, k.detach().to(e.k.scalar_type()));
  e.v.scatter_(1, index, v.detach().to(e.v.scalar_type()));
  const std::int64_t L = pos.max().item<std::int64_t>() + 1;
  View out;
  out.k = e.k.narrow(1, 0, L);
  out.v = e.v.narrow(1, 0, L);
  // key j hidden from the query at position p when j > p
  out.hidden = at::arange(L, at::kLong).view({1, 1, 1, L}).gt(pos.view({B, 1, T, 1}));
  return out;
}

std::int64_t KvCache::bytes() const {
  std::int64_t n = 0;
  for (const auto& [key, e] : entries_) n += e.k.nbytes() + e.v.nbytes();
  return n;
}

std::int64_t KvCache::bytes_per_token() const {
  std::map<std::int64_t, std::int64_t> samples;  // first sample -> samples of that micro-batch
  for (const auto& [key, e] : entries_) samples[key.second] = e.k.size(0);
  std::int64_t total = 0;
  for (const auto& [first, b] : samples) total += b;
  return total > 0 ? bytes() / (total * max_len_) : 0;
}

KvCache::Shape KvCache::shape() const {
  Shape s;
  std::map<const void*, bool> layers;
  for (const auto& [key, e] : entries_) {
    layers[key.first] = true;
    s.kv_heads = e.k.size(2);
    s.head_dim = e.k.size(3);
    s.element_bytes = static_cast<std::int64_t>(e.k.element_size());
  }
  s.layers = static_cast<std::int64_t>(layers.size());
  return s;
}

at::Tensor cached_attention(const at::Tensor& q, const KvCache::View& kv) {
  const at::Tensor k = repeat_kv(kv.k, q.size(2)), v = repeat_kv(kv.v, q.size(2));
  auto qt = q.transpose(1, 2), kt = k.transpose(1, 2), vt = v.transpose(1, 2);  // [B, h, ., d]
  auto scores = precision::cast(precision::matmul(qt, kt.transpose(-2, -1)), at::kFloat) /
                std::sqrt(static_cast<double>(q.size(3)));
  scores = scores.masked_fill(kv.hidden, -std::numeric_limits<float>::infinity());
  auto ctx = precision::matmul(precision::softmax_as(scores, q.scalar_type()), vt);  // [B, h, T, d]
  return ctx.transpose(1, 2).reshape({q.size(0), q.size(1), q.size(2) * q.size(3)});
}

}  // namespace hp
