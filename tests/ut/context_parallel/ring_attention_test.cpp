// Context parallel's pieces against one process: the balanced chunk
// assignment and its positions for 1-4 ranks; the online-softmax block
// combination against one softmax over the whole row (blocks with rows that
// see nothing included); ring attention on 1-4 real Gloo ranks against
// eager attention over the whole sequence, forward and backward (max |a - b|
// / max |b| <= 1e-6 per tensor), the score blocks it computes equal to the
// count its layout gives the planner; and the router's per-sequence decisions
// (capacity, load-balancing loss) under the split equal to the whole
// sequence's.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <set>
#include <vector>

#include "hp/comm/context.h"
#include "hp/model/block_attention.h"
#include "hp/model/layers.h"
#include "hp/model/moe.h"
#include "hp/model/sequence_layout.h"
#include "plugins/context_parallel/ring_attention.h"
#include "tests/support/multi_rank.h"

namespace {

namespace cp = hp::context_parallel;

double rel(const torch::Tensor& a, const torch::Tensor& b) {
  const double scale = b.abs().max().item<double>();
  return (a - b).abs().max().item<double>() / (scale > 0 ? scale : 1.0);
}

// Member m holds chunks m and 2 cp - 1 - m; together the members hold every
// position once, and each has the same number of causal (query, key) pairs.
TEST(BalancedPieces, ChunksPositionsAndBalanceForOneToFourRanks) {
  for (int parts = 1; parts <= 4; ++parts) {
    const std::int64_t seq = 8 * parts, L = seq / (2 * parts);
    std::set<std::int64_t> seen;
    std::int64_t pairs0 = -1;
    for (int m = 0; m < parts; ++m) {
      const auto pieces = cp::balanced_pieces(seq, parts, m);
      if (parts == 1) {  // the whole sequence, as one piece
        ASSERT_EQ(pieces.size(), 1u);
        EXPECT_EQ(pieces[0].offset, 0);
        EXPECT_EQ(pieces[0].length, seq);
      } else {
        ASSERT_EQ(pieces.size(), 2u);
        EXPECT_EQ(pieces[0].offset, m * L) << parts << " ranks, member " << m;
        EXPECT_EQ(pieces[1].offset, (2 * parts - 1 - m) * L) << parts << " ranks, member " << m;
      }
      auto pos = hp::piece_positions(pieces);
      ASSERT_EQ(pos.numel(), 2 * L);
      std::int64_t pairs = 0;
      for (std::int64_t i = 0; i < pos.numel(); ++i) {
        const auto p = pos[i].item<std::int64_t>();
        EXPECT_TRUE(seen.insert(p).second) << "position " << p << " held twice";
        pairs += p + 1;  // keys a causal query at p sees
      }
      if (pairs0 < 0) pairs0 = pairs;
      EXPECT_EQ(pairs, pairs0) << parts << " ranks: member " << m << " has a different share of attention";
    }
    EXPECT_EQ(static_cast<std::int64_t>(seen.size()), seq);
  }
  // A rank splitting its local positions further (sequence parallel under cp).
  const auto pieces = cp::balanced_pieces(16, 2, 0);  // [0, 4) and [12, 16)
  auto sub = hp::sub_pieces(pieces, 2, 4);
  ASSERT_EQ(sub.size(), 2u);
  EXPECT_EQ(sub[0].offset, 2);
  EXPECT_EQ(sub[0].length, 2);
  EXPECT_EQ(sub[1].offset, 12);
  EXPECT_EQ(sub[1].length, 2);
  auto x = torch::arange(16).view({1, 16});
  EXPECT_TRUE(torch::equal(hp::take_pieces(x, 1, pieces), torch::tensor({0, 1, 2, 3, 12, 13, 14, 15}).view({1, 8})));
}

// The block step's recurrence over uneven key blocks, some rows seeing no
// key of a later block at all and one block hidden from every row, equals
// one softmax over the whole row.
TEST(OnlineSoftmax, BlocksCombineToOneSoftmaxOverTheRow) {
  torch::manual_seed(3);
  const std::int64_t rows = 9, d = 8, keys = 19;
  const std::vector<std::int64_t> widths{5, 7, 4, 3};
  auto q = torch::randn({rows, d}) * 0.5, k = torch::randn({keys, d}), v = torch::randn({keys, d});
  auto mask = torch::rand({rows, keys}) < 0.4;
  mask.narrow(1, 0, 5).select(1, 0).fill_(false);  // every row sees key 0 (in the first block)
  mask.narrow(1, 5, 7).select(0, 2).fill_(true);   // row 2 sees nothing of block 2
  mask.narrow(1, 12, 4).narrow(0, 4, 3).fill_(true);  // rows 4-6 nothing of block 3
  mask.narrow(1, 16, 3).fill_(true);                  // block 4: fully masked
  hp::block_step::OnlineSoftmax st;
  std::int64_t c0 = 0;
  for (auto w : widths) {
    hp::block_step::add_block(st, q, k.narrow(0, c0, w), v.narrow(0, c0, w), mask.narrow(1, c0, w));
    c0 += w;
  }
  auto out = torch::empty({rows, d}), lse = torch::empty({rows});
  hp::block_step::finish(st, out, lse);
  auto s = torch::mm(q, k.t()).masked_fill(mask, -std::numeric_limits<float>::infinity());
  EXPECT_LE(rel(out, torch::mm(torch::softmax(s, -1), v)), 1e-6);
  EXPECT_LE(rel(lse, torch::logsumexp(s, -1)), 1e-6);
}

// Ring attention on `parts` ranks (blocks of `block` inside each chunk)
// against eager attention on the whole sequence: each rank's output and its
// q, k, v gradients are its pieces of the one-process ones.
void check_ring(int parts, std::int64_t seq, std::int64_t heads, std::int64_t block, bool documents = false) {
  const std::int64_t B = 2, d = 8;
  torch::manual_seed(11);
  auto qkv = torch::randn({B, seq, heads, 3, d});
  auto dout = torch::randn({B, seq, heads * d});
  // Documents (data.document_attention): sample 0 cut at seq/3 and 3 seq/4
  // (inside chunks), sample 1 at 1 and seq - 1.
  torch::Tensor docs;
  if (documents) {
    docs = torch::zeros({B, seq}, torch::kLong);
    docs[0].narrow(0, seq / 3, seq - seq / 3).add_(1);
    docs[0].narrow(0, 3 * seq / 4, seq - 3 * seq / 4).add_(1);
    docs[1].narrow(0, 1, seq - 1).add_(1);
    docs[1].narrow(0, seq - 1, 1).add_(1);
  }
  auto full = qkv.clone().requires_grad_(true);
  auto fp = full.unbind(3);
  auto ref = hp::causal_attention(fp[0], fp[1], fp[2], docs);
  ref.backward(dout);
  cp::take_ring_times();
  std::int64_t counted = 0;  // the blocks the layout says each rank computes per pass (the planner's cost)
  hp::test::run_ranks(parts, [&](hp::dist::DistributedContext& ctx) {
    auto& g = ctx.group("dp");
    const auto pieces = cp::balanced_pieces(seq, parts, g.rank());
    auto mine = hp::take_pieces(qkv, 1, pieces).requires_grad_(true);
    auto p = mine.unbind(3);
    auto out = cp::ring_attention(p[0], p[1], p[2], g, block, docs);
    out.backward(hp::take_pieces(dout, 1, pieces));
    const std::string at = std::string(documents ? "documents, " : "") + std::to_string(parts) + " ranks, seq " + std::to_string(seq) + ", block " +
                           std::to_string(block) + ", rank " + std::to_string(g.rank());
    EXPECT_LE(rel(out.detach(), hp::take_pieces(ref.detach(), 1, pieces)), 1e-6) << at << " output";
    auto got = mine.grad().unbind(3), want = hp::take_pieces(full.grad(), 1, pieces).unbind(3);
    const char* names[] = {"dq", "dk", "dv"};
    for (int i = 0; i < 3; ++i) EXPECT_LE(rel(got[i], want[i]), 1e-6) << at << " " << names[i];
    if (g.rank() == 0) {
      const auto blocks = cp::balanced_layout(g, block).attention_blocks(seq);
      EXPECT_LE(blocks.size, block);
      counted = static_cast<std::int64_t>(blocks.count);
    }
  });
  // Without documents every such block is computed, forward and backward,
  // on every rank (documents skip some).
  const std::int64_t computed = cp::take_ring_times().blocks;
  if (documents) {
    EXPECT_LE(computed, 2 * parts * B * heads * counted);
  } else {
    EXPECT_EQ(computed, 2 * parts * B * heads * counted)
        << parts << " ranks, seq " << seq << ", block " << block << ": blocks computed against the layout's count";
  }
}

TEST(RingAttention, MatchesEagerOverTheWholeSequenceOnOneToFourRanks) {
  check_ring(1, 8, 2, 128);
  check_ring(2, 8, 2, 1);    // chunks of 2 positions, blocks of 1
  check_ring(2, 64, 3, 16);  // one block per chunk
  check_ring(2, 64, 3, 5);   // blocks that do not divide the chunk
  check_ring(3, 36, 2, 4);
  check_ring(4, 64, 2, 3);
}

TEST(RingAttention, KeepsAttentionInsideDocuments) {
  check_ring(1, 24, 2, 5, true);
  check_ring(2, 48, 2, 5, true);
  check_ring(3, 36, 2, 4, true);
  check_ring(4, 64, 2, 3, true);
}

// Capacity ranks a whole sequence and the load-balancing losses (expert-
// and device-level) count its selections: under the split, each rank's
// decisions are its pieces of the whole sequence's and the loss terms add
// up to the whole sequence's loss.
TEST(RingAttention, RouterDecisionsUnderTheSplitAreTheWholeSequences) {
  const int parts = 2;
  const std::int64_t S = 3, seq = 16, E = 4;
  torch::manual_seed(5);
  auto logits = torch::randn({S, seq, E});
  hp::MoeOptions o;
  o.num_experts = E;
  o.top_k = 2;
  o.capacity_factor = 1.0;  // drops: capacity 8 of the 32 selections per sequence
  o.aux_loss_coef = 0.01;
  o.device_balance_coef = 0.05;
  o.device_groups = 2;
  const auto whole = hp::route(logits.view({S * seq, E}), {}, o, seq);
  const double whole_loss = hp::load_balance_loss_sum(whole, o, seq).item<double>();
  const double whole_device = hp::device_balance_loss_sum(whole, o, seq).item<double>();
  ASSERT_GT((~whole.kept).sum().item<std::int64_t>(), 0) << "the capacity drops nothing: not a test of it";
  hp::test::run_ranks(parts, [&](hp::dist::DistributedContext& ctx) {
    auto& g = ctx.group("dp");
    const hp::SequenceLayout layout = cp::balanced_layout(g);
    const auto pieces = layout.pieces(seq);
    const std::int64_t local = seq / parts;
    auto mine = hp::take_pieces(logits, 1, pieces).reshape({S * local, E});
    const auto r = hp::route(mine, {}, o, local, &layout);
    auto want = hp::take_pieces(whole.kept.view({S, seq, 2}), 1, pieces).reshape({S * local, 2});
    EXPECT_TRUE(torch::equal(r.kept, want)) << "rank " << g.rank() << ": capacity decided differently";
    auto loss = hp::load_balance_loss_sum(r, o, local, &layout).detach().view({1}).to(torch::kDouble);
    g.all_reduce(loss);
    EXPECT_NEAR(loss.item<double>(), whole_loss, 1e-6 * whole_loss) << "rank " << g.rank();
    auto device = hp::device_balance_loss_sum(r, o, local, &layout).detach().view({1}).to(torch::kDouble);
    g.all_reduce(device);
    EXPECT_NEAR(device.item<double>(), whole_device, 1e-6 * whole_device) << "rank " << g.rank() << ", device-level";
  });
}

}  // namespace
