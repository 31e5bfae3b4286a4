#pragma once
// `data.type: tokens`: prepared corpora (hp/data/token_shards.h) read by
// memory map, alone or blended. Free of LibTorch.
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace hp {

class ConfigErrors;

struct BlendSource {
  std::string path;
  double weight = 1.0;
};

/// `data.blend` items ({path: DIR, weight: W} flow maps). Adds one error
/// per bad item to `errors` (or throws ConfigException when null).
std::vector<BlendSource> parse_data_blend(const std::vector<std::string>& items, ConfigErrors* errors);

/// Megatron's blending rule: sample i goes to the source d that maximises
/// w[d] * max(i, 1) - count[d] (the first on ties; the weights normalised),
/// which keeps every prefix within about one sample of the weights.
/// Deterministic, no randomness; computed once up to the largest index
/// asked (two bytes per sample) and shared by threads.
class BlendRule {
 public:
  explicit BlendRule(std::vector<double> weights);
  BlendRule(const BlendRule&) = delete;
  BlendRule& operator=(const BlendRule&) = delete;
  std::uint16_t source(std::int64_t i) const;
  std::size_t sources() const { return weights_.size(); }

 private:
  std::vector<double> weights_;
  mutable std::mutex mu_;
  mutable std::vector<std::uint16_t> index_;
  mutable std::vector<std::int64_t> count_;
};

}  // namespace hp
