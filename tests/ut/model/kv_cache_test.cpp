// The key/value cache and hp::Generator.
// KvCache: a query attending over the cache (grouped heads, each sample at
// its own length) gives the row the causal attention over the whole
// sequence gives, within 1e-6 relative; the cache's bytes per token equal
// layers x 2 x kv_heads x head_dim x element size; a micro-batch the
// generator did not set is refused naming its samples.
// Generator: from a checkpoint written by Trainer::fit, generate_text twice
// gives the same text (the model loaded once), and the token ids equal
// Trainer::generate's at the same config.
#include "hp/model/kv_cache.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <string>
#include <vector>

#include "framework/trainer/trainer.h"
#include "hp/model/layers.h"

namespace {

double kv_rel(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>() / b.abs().max().item<double>();
}

TEST(KvCache, DecodeRowsEqualCausalAttention) {
  torch::manual_seed(3);
  const std::int64_t B = 2, T = 7, H = 4, KV = 2, D = 8;
  const auto q = torch::randn({B, T, H, D}), k = torch::randn({B, T, KV, D}),
             v = torch::randn({B, T, KV, D});
  const auto full =
      hp::causal_attention(q, hp::repeat_kv(k, H), hp::repeat_kv(v, H));  // [B, T, H * D]
  int layer = 0;
  hp::KvCache cache(16, 0);
  // Sample 0 has 5 prompt positions, sample 1 has 3: a right-padded prefill
  // of 5, then one position per sample per step.
  const std::int64_t len[2] = {5, 3};
  cache.set_positions(torch::arange(5, torch::kLong).expand({B, 5}).contiguous(), false);
  cache.store(&layer, 0, k.narrow(1, 0, 5), v.narrow(1, 0, 5));
  std::int64_t at[2] = {len[0], len[1]};
  for (int step = 0; step < 2; ++step) {
    auto pos = torch::tensor({at[0], at[1]}, torch::kLong).view({B, 1});
    cache.set_positions(pos, true);
    auto pick = [&](const torch::Tensor& x) {
      return torch::stack({x[0].narrow(0, at[0], 1), x[1].narrow(0, at[1], 1)});  // [B, 1, ...]
    };
    const auto view = cache.store(&layer, 0, pick(k), pick(v));
    const auto got = hp::cached_attention(pick(q), view);  // [B, 1, H * D]
    for (std::int64_t b = 0; b < B; ++b) {
      const auto want = full[b][at[b]];
      EXPECT_LT(kv_rel(got[b][0], want), 1e-6) << "sample " << b << " at position " << at[b];
    }
    ++at[0];
    ++at[1];
  }
  EXPECT_EQ(cache.bytes_per_token(), 1 * 2 * KV * D * 4);
  EXPECT_EQ(cache.bytes(), 2 * B * 16 * KV * D * 4);
  const auto s = cache.shape();
  EXPECT_EQ(s.layers * 2 * s.kv_heads * s.head_dim * s.element_bytes, cache.bytes_per_token());
  try {
    cache.positions(5, 1);
    FAIL() << "samples outside the generation batch were accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("samples [5, 6)"), std::string::npos) << e.what();
  }
}

TEST(Generator, FromCheckpointKeepsTheModelAndMatchesTrainer) {
  const auto dir = std::filesystem::temp_directory_path() / "hp_ut_generator";
  std::filesystem::remove_all(dir);
  const std::string yaml =
      "model: {type: gpt, layers: 1, hidden: 32, heads: 2, seq_len: 24, vocab_size: 256, dropout: "
      "0}\n"
      "data: {type: text, path: /usr/share/games/fortunes/computers}\n"
      "training: {max_steps: 6, global_batch_size: 4, micro_batch_size: 2, log_interval: 3}\n"
      "checkpoint: {interval: 6}\n";
  auto trainer = hp::Trainer::from_yaml(yaml);
  trainer.set("run.output_dir", (dir / "run").string());
  ASSERT_EQ(trainer.fit().losses.size(), 6u);
  auto g = hp::Generator::from_checkpoint((dir / "run" / "checkpoints").string(),
                                          {"run.output_dir=" + (dir / "gen").string()});
  hp::GenerateOptions o;
  o.max_new_tokens = 6;
  const auto a = g.generate_text({"Unix", "The computer"}, o);
  const auto b = g.generate_text({"Unix", "The computer"}, o);
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a, b);
  EXPECT_FALSE(a[0].empty());
  // The same through Trainer::generate (a new run that loads the checkpoint).
  auto t2 = hp::Trainer::from_yaml(yaml);
  t2.set("run.output_dir", (dir / "t2").string())
      .set("checkpoint.resume", (dir / "run" / "checkpoints").string());
  hp::GenerateOptions ids = o;
  ids.prompts = {{'U', 'n', 'i', 'x'}};
  ids.vocab_limit = 256;
  const auto r = t2.generate(ids);
  ASSERT_EQ(r.tokens.size(), 1u);
  std::string text;
  for (auto t : r.tokens[0]) text += static_cast<char>(t);
  EXPECT_EQ(text, a[0]);
  std::filesystem::remove_all(dir);
}

}  // namespace
