#include "hp/checkpoint/write_plan.h"

#include <gtest/gtest.h>

#include <map>
#include <set>

namespace hp::ckpt {
namespace {

using Lists = std::vector<std::vector<SliceDesc>>;

/// How many times each key is written under the plan.
std::map<std::string, int> writes(const Lists& by_rank, const std::vector<std::vector<std::size_t>>& plan) {
  std::map<std::string, int> out;
  for (std::size_t r = 0; r < plan.size(); ++r) {
    for (auto i : plan[r]) ++out[by_rank[r][i].key];
  }
  return out;
}

// dp=2: both ranks hold the same six tensors; each is written once and the
// two ranks write about the same bytes.
TEST(WritePlan, ReplicasShareTheWriting) {
  std::vector<SliceDesc> same{{"model:a@0/10", 4000}, {"model:b@0/10", 3000}, {"model:c@0/10", 2000},
                              {"model:d@0/10", 2000}, {"model:e@0/10", 1000}, {"optim:a@0/10", 4000}};
  const Lists by_rank{same, same};
  const auto plan = plan_writers(by_rank);
  for (const auto& [key, n] : writes(by_rank, plan)) EXPECT_EQ(n, 1) << key;
  EXPECT_EQ(writes(by_rank, plan).size(), same.size());
  const auto bytes = bytes_per_rank(by_rank, plan);
  EXPECT_EQ(bytes[0] + bytes[1], 16000u);
  EXPECT_EQ(bytes[0], 8000u);
  EXPECT_EQ(bytes[1], 8000u);
}

// tp=2 x dp=2: ranks 0,1 hold the tp halves, ranks 2,3 replicate them, and
// a whole (replicated) norm weight is on all four: every distinct slice is
// written once, by a rank that holds it.
TEST(WritePlan, EverySliceOnceByAHolder) {
  auto ranks_list = [](int tp) {
    const std::string half = tp == 0 ? "@0,0/32,64" : "@32,0/32,64";
    return std::vector<SliceDesc>{{"model:qkv" + half, 8192}, {"optim:qkv.m" + half, 8192}, {"model:norm@0/64", 256}};
  };
  const Lists by_rank{ranks_list(0), ranks_list(1), ranks_list(0), ranks_list(1)};
  const auto plan = plan_writers(by_rank);
  const auto w = writes(by_rank, plan);
  EXPECT_EQ(w.size(), 5u);  // 2 halves x (param, state) + the norm
  for (const auto& [key, n] : w) EXPECT_EQ(n, 1) << key;
  const auto bytes = bytes_per_rank(by_rank, plan);
  // The replicas of each half split its two slices; the norm goes to one rank.
  EXPECT_EQ(bytes[0] + bytes[1] + bytes[2] + bytes[3], 4 * 8192u + 256u);
  for (auto b : bytes) EXPECT_GE(b, 8192u);
  for (auto b : bytes) EXPECT_LE(b, 8192u + 256u);
}

// A slice only one rank holds (zero's optimizer slices, pipeline stages)
// is written by that rank, however loaded it is.
TEST(WritePlan, ASliceWithOneHolderStaysThere) {
  const Lists by_rank{{{"model:big@0/100", 100000}, {"optim:s0@0/10", 10}},
                      {{"model:big@0/100", 100000}, {"optim:s1@10/10", 10}}};
  const auto plan = plan_writers(by_rank);
  const auto w = writes(by_rank, plan);
  EXPECT_EQ(w.at("model:big@0/100"), 1);
  EXPECT_EQ(std::set<std::size_t>(plan[0].begin(), plan[0].end()).count(1), 1u) << "rank 0 writes its own slice";
  EXPECT_EQ(std::set<std::size_t>(plan[1].begin(), plan[1].end()).count(1), 1u) << "rank 1 writes its own slice";
}

TEST(WritePlan, RanksThatDisagreeAboutASizeAreRefused) {
  const Lists by_rank{{{"model:a@0/10", 40}}, {{"model:a@0/10", 80}}};
  try {
    plan_writers(by_rank);
    FAIL() << "expected a refusal";
  } catch (const std::invalid_argument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("model:a@0/10 is 40 bytes on rank 0 but 80 on rank 1"), std::string::npos) << m;
  }
}

TEST(WritePlan, TheSameListsGiveTheSamePlan) {
  std::vector<SliceDesc> l{{"model:x@0/4", 16}, {"model:y@0/4", 16}, {"model:z@0/4", 16}};
  const Lists by_rank{l, l, l};
  EXPECT_EQ(plan_writers(by_rank), plan_writers(by_rank));
  const auto bytes = bytes_per_rank(by_rank, plan_writers(by_rank));
  EXPECT_EQ(bytes, (std::vector<std::uint64_t>{16, 16, 16}));
}

TEST(WritePlan, EncodeDecodeRoundTrip) {
  const std::vector<SliceDesc> l{{"model:blocks.0.attn.qkv.weight@0,64/64,32", 8192}, {"optim:exp_avg@0/3", 12}};
  const auto back = decode_slices(encode_slices(l));
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[0].key, l[0].key);
  EXPECT_EQ(back[0].bytes, 8192u);
  EXPECT_EQ(back[1].key, l[1].key);
  EXPECT_TRUE(decode_slices("").empty());
  EXPECT_THROW(decode_slices("no tab here\n"), std::invalid_argument);
  EXPECT_THROW(encode_slices({{"bad\tkey", 1}}), std::invalid_argument);
}

}  // namespace
}  // namespace hp::ckpt
