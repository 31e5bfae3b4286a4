// The planner's estimate of a layout from its planning build and a
// calibration filled by hand (no measuring): what a rank keeps beside its
// parameters follows the experts and layers it builds, fewer tokens per
// rank than the calibrated micro-batch follow the measured peaks, the
// step's end and ZeRO's gathers follow the shards of the gradients,
// parameters and optimizer state, the shared-memory pages of the
// collectives follow the group and whether it gathers, released gradients
// still travel beside a steady pipeline's backward, context parallel's
// attention costs its score blocks, an expert split waits for the rank
// the routing loads most, and a module above the stream's tensor-parallel
// degree computes as the stream does and gathers its neighbours' samples.
#include <gtest/gtest.h>

#include <string>

#include "backends/comm/detail/shm_collectives.h"
#include "framework/model/packed_gemm.h"
#include "framework/plan/plan.h"
#include "framework/runtime/setup.h"
#include "framework/model/registry.h"

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

hp::Setup setup(const std::string& yaml, int world) {
  return hp::prepare(hp::RawConfig::parse_string(yaml, "plan.yaml"), world);
}

/// A calibration of `setup`'s model with every figure chosen: each block
/// (and the loss) keeps `per_token` bytes per token and takes 1 us per
/// token; the measured in-step points at half, one and two micro-batches.
hp::plan::Calibration calibration(const hp::Setup& s, double per_token, double extra) {
  hp::plan::Calibration c;
  c.cores = 2;
  c.baseline_bytes = 50 * kMiB;
  c.collective_latency_s = 1e-4;
  c.collective_bytes_per_s = 1e9;
  c.p2p_latency_s = 1e-4;
  c.p2p_bytes_per_s = 1e9;
  c.ring_step_s = 1e-3;
  c.ring_step_bytes = 1 << 19;
  c.gemm_flops_per_s_1 = c.gemm_flops_per_s_all = 1e10;
  c.two_per_core_factor = 2;
  c.process_extra_bytes = extra;
  const std::size_t n = hp::model_info(s.config).block_flops.size() + 1;
  c.act_bytes_per_token.assign(n, per_token);
  c.seconds_per_token_1.assign(n, 1e-6);
  c.seconds_per_token_all.assign(n, 1e-6);
  return c;
}

/// The small GPT most tests plan (2 layers of 64, 32 positions, synthetic
/// data) at a global batch of `global_batch` in micro-batches of 2.
std::string small_gpt(int global_batch = 4) {
  return "model: {type: gpt, layers: 2, hidden: 64, heads: 4, seq_len: 32}\n"
         "data: {type: synthetic}\n"
         "training: {global_batch_size: " +
         std::to_string(global_batch) + ", micro_batch_size: 2}\n";
}

const char* kMoe =
    "model: {type: gpt, layers: 2, hidden: 64, heads: 4, seq_len: 32, moe: {num_experts: 4, top_k: 2}}\n"
    "data: {type: synthetic}\n"
    "training: {global_batch_size: 4, micro_batch_size: 2}\n";

}  // namespace

// The packed expert products keep each expert weight twice more (four fp32
// operands per expert): 2 layers x 4 experts x (fc1 [256, 64] + fc2 [64, 256])
// x 2 copies x 4 bytes at one process; half the experts, half of it, under
// ep=2; half the layers under two pipeline stages; none where the products
// do not run packed (mixed precision).
TEST(Planner, KeptCopiesFollowTheExpertsAndLayersARankBuilds) {
  if (!hp::packed_gemm::supported()) GTEST_SKIP() << "no packed expert products on this CPU (AVX2 and FMA)";
  const double whole = 2.0 * 4 * (256 * 64 + 64 * 256) * 2 * 4;
  const hp::Setup one = setup(kMoe, 1);
  const auto cal = calibration(one, 100, 0);
  const auto e1 = hp::plan::estimate(one, cal);
  ASSERT_EQ(e1.ranks.size(), 1u);
  EXPECT_EQ(e1.ranks[0].kept_copies, whole);

  const hp::Setup ep = setup(std::string(kMoe) + "features: {expert_parallel: {enabled: true, size: 2}}\n", 2);
  const auto e2 = hp::plan::estimate(ep, cal);
  ASSERT_EQ(e2.ranks.size(), 2u);
  for (const auto& r : e2.ranks) EXPECT_EQ(r.kept_copies, whole / 2) << "rank " << r.rank;

  const hp::Setup pp = setup(std::string(kMoe) + "features: {pipeline_parallel: {enabled: true, size: 2}}\n", 2);
  const auto e3 = hp::plan::estimate(pp, cal);
  ASSERT_EQ(e3.ranks.size(), 2u);
  for (const auto& r : e3.ranks) EXPECT_EQ(r.kept_copies, whole / 2) << "rank " << r.rank;

  const hp::Setup bf16 = setup(std::string(kMoe) + "features: {mixed_precision: {enabled: true}}\n", 1);
  EXPECT_EQ(hp::plan::estimate(bf16, cal).ranks.at(0).kept_copies, 0.0);
}

// A layout whose rank holds fewer tokens per micro-batch than the
// calibration's (positions split over cp=2: 32 of 64) takes its activations
// and extra from the line through the measured points below the micro-batch,
// not from the slope above it; at the calibrated tokens nothing changes.
TEST(Planner, FewerTokensThanCalibratedFollowTheMeasuredPoints) {
  const std::string gpt = small_gpt();
  const hp::Setup one = setup(gpt, 1);
  auto cal = calibration(one, 1000, 4 * kMiB);
  const double slope = 1000.0 * static_cast<double>(cal.act_bytes_per_token.size());
  const double T = 64;  // tokens of the calibrated micro-batch
  // Measured: less than the slope says below T (the heap's size classes).
  cal.in_step_points = {{T / 2, 1 * kMiB}, {T, cal.process_extra_bytes + slope * T},
                        {2 * T, cal.process_extra_bytes + slope * 2 * T}};
  const auto at_t = hp::plan::estimate(setup(gpt + "features: {zero: {enabled: false}}\n", 1), cal).ranks.at(0);
  EXPECT_DOUBLE_EQ(at_t.activations, slope * T);

  const hp::Setup cp = setup(gpt + "features: {context_parallel: {enabled: true, size: 2}}\n", 2);
  for (const auto& r : hp::plan::estimate(cp, cal).ranks) {
    // The rank's blocks keep 32 tokens' worth: the lower point itself
    // (beside the shared-memory pages of the gradients' sums over the two
    // ranks: both members' two slots, each as large as the gradients).
    EXPECT_NEAR(r.activations + r.buffers - 2 * 2 * std::min(r.grads, 2 * kMiB), 1 * kMiB, 1.0) << "rank " << r.rank;
    EXPECT_LT(r.activations, slope * T / 2) << "rank " << r.rank;
  }
}

// The step's end: the passes over the gradients a rank holds and the update
// of the optimizer state it holds, each at its calibrated rate per byte.
TEST(Planner, StepEndFollowsTheGradientAndOptimizerShards) {
  const std::string gpt = small_gpt();
  auto cal = calibration(setup(gpt, 1), 1000, 0);
  cal.grad_pass_seconds_per_byte_1 = 1e-9;
  cal.update_seconds_per_byte_1 = 3e-9;
  const auto dp = hp::plan::estimate(setup(gpt, 2), cal).ranks.at(0);
  const auto z1 = hp::plan::estimate(setup(gpt + "features: {zero: {enabled: true, stage: 1}}\n", 2), cal).ranks.at(0);
  const auto z2 = hp::plan::estimate(setup(gpt + "features: {zero: {enabled: true, stage: 2}}\n", 2), cal).ranks.at(0);
  EXPECT_DOUBLE_EQ(dp.update, dp.grads * 1e-9 + dp.optimizer * 3e-9);
  EXPECT_NEAR(z1.optimizer, dp.optimizer / 2, 64.0);
  EXPECT_DOUBLE_EQ(z1.update, z1.grads * 1e-9 + z1.optimizer * 3e-9);
  EXPECT_LT(z2.grads, dp.grads);
  EXPECT_DOUBLE_EQ(z2.update, z2.grads * 1e-9 + z2.optimizer * 3e-9);
  EXPECT_LT(z2.update, z1.update);
  // ZeRO-1's gathers after the update (receive buffers of the whole
  // parameters and this rank's slices packed) meet only the next forward's
  // first block: with activations this small they set the peak, above
  // plain data parallel's by what they hold beyond the activations ...
  EXPECT_GT(z1.buffers - dp.buffers, z1.params - z1.activations) << "activations " << z1.activations;
  EXPECT_LT(z1.buffers - dp.buffers, 1.5 * z1.params);
  // ... and with activations larger than they are, the gathers have been
  // taken before the activations' peak: the same buffers as plain dp.
  auto big = calibration(setup(gpt, 1), 1e6, 0);
  const auto dp_big = hp::plan::estimate(setup(gpt, 2), big).ranks.at(0);
  const auto z1_big =
      hp::plan::estimate(setup(gpt + "features: {zero: {enabled: true, stage: 1}}\n", 2), big).ranks.at(0);
  ASSERT_GT(z1_big.activations, 2 * z1_big.params);
  EXPECT_DOUBLE_EQ(z1_big.buffers, dp_big.buffers);
}

// The shared-memory segment of the gradients' sums: a rank touches its own
// two slots and two parts in n of each other member's where it only sums
// (4 pieces at two ranks, 5 at four), every member's where it also gathers
// (ZeRO's updated slices: 8 at four); a piece is the largest message, the
// whole gradients here (below a slot and a bucket).
TEST(Planner, SharedMemoryPagesFollowTheGroupAndWhetherItGathers) {
  const std::string gpt = small_gpt(8);
  const auto cal = calibration(setup(gpt, 1), 1000, 0);
  const auto dp2 = hp::plan::estimate(setup(gpt, 2), cal).ranks.at(0);
  const auto dp4 = hp::plan::estimate(setup(gpt, 4), cal).ranks.at(0);
  const double piece = dp2.grads;
  ASSERT_LT(piece, 2 * kMiB);
  EXPECT_DOUBLE_EQ(dp2.buffers, 4 * piece);
  EXPECT_DOUBLE_EQ(dp4.buffers, 5 * piece);
  // The planner's slot is the shared-memory collectives' own.
  EXPECT_EQ(hp::plan::kShmSlotBytes, static_cast<double>(hp::dist::ShmCollectives::kSlotBytes));
  // ZeRO-1 at four: the whole segment, beside its gathers' own bytes.
  const auto z1 = hp::plan::estimate(setup(gpt + "features: {zero: {enabled: true, stage: 1}}\n", 4), cal).ranks.at(0);
  EXPECT_GE(z1.buffers, 8 * piece);
}

// A module above the stream's tensor-parallel degree gathers its
// neighbours' samples: each member computes on `samples` micro-batches with
// 1 / (covered x samples) of the weights, so its compute equals the
// stream's; it keeps the gathered input (samples - 1 more micro-batches of
// hidden values) and, per micro-batch, gathers and reduce-scatters four
// times. Small GPT (2 layers of 64, micro-batches of 2 x 32 tokens) at 4
// ranks, attention and FFN at degree 4: over dp=4 (stream degree 1, 4
// samples) and over tp=2 x dp=2 (2 samples). Collectives cost their
// latency alone here, so the comm differs by the gathers' count.
TEST(Planner, ModulesAboveTheStreamGatherTheirNeighboursSamples) {
  const std::string gpt = small_gpt(8);
  auto cal = calibration(setup(gpt, 1), 1000, 0);
  cal.collective_bytes_per_s = 1e30;
  const double piece = 64 * 4 * (2 * 32);  // a micro-batch's hidden values (fp32)
  const std::string modules = "attention_size: 4, ffn_size: 4";
  const auto dp4 = hp::plan::estimate(setup(gpt, 4), cal).ranks.at(0);
  const auto dp4_modules = hp::plan::estimate(
      setup(gpt + "features: {tensor_parallel: {enabled: true, size: 1, " + modules + "}}\n", 4), cal).ranks.at(0);
  EXPECT_DOUBLE_EQ(dp4_modules.compute, dp4.compute);
  EXPECT_DOUBLE_EQ(dp4_modules.activations - dp4.activations, 2 * 2 * 3 * piece);
  // One micro-batch a step: 2 layers x 2 modules x 4 collectives.
  EXPECT_NEAR(dp4_modules.comm - dp4.comm, 16 * cal.collective_latency_s, 1e-9);
  EXPECT_LT(dp4_modules.params, dp4.params);

  const auto tp2 = hp::plan::estimate(
      setup(gpt + "features: {tensor_parallel: {enabled: true, size: 2}}\n", 4), cal).ranks.at(0);
  const auto tp2_modules = hp::plan::estimate(
      setup(gpt + "features: {tensor_parallel: {enabled: true, size: 2, " + modules + "}}\n", 4), cal).ranks.at(0);
  EXPECT_DOUBLE_EQ(tp2_modules.compute, tp2.compute);
  EXPECT_DOUBLE_EQ(tp2_modules.activations - tp2.activations, 2 * 2 * 1 * piece);
  // Two micro-batches a step.
  EXPECT_NEAR(tp2_modules.comm - tp2.comm, 2 * 16 * cal.collective_latency_s, 1e-9);
}

// ZeRO-2 reduces each micro-batch's gradients as its backward makes them,
// two buckets travelling at once. A pipeline stage in its steady phase
// (1f1b's first stage: two micro-batches of four in flight) runs a backward
// with its whole gradients made while the previous micro-batch's buckets
// still travel: a flat copy and the received half of each (here all of the
// stage's gradients, under one bucket), on top of GPipe's first stage,
// whose peak is its first backward (all four in flight, nothing sent yet).
// Reduced once a step (reduce_per_micro_batch: false), nothing travels in
// a backward and the schedules hold the same buffers. With small buckets
// only two of them travel.
TEST(Planner, ReleasedGradientsTravelBesideASteadyPipelinesBackward) {
  const std::string gpt =
      "model: {type: gpt, layers: 4, hidden: 64, heads: 4, seq_len: 32}\n"
      "data: {type: synthetic}\n"
      "training: {global_batch_size: 16, micro_batch_size: 2}\n";
  const auto cal = calibration(setup(gpt, 1), 1000, 0);
  auto rank0 = [&](const char* schedule, bool per_micro_batch) {
    const std::string f = std::string("features: {pipeline_parallel: {enabled: true, size: 2, schedule: ") +
                          schedule + "}, zero: {enabled: true, stage: 2, reduce_per_micro_batch: " +
                          (per_micro_batch ? "true" : "false") + "}}\n";
    return hp::plan::estimate(setup(gpt + f, 4), cal).ranks.at(0);
  };
  const auto steady = rank0("1f1b", true), first = rank0("gpipe", true);
  ASSERT_EQ(steady.in_flight, 2);
  ASSERT_EQ(first.in_flight, 4);
  const double made_whole = 2 * steady.grads;  // the rank's slice is half at dp=2
  ASSERT_LT(made_whole, 4 * kMiB);
  EXPECT_DOUBLE_EQ(steady.buffers - first.buffers, 1.5 * made_whole);
  EXPECT_DOUBLE_EQ(rank0("1f1b", false).buffers, rank0("gpipe", false).buffers);
  // Buckets of 50 KiB: only two travel at once, each at least the cap (a
  // bucket closes once it reaches it), a flat copy and the half received.
  const std::string small = gpt + "distributed: {bucket_size_mb: 0.05}\n";
  auto rank0_small = [&](const char* schedule) {
    const std::string f = std::string("features: {pipeline_parallel: {enabled: true, size: 2, schedule: ") +
                          schedule + "}, zero: {enabled: true, stage: 2}}\n";
    return hp::plan::estimate(setup(small + f, 4), cal).ranks.at(0);
  };
  const double travelling = rank0_small("1f1b").buffers - rank0_small("gpipe").buffers;
  EXPECT_GE(travelling, 1.5 * 2 * 0.05 * kMiB);
  EXPECT_LT(travelling, 1.5 * made_whole);
}

// Context parallel computes attention by score blocks: each of the rank's
// attention layers costs its layout's blocks (cp=2 at seq 32: chunks of 8,
// one block a chunk pair, 2 x 2 - 1 whole + 2 diagonal = 5 a head) at the
// calibrated seconds of a block of that length, in place of the model's
// own attention over its tokens; a length between two measured ones is
// interpolated.
TEST(Planner, ContextParallelAttentionCostsItsBlocks) {
  const std::string gpt = small_gpt() + "features: {context_parallel: {enabled: true, size: 2}}\n";
  const std::string dp = gpt.substr(0, gpt.find("features:"));
  auto cal = calibration(setup(dp, 1), 1000, 0);
  const auto without = hp::plan::estimate(setup(gpt, 2), cal).ranks.at(0);
  cal.attention_core_seconds_per_token_1 = 1e-6;
  cal.attention_block_seconds_1 = {{4, 1e-5}, {16, 4e-5}};  // a block of 8: 2e-5
  const auto with = hp::plan::estimate(setup(gpt, 2), cal).ranks.at(0);
  // Per micro-batch and layer: 2 samples x 4 heads x 5 blocks x 2e-5 s,
  // less the model's attention over 2 x 32 / 2 tokens; 2 micro-batches, 2
  // layers, no cores shared.
  EXPECT_NEAR(with.compute - without.compute, (2 * 4 * 5 * 2e-5 - 1e-6 * 32) * 2 * 2, 1e-12);
  // Without a sequence layout the blocks are not counted.
  EXPECT_DOUBLE_EQ(hp::plan::estimate(setup(dp, 2), cal).ranks.at(0).compute,
                   hp::plan::estimate(setup(dp, 2), calibration(setup(dp, 1), 1000, 0)).ranks.at(0).compute);
}

// Fewer tokens a micro-batch than calibrated (positions split over a
// sequence group): a block's seconds per micro-batch lie on the line
// through the whole micro-batch's (64 tokens at 1 us each) and the
// half-positions one's (32 at 1.5 us: 48 us). cp=2 holds 32 tokens: 1.5 us
// each; cp=4 holds 16: 40 us, 2.5 us each. Never under the whole's per
// token; without the half-positions figures, the whole's. The blocks' own
// attention (1 us a token at 32 positions) counts at the rank's positions
// in proportion to their length (half of it at 16 of 32).
TEST(Planner, FewerPositionsFollowTheHalfPositionsTimes) {
  const std::string gpt = small_gpt();
  auto cp = [&](int n) {
    return setup(gpt + "features: {context_parallel: {enabled: true, size: " + std::to_string(n) + "}}\n", n);
  };
  auto cal = calibration(setup(gpt, 1), 1000, 0);
  const double whole2 = hp::plan::estimate(cp(2), cal).ranks.at(0).compute;
  const double whole4 = hp::plan::estimate(cp(4), cal).ranks.at(0).compute;
  cal.seconds_per_token_half_positions_1.assign(cal.seconds_per_token_1.size(), 1.5e-6);
  EXPECT_NEAR(hp::plan::estimate(cp(2), cal).ranks.at(0).compute / whole2, 1.5, 1e-9);
  EXPECT_NEAR(hp::plan::estimate(cp(4), cal).ranks.at(0).compute / whole4, 2.5, 1e-9);
  // Data parallel holds the calibrated tokens: unchanged.
  EXPECT_DOUBLE_EQ(hp::plan::estimate(setup(gpt, 2), cal).ranks.at(0).compute,
                   hp::plan::estimate(setup(gpt, 2), calibration(setup(gpt, 1), 1000, 0)).ranks.at(0).compute);
  cal.seconds_per_token_half_positions_1.assign(cal.seconds_per_token_1.size(), 0.8e-6);
  EXPECT_NEAR(hp::plan::estimate(cp(2), cal).ranks.at(0).compute, whole2, 1e-12);
  // The attention by blocks in place of the blocks' own at the rank's
  // positions: 2 x 4 heads x 5 blocks of 8 at 2e-5 s, less 32 tokens x 1
  // us x 16 / 32, per micro-batch and layer (2 and 2).
  cal.seconds_per_token_half_positions_1.assign(cal.seconds_per_token_1.size(), 1e-6);
  const double before = hp::plan::estimate(cp(2), cal).ranks.at(0).compute;
  cal.attention_core_seconds_per_token_1 = 1e-6;
  cal.attention_block_seconds_1 = {{4, 1e-5}, {16, 4e-5}};
  EXPECT_NEAR(hp::plan::estimate(cp(2), cal).ranks.at(0).compute - before, (2 * 4 * 5 * 2e-5 - 1e-6 * 32 / 2) * 2 * 2,
              1e-12);
}

// Mixed precision: what crosses ranks with the activations goes in bf16
// (a pipeline's stage messages: half the bytes), the gradients' sums in
// fp32 unless reduce_dtype is bf16 (then half); the calibration's key names
// the precision, so fp32 and bf16 are measured and cached apart.
TEST(Planner, MixedPrecisionHalvesWhatCrossesRanksInBf16) {
  const std::string gpt = small_gpt();
  const auto cal = calibration(setup(gpt, 1), 1000, 0);
  auto bytes = [&](const std::string& features, int world) {
    return hp::plan::estimate(setup(gpt + "features: {" + features + "}\n", world), cal).ranks.at(0).comm_bytes;
  };
  const std::string pp = "pipeline_parallel: {enabled: true, size: 2}";
  const std::string mp = "mixed_precision: {enabled: true}";
  const double stage_fp32 = bytes(pp, 2);
  ASSERT_GT(stage_fp32, 0);
  EXPECT_DOUBLE_EQ(bytes(pp + ", " + mp, 2), stage_fp32 / 2);
  const double sums_fp32 = bytes("", 2);
  ASSERT_GT(sums_fp32, 0);
  EXPECT_DOUBLE_EQ(bytes(mp, 2), sums_fp32);
  EXPECT_DOUBLE_EQ(bytes("mixed_precision: {enabled: true, reduce_dtype: bf16}", 2), sums_fp32 / 2);
  // A bf16 sum costs the calibrated factor times an fp32 one of as many
  // elements: tensor parallel's sums of bf16 activations, linear in it;
  // fp32 layouts untouched.
  auto comm = [&](const std::string& features, double factor) {
    auto c = cal;
    c.collective_bf16_sum_factor = factor;
    return hp::plan::estimate(setup(gpt + "features: {" + features + "}\n", 2), c).ranks.at(0).comm;
  };
  const std::string tp = "tensor_parallel: {enabled: true, size: 2}";
  const double one = comm(tp + ", " + mp, 1), two = comm(tp + ", " + mp, 2), three = comm(tp + ", " + mp, 3);
  EXPECT_GT(two, one);
  EXPECT_NEAR(three - one, 2 * (two - one), 1e-12);
  EXPECT_DOUBLE_EQ(comm(tp, 3), comm(tp, 1));
  const std::string fp32_key = hp::plan::calibration_key(setup(gpt, 1));
  const std::string bf16_key = hp::plan::calibration_key(setup(gpt + "features: {" + mp + "}\n", 1));
  EXPECT_NE(fp32_key.find("precision fp32"), std::string::npos) << fp32_key;
  EXPECT_NE(bf16_key.find("precision bf16, sums fp32"), std::string::npos) << bf16_key;
}

// The routing's loads per group of experts: 4 experts with 3, 1, 0, 0 rows
// put 4 of 4 rows on the first of two groups (2x the mean) and 3 on the
// first of four (3x); a second sample evenly loaded averages to 1.5 and 2.
TEST(Planner, GroupImbalanceIsTheMostLoadedGroupOverTheMean) {
  const auto one = hp::plan::group_imbalance({{3, 1, 0, 0}});
  ASSERT_EQ(one.size(), 2u);
  EXPECT_EQ(one[0], (std::vector<double>{2, 2.0}));
  EXPECT_EQ(one[1], (std::vector<double>{4, 3.0}));
  const auto two = hp::plan::group_imbalance({{3, 1, 0, 0}, {1, 1, 1, 1}});
  EXPECT_EQ(two[0], (std::vector<double>{2, 1.5}));
  EXPECT_EQ(two[1], (std::vector<double>{4, 2.0}));
  EXPECT_TRUE(hp::plan::group_imbalance({}).empty());
}

// An expert split waits, per micro-batch and MoE block, for its most loaded
// rank: (factor - 1) x the block's expert seconds per token x the rank's
// tokens, on top of the exchanges; the same layout with even loads
// (factor 1) waits for nothing more.
TEST(Planner, ExpertSplitWaitsForTheMostLoadedRank) {
  const hp::Setup ep = setup(std::string(kMoe) + "features: {expert_parallel: {enabled: true, size: 2}}\n", 2);
  auto cal = calibration(setup(kMoe, 1), 100, 0);
  cal.expert_seconds_per_token_1.assign(cal.seconds_per_token_1.size(), 0.0);
  cal.expert_seconds_per_token_1[1] = cal.expert_seconds_per_token_1[2] = 2e-6;  // the two MoE blocks
  cal.expert_group_imbalance = {{2, 1.0}, {4, 1.0}};
  const auto even = hp::plan::estimate(ep, cal).ranks.at(0);
  cal.expert_group_imbalance = {{2, 1.5}, {4, 3.0}};
  const auto uneven = hp::plan::estimate(ep, cal).ranks.at(0);
  // 2 blocks x 0.5 x 2e-6 s x 64 tokens x 1 micro-batch a rank (4 samples of
  // 2 over dp=2), on one single-thread rank per core.
  EXPECT_NEAR(uneven.comm - even.comm, 2 * 0.5 * 2e-6 * 64 * 1, 1e-12);
  EXPECT_EQ(uneven.compute, even.compute);
}
