#include "hp/model/dropout.h"

#include <stdexcept>
#include <string>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

namespace hp {

namespace {

thread_local DropoutSite t_site;

/// splitmix64's finaliser: a bijection of 64-bit words with full avalanche.
inline std::uint64_t mix(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

DropoutSite current_dropout_site() { return t_site; }

DropoutSiteGuard::DropoutSiteGuard(DropoutSite site) : saved_(t_site) { t_site = site; }
DropoutSiteGuard::~DropoutSiteGuard() { t_site = saved_; }

std::uint64_t stable_hash(const std::string& s) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

at::Tensor layout_free_dropout_mask(std::int64_t samples, std::int64_t seq, std::int64_t features,
                                    double p, std::uint64_t seed, std::uint64_t layer_key,
                                    std::int64_t seq_offset, DropoutSite site) {
  at::Tensor mask = at::empty({samples, seq, features}, at::kFloat);
  float* out = mask.data_ptr<float>();
  const std::uint64_t key = mix(mix(mix(seed) ^ layer_key) ^ static_cast<std::uint64_t>(site.step));
  // An element is dropped when its 53-bit uniform falls below p.
  const auto threshold = static_cast<std::uint64_t>(p * 9007199254740992.0);  // p * 2^53
  const float keep = static_cast<float>(1.0 / (1.0 - p));
  at::parallel_for(0, samples * seq, 64, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t row = begin; row < end; ++row) {
      const auto sample = static_cast<std::uint64_t>(site.first_sample + row / seq);
      const auto pos = static_cast<std::uint64_t>(seq_offset + row % seq);
      const std::uint64_t r = mix(mix(key ^ sample) ^ pos);
      float* o = out + row * features;
      for (std::int64_t j = 0; j < features; ++j) {
        o[j] = (mix(r ^ static_cast<std::uint64_t>(j)) >> 11) < threshold ? 0.0f : keep;
      }
    }
  });
  return mask;
}

at::Tensor layout_free_dropout(const at::Tensor& x, double p, std::uint64_t seed,
                               std::uint64_t layer_key, std::int64_t seq_offset) {
  if (p <= 0) return x;
  const std::int64_t samples = x.dim() >= 2 ? x.size(0) : 1;
  const std::int64_t features = x.dim() >= 1 ? x.size(-1) : 1;
  const std::int64_t seq = samples * features > 0 ? x.numel() / (samples * features) : 0;
  at::Tensor mask = layout_free_dropout_mask(samples, seq, features, p, seed, layer_key, seq_offset,
                                             current_dropout_site());
  return x * mask.view(x.sizes()).to(x.scalar_type());
}

at::Tensor layout_free_dropout(const at::Tensor& x, double p, std::uint64_t seed, std::uint64_t layer_key,
                               const std::vector<SeqPiece>& pieces) {
  if (p <= 0) return x;
  if (pieces.size() == 1) return layout_free_dropout(x, p, seed, layer_key, pieces[0].offset);
  if (x.dim() != 3) {
    throw std::invalid_argument("layout_free_dropout: a tensor over several sequence pieces must be [samples, seq, "
                                "features], got " + std::to_string(x.dim()) + " dimensions");
  }
  const DropoutSite site = current_dropout_site();
  std::vector<at::Tensor> masks;
  for (const auto& piece : pieces) {
    masks.push_back(layout_free_dropout_mask(x.size(0), piece.length, x.size(2), p, seed, layer_key, piece.offset, site));
  }
  return x * at::cat(masks, 1).to(x.scalar_type());
}

}  // namespace hp
