// Every collective of hp::dist::Group against a dense reference, over real
// Gloo process groups on 2 and 4 ranks, including the reduce-scatter and flat
// all-gather Gloo lacks natively and uneven all-to-all.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "hp/comm/gather.h"
#include "hp/comm/group.h"
#include "tests/support/multi_rank.h"

using hp::dist::DistributedContext;
using hp::dist::Group;
using hp::dist::ReduceKind;

namespace {

/// The tensor rank `r` contributes: distinct, reproducible values.
torch::Tensor input_of(int r, std::vector<int64_t> shape) {
  auto g = torch::make_generator<at::CPUGeneratorImpl>(1000 + r);
  return torch::randn(shape, g);
}

class Collectives : public ::testing::TestWithParam<int> {};

}  // namespace

TEST_P(Collectives, AllReduceSumMaxAvg) {
  const int n = GetParam();
  hp::test::run_ranks(n, [&](DistributedContext& ctx) {
    auto& g = ctx.group("world");
    auto ref_sum = torch::zeros({3, 5});
    auto ref_max = torch::full({3, 5}, -1e30);
    for (int r = 0; r < n; ++r) {
      ref_sum += input_of(r, {3, 5});
      ref_max = torch::maximum(ref_max, input_of(r, {3, 5}));
    }
    auto t = input_of(ctx.rank(), {3, 5});
    g.all_reduce(t);
    EXPECT_TRUE(torch::allclose(t, ref_sum, 1e-6, 1e-6));
    auto m = input_of(ctx.rank(), {3, 5});
    g.all_reduce(m, ReduceKind::kMax);
    EXPECT_TRUE(torch::equal(m, ref_max));
    auto a = input_of(ctx.rank(), {3, 5});
    g.all_reduce(a, ReduceKind::kAvg);
    EXPECT_TRUE(torch::allclose(a, ref_sum / n, 1e-6, 1e-6));
    // bf16 (which Gloo lacks) is exchanged as bytes, summed in fp32, and
    // comes back as bf16.
    auto b = torch::ones({4}, torch::kBFloat16);
    g.all_reduce(b);
    EXPECT_EQ(b.scalar_type(), torch::kBFloat16);
    EXPECT_TRUE(torch::equal(b.to(torch::kFloat), torch::full({4}, static_cast<float>(n))));
  });
}

TEST_P(Collectives, BroadcastFromEveryRoot) {
  const int n = GetParam();
  hp::test::run_ranks(n, [&](DistributedContext& ctx) {
    for (int root = 0; root < n; ++root) {
      auto t = input_of(ctx.rank(), {7});
      ctx.group("world").broadcast(t, root);
      EXPECT_TRUE(torch::equal(t, input_of(root, {7})));
    }
  });
}

TEST_P(Collectives, FlatAllGatherAlongAnyDim) {
  const int n = GetParam();
  hp::test::run_ranks(n, [&](DistributedContext& ctx) {
    std::vector<torch::Tensor> parts;
    for (int r = 0; r < n; ++r) parts.push_back(input_of(r, {2, 3}));
    for (int64_t dim : {0, 1}) {
      auto out = ctx.group("world").all_gather(input_of(ctx.rank(), {2, 3}), dim);
      EXPECT_TRUE(torch::equal(out, torch::cat(parts, dim))) << "dim " << dim;
    }
  });
}

TEST_P(Collectives, ReduceScatterAlongAnyDim) {
  const int n = GetParam();
  hp::test::run_ranks(n, [&](DistributedContext& ctx) {
    for (int64_t dim : {0, 1}) {
      std::vector<int64_t> shape = dim == 0 ? std::vector<int64_t>{2 * n, 3}
                                            : std::vector<int64_t>{3, 2 * n};
      auto ref = torch::zeros(shape);
      for (int r = 0; r < n; ++r) ref += input_of(r, shape);
      auto out = ctx.group("world").reduce_scatter(input_of(ctx.rank(), shape), dim);
      auto expect = ref.chunk(n, dim)[ctx.rank()];
      EXPECT_TRUE(torch::allclose(out, expect, 1e-6, 1e-6)) << "dim " << dim;
    }
  });
}

TEST_P(Collectives, ReduceScatterRefusesAnIndivisibleDimension) {
  const int n = GetParam();
  hp::test::run_ranks(n, [&](DistributedContext& ctx) {
    try {
      ctx.group("world").reduce_scatter(torch::ones({n + 1}), 0);
      ADD_FAILURE() << "expected a CommError";
    } catch (const hp::dist::CommError& e) {
      EXPECT_NE(std::string(e.what()).find("reduce_scatter on group 'world'"), std::string::npos);
      EXPECT_NE(std::string(e.what()).find("not divisible by the group size"), std::string::npos);
    }
  });
}

TEST_P(Collectives, ReduceScatterOfUnevenChunksSumsInMemberOrder) {
  const int n = GetParam();
  // Member m's chunk is m % 3 rows (member 0's is empty); zero's buckets.
  std::vector<int64_t> counts;
  int64_t rows = 0;
  for (int m = 0; m < n; ++m) rows += counts.emplace_back(m % 3);
  hp::test::run_ranks(n, [&](DistributedContext& ctx) {
    const int me = ctx.rank();
    int64_t start = 0;
    for (int m = 0; m < me; ++m) start += counts[m];
    // The same arithmetic as the group: member 0's chunk, then the others in order.
    auto expect = input_of(0, {rows, 3}).narrow(0, start, counts[me]).clone();
    for (int r = 1; r < n; ++r) expect.add_(input_of(r, {rows, 3}).narrow(0, start, counts[me]));
    auto out = ctx.group("world").reduce_scatter(input_of(me, {rows, 3}), counts);
    EXPECT_EQ(out.sizes(), expect.sizes());
    EXPECT_TRUE(torch::equal(out, expect)) << "bitwise, rank " << me;
  });
}

TEST_P(Collectives, AllGatherOfUnevenTensorsTrimsEachMembers) {
  const int n = GetParam();
  // Member r holds r columns (member 0 none) of a 2-row tensor, and r
  // characters of text.
  hp::test::run_ranks(n, [&](DistributedContext& ctx) {
    auto& g = ctx.group("world");
    const int me = ctx.rank();
    std::vector<int64_t> lengths;
    for (int r = 0; r < n; ++r) lengths.push_back(r);
    const auto mine = input_of(me, {2, 4}).narrow(1, 0, me);
    const auto exchanged = hp::dist::all_gather_uneven(g, mine, 1);
    const auto known = hp::dist::all_gather_uneven(g, mine, 1, lengths);
    const auto texts =
        hp::dist::all_gather_text(g, std::string(static_cast<std::size_t>(me), 'a' + me));
    ASSERT_EQ(exchanged.size(), static_cast<std::size_t>(n));
    ASSERT_EQ(known.size(), static_cast<std::size_t>(n));
    ASSERT_EQ(texts.size(), static_cast<std::size_t>(n));
    for (int r = 0; r < n; ++r) {
      const auto expect = input_of(r, {2, 4}).narrow(1, 0, r);
      EXPECT_TRUE(torch::equal(exchanged[r], expect)) << "member " << r;
      EXPECT_TRUE(torch::equal(known[r], expect)) << "member " << r;
      EXPECT_EQ(texts[r], std::string(static_cast<std::size_t>(r), 'a' + r));
    }
  });
}

// The started form: several uneven gathers in flight at once, waited in
// another order than issued, each bitwise what the blocking form gives.
TEST_P(Collectives, UnevenGathersInFlightAtOnceMatchTheBlockingForm) {
  const int n = GetParam();
  hp::test::run_ranks(n, [&](DistributedContext& ctx) {
    auto& g = ctx.group("world");
    const int me = ctx.rank();
    std::vector<std::vector<int64_t>> lengths(3);
    std::vector<torch::Tensor> mine;
    std::vector<hp::dist::UnevenGather> started;
    for (int k = 0; k < 3; ++k) {
      for (int r = 0; r < n; ++r) lengths[k].push_back((r + k) % 3);  // some members empty
      mine.push_back(input_of(me * 10 + k, {5, 2}).narrow(0, 0, lengths[k][me]));
      started.push_back(hp::dist::all_gather_uneven_async(g, mine[k], 0, lengths[k]));
    }
    for (int k : {2, 0, 1}) {
      const auto got = started[k].wait();
      ASSERT_EQ(got.size(), static_cast<std::size_t>(n));
      for (int r = 0; r < n; ++r) {
        EXPECT_TRUE(torch::equal(got[r], input_of(r * 10 + k, {5, 2}).narrow(0, 0, lengths[k][r])))
            << "gather " << k << ", member " << r;
      }
    }
    const auto blocking = hp::dist::all_gather_uneven(g, mine[1], 0, lengths[1]);
    for (int r = 0; r < n; ++r) EXPECT_TRUE(torch::equal(blocking[r], input_of(r * 10 + 1, {5, 2}).narrow(0, 0, lengths[1][r])));
  });
}

TEST_P(Collectives, UnevenAllToAll) {
  const int n = GetParam();
  // Rank r sends count(r, j) rows to rank j; each row is tagged with its
  // sender and position so the receiver can check where everything landed.
  auto count = [](int r, int j) -> int64_t { return (r * 3 + j) % 4; };  // includes zeros
  hp::test::run_ranks(n, [&](DistributedContext& ctx) {
    const int me = ctx.rank();
    std::vector<int64_t> send, recv;
    std::vector<torch::Tensor> rows;
    for (int j = 0; j < n; ++j) {
      send.push_back(count(me, j));
      recv.push_back(count(j, me));
      for (int64_t k = 0; k < count(me, j); ++k) {
        rows.push_back(torch::tensor({static_cast<float>(me), static_cast<float>(j),
                                      static_cast<float>(k)}));
      }
    }
    auto in = rows.empty() ? torch::zeros({0, 3}) : torch::stack(rows);
    auto out = ctx.group("world").all_to_all(in, send, recv);
    int64_t row = 0;
    for (int r = 0; r < n; ++r) {
      for (int64_t k = 0; k < count(r, me); ++k, ++row) {
        EXPECT_TRUE(torch::equal(out[row], torch::tensor({static_cast<float>(r),
                                                          static_cast<float>(me),
                                                          static_cast<float>(k)})));
      }
    }
    EXPECT_EQ(out.size(0), row);
  });
}

TEST_P(Collectives, SendRecvRing) {
  const int n = GetParam();
  hp::test::run_ranks(n, [&](DistributedContext& ctx) {
    auto& g = ctx.group("world");
    const int me = g.rank();
    auto t = torch::empty({4});
    // Even ranks send first: a fixed order that cannot deadlock.
    if (me % 2 == 0) {
      g.send(input_of(me, {4}), (me + 1) % n);
      g.recv(t, (me + n - 1) % n);
    } else {
      g.recv(t, (me + n - 1) % n);
      g.send(input_of(me, {4}), (me + 1) % n);
    }
    EXPECT_TRUE(torch::equal(t, input_of((me + n - 1) % n, {4})));
    g.barrier();
    EXPECT_GT(g.stats().at("barrier").calls, 0u);
    EXPECT_GT(g.stats().at("send").bytes, 0u);
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, Collectives, ::testing::Values(2, 4),
                         [](const auto& info) { return std::to_string(info.param) + "ranks"; });

TEST(CollectiveGroups, SubgroupsReduceOnlyTheirMembers) {
  hp::test::run_ranks(hp::test::grid(1, 2, 2), [&](DistributedContext& ctx) {
    auto t = torch::full({1}, static_cast<float>(ctx.rank()));
    ctx.group("tp").all_reduce(t);
    const int base = ctx.rank() / 2 * 2;  // tp groups {0,1} and {2,3}
    EXPECT_EQ(t.item<float>(), static_cast<float>(base + base + 1));
    auto d = torch::full({1}, static_cast<float>(ctx.rank()));
    ctx.group("dp").all_reduce(d);  // dp groups {0,2} and {1,3}
    EXPECT_EQ(d.item<float>(), static_cast<float>(ctx.rank() % 2 * 2 + 2));
    EXPECT_EQ(ctx.group("pp").size(), 1);
  });
}

// Groups of a view and of a flat group are real process groups: a view
// refactoring tp x dp (2 x 2) into one 4-rank dimension reduces over all
// four, its remainder over one; a flat group over tp x dp also over four.
TEST(CollectiveGroups, ViewAndFlatGroupsReduceOverTheirMembers) {
  hp::dist::MeshPlan plan;
  plan.claim("tp", 2, "test", hp::dist::MeshRole::kSplit);
  plan.view({"wide", {"tp", hp::dist::ProcessMesh::data_dim()},
             {{"wide_tp", 4, hp::dist::MeshRole::kSplit, "test"}, {"wide_dp", 0, hp::dist::MeshRole::kReplicate, "test"}},
             "test"});
  plan.flatten("tp_dp", {"tp", hp::dist::ProcessMesh::data_dim()}, "test");
  hp::dist::ProcessMesh mesh;
  hp::dist::MeshProblem problem;
  ASSERT_TRUE(hp::dist::resolve_mesh(plan, 4, 0, mesh, problem)) << problem.rule;
  hp::test::run_ranks(mesh, [&](DistributedContext& ctx) {
    auto t = torch::full({1}, static_cast<float>(ctx.rank() + 1));
    ctx.group("wide_tp").all_reduce(t);
    EXPECT_EQ(t.item<float>(), 10.0f);
    EXPECT_EQ(ctx.group("wide_dp").size(), 1);
    auto f = torch::full({1}, static_cast<float>(ctx.rank() + 1));
    ctx.group("tp_dp").all_reduce(f);
    EXPECT_EQ(f.item<float>(), 10.0f);
    EXPECT_EQ(ctx.group("tp").global_ranks(), (std::vector<int>{ctx.rank() / 2 * 2, ctx.rank() / 2 * 2 + 1}));
    EXPECT_EQ(ctx.group(hp::dist::MeshRole::kPartition).size(), 1) << "no partition dimension: this rank alone";
    try {
      ctx.group("cp");
      ADD_FAILURE() << "an unknown group was returned";
    } catch (const std::logic_error& e) {
      EXPECT_NE(std::string(e.what()).find("no mesh group named 'cp' on rank"), std::string::npos) << e.what();
    }
  });
}

TEST(CollectiveGroups, TimeoutNamesGroupOpAndRanks) {
  // Rank 1 never joins the all-reduce: rank 0 must give up after the
  // timeout with a message naming the group, the op and the ranks.
  hp::test::run_ranks(
      2,
      [&](DistributedContext& ctx) {
        if (ctx.rank() != 0) return;
        auto t = torch::ones({2});
        try {
          ctx.group("world").all_reduce(t);
          ADD_FAILURE() << "expected a timeout";
        } catch (const hp::dist::CommError& e) {
          std::string w = e.what();
          EXPECT_NE(w.find("rank 0: all_reduce on group 'world' (global ranks [0,1]"),
                    std::string::npos) << w;
          EXPECT_NE(w.find("failed"), std::string::npos) << w;
        }
      },
      std::chrono::milliseconds(1500));
}
