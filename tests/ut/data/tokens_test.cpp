// The blend rule and the memory-mapped token corpus.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "hp/data/token_shards.h"
#include "hp/data/tokens.h"

namespace fs = std::filesystem;

namespace {

TEST(Blend, FollowsMegatronsRule) {
  // w = (0.3, 0.7): sample 0 to the larger weight, then the error rule.
  hp::BlendRule rule({3.0, 7.0});
  const std::vector<int> want = {1, 0, 1, 1, 0, 1, 1, 0, 1, 1};
  for (std::size_t i = 0; i < want.size(); ++i) EXPECT_EQ(rule.source(static_cast<std::int64_t>(i)), want[i]) << i;
}

TEST(Blend, ProportionsOver10kSamplesWithinOnePercent) {
  const std::vector<double> w = {0.5, 0.3, 0.15, 0.05};
  hp::BlendRule rule(w);
  std::vector<int> count(w.size(), 0);
  const int n = 10000;
  // Asked out of order (as ranks ask for their samples): the same answers.
  for (int i = n - 1; i >= 0; --i) ++count[rule.source(i)];
  for (std::size_t d = 0; d < w.size(); ++d) {
    EXPECT_NEAR(static_cast<double>(count[d]) / n, w[d], 0.01 * w[d]) << "source " << d;
    // Every prefix stays within about one sample of the weights.
    int c = 0;
    for (int i = 0; i < n; ++i) {
      c += rule.source(i) == static_cast<int>(d);
      ASSERT_LE(std::abs(c - w[d] * (i + 1)), 2.0) << "source " << d << " prefix " << i;
    }
  }
}

class Corpus : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("hp_tokens_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(Corpus, ReadsAcrossShardsAndFindsDocuments) {
  // Shard 0: documents [0..4] [5..6]; shard 1: [7..9]; values = position * 1000
  // (above uint16 only in the uint32 run).
  for (int bytes : {2, 4}) {
    const std::uint32_t scale = bytes == 2 ? 7 : 100000;
    std::vector<std::uint32_t> a, b;
    for (std::uint32_t i = 0; i < 7; ++i) a.push_back(i * scale);
    for (std::uint32_t i = 7; i < 10; ++i) b.push_back(i * scale);
    hp::TokenManifest m;
    m.tokenizer_kind = "test";
    m.tokenizer_hash = "test:0";
    m.vocab_size = bytes == 2 ? 100 : 1000001;
    m.token_bytes = hp::token_bytes_for(m.vocab_size);
    ASSERT_EQ(m.token_bytes, bytes);
    m.shards.push_back(hp::write_token_shard(dir_.string(), "shard-00000", a, {0, 5, 7}, bytes));
    m.shards.push_back(hp::write_token_shard(dir_.string(), "shard-00001", b, {0, 3}, bytes));
    m.documents = 3;
    m.tokens = 10;
    hp::write_token_manifest(dir_.string(), m);
    EXPECT_TRUE(hp::check_token_dir(dir_.string(), true).empty());
    hp::TokenCorpus c(dir_.string());
    EXPECT_EQ(c.tokens(), 10);
    EXPECT_EQ(c.documents(), 3);
    std::vector<std::int64_t> got(6);
    c.read(3, 6, got.data());  // crosses the shard boundary
    for (int i = 0; i < 6; ++i) EXPECT_EQ(got[i], static_cast<std::int64_t>((3 + i) * scale));
    EXPECT_EQ(c.document_start(0), 0);
    EXPECT_EQ(c.document_start(1), 5);
    EXPECT_EQ(c.document_start(2), 7);
    EXPECT_EQ(c.document_start(3), 10);
    const std::vector<int> doc_of = {0, 0, 0, 0, 0, 1, 1, 2, 2, 2};
    for (int p = 0; p < 10; ++p) EXPECT_EQ(c.document_of(p), doc_of[p]) << p;
    EXPECT_THROW(c.read(8, 3, got.data()), std::out_of_range);
  }
}

TEST_F(Corpus, ChecksumFindsOneChangedByte) {
  std::vector<std::uint32_t> a(100, 3);
  hp::TokenManifest m;
  m.tokenizer_kind = "test";
  m.tokenizer_hash = "test:0";
  m.vocab_size = 10;
  m.shards.push_back(hp::write_token_shard(dir_.string(), "shard-00000", a, {0, 100}, 2));
  m.documents = 1;
  m.tokens = 100;
  hp::write_token_manifest(dir_.string(), m);
  {
    std::fstream f(dir_ / "shard-00000.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(51);
    f.put('\x01');
  }
  const auto problems = hp::check_token_dir(dir_.string(), true);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("shard-00000.bin is damaged"), std::string::npos) << problems[0];
  EXPECT_TRUE(hp::check_token_dir(dir_.string(), false).empty());  // sizes alone do not see it
}

}  // namespace
