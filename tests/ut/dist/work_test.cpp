// Work handles of hp::dist::Group: many operations in flight at once, their
// results against the blocking calls, completion order, a receive posted
// before its send, and failures that surface at wait() naming the op, the
// group and the rank. Real Gloo process groups, ranks as threads.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "hp/comm/group.h"
#include "hp/profile/trace.h"
#include "tests/support/multi_rank.h"

using hp::dist::CommError;
using hp::dist::DistributedContext;
using hp::dist::Work;

namespace {

torch::Tensor input_of(int r, int i, std::vector<int64_t> shape) {
  auto g = torch::make_generator<at::CPUGeneratorImpl>(7000 + 100 * r + i);
  return torch::randn(shape, g);
}

}  // namespace

TEST(WorkHandles, ManyInFlightGiveTheBlockingResults) {
  constexpr int kOps = 12;
  hp::test::run_ranks(4, [&](DistributedContext& ctx) {
    auto& g = ctx.group("world");
    const int r = ctx.rank();
    std::vector<torch::Tensor> sums;
    std::vector<std::unique_ptr<Work>> works;
    for (int i = 0; i < kOps; ++i) {
      sums.push_back(input_of(r, i, {64 + i}));
      works.push_back(g.all_reduce_async(sums.back()));
    }
    auto gathered = g.all_gather_async(input_of(r, 50, {2, 3}), 1);
    auto scattered = g.reduce_scatter_async(input_of(r, 51, {8, 5}), 0);
    std::vector<int64_t> counts{1, 2, 3, 4};
    auto rows = torch::full({10, 2}, static_cast<float>(r));
    auto exchanged = g.all_to_all_async(rows, counts, std::vector<int64_t>(4, counts[static_cast<std::size_t>(r)]));
    // Waited in another order than issued.
    auto a2a = exchanged->wait();
    auto rs = scattered->wait();
    auto ag = gathered->wait();
    for (int i = kOps - 1; i >= 0; --i) {
      auto res = works[static_cast<std::size_t>(i)]->wait();
      EXPECT_TRUE(res.is_same(sums[static_cast<std::size_t>(i)])) << "all_reduce's result is the tensor given";
    }
    // The same operations, blocking.
    for (int i = 0; i < kOps; ++i) {
      auto ref = input_of(r, i, {64 + i});
      g.all_reduce(ref);
      EXPECT_TRUE(torch::equal(sums[static_cast<std::size_t>(i)], ref)) << "all_reduce " << i;
    }
    EXPECT_TRUE(torch::equal(ag, g.all_gather(input_of(r, 50, {2, 3}), 1)));
    EXPECT_TRUE(torch::equal(rs, g.reduce_scatter(input_of(r, 51, {8, 5}), 0)));
    EXPECT_TRUE(torch::equal(a2a, g.all_to_all(rows, counts, std::vector<int64_t>(4, counts[static_cast<std::size_t>(r)]))));
    EXPECT_EQ(a2a.size(0), 4 * counts[static_cast<std::size_t>(r)]);
  });
}

TEST(WorkHandles, NotCompletedUntilEveryMemberJoinsThenInIssueOrder) {
  std::atomic<bool> checked{false};
  hp::test::run_ranks(2, [&](DistributedContext& ctx) {
    auto& g = ctx.group("world");
    if (ctx.rank() == 1) {
      while (!checked.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::vector<std::unique_ptr<Work>> works;
    std::vector<torch::Tensor> ts;
    for (int i = 0; i < 5; ++i) {
      ts.push_back(torch::full({1 << (10 + i)}, 1.0f));
      works.push_back(g.all_reduce_async(ts.back()));
    }
    if (ctx.rank() == 0) {
      // Rank 1 has issued nothing yet: nothing can have completed.
      for (auto& w : works) EXPECT_FALSE(w->completed());
      checked = true;
    }
    // One communication thread per group: once the last is done, all are.
    works.back()->wait();
    for (auto& w : works) EXPECT_TRUE(w->completed());
    for (auto& t : ts) EXPECT_TRUE(torch::equal(t, torch::full_like(t, 2.0f)));
  });
}

TEST(WorkHandles, ReceivePostedBeforeItsSend) {
  std::atomic<bool> posted{false};
  hp::test::run_ranks(2, [&](DistributedContext& ctx) {
    auto& g = ctx.group("world");
    if (ctx.rank() == 1) {
      auto buf = torch::empty({6});
      auto w = g.irecv(buf, 0, 3);
      EXPECT_FALSE(w->completed());
      posted = true;
      auto got = w->wait();
      EXPECT_TRUE(got.is_same(buf));
      EXPECT_TRUE(torch::equal(buf, torch::arange(6, torch::kFloat)));
      EXPECT_EQ(w->op(), "recv from member 0");
    } else {
      while (!posted.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      g.isend(torch::arange(6, torch::kFloat), 1, 3)->wait();
    }
  });
}

TEST(WorkHandles, FailureSurfacesAtWaitNamingOpGroupAndRank) {
  hp::test::run_ranks(
      2,
      [&](DistributedContext& ctx) {
        if (ctx.rank() != 0) return;  // rank 1 never joins
        auto t = torch::ones({2});
        std::unique_ptr<Work> w;
        ASSERT_NO_THROW(w = ctx.group("world").reduce_scatter_async(t)) << "issuing never waits";
        for (int attempt = 0; attempt < 2; ++attempt) {  // and waiting again says it again
          try {
            w->wait();
            ADD_FAILURE() << "expected a timeout";
          } catch (const CommError& e) {
            const std::string m = e.what();
            EXPECT_NE(m.find("rank 0: reduce_scatter on group 'world' (global ranks [0,1]"), std::string::npos) << m;
            EXPECT_NE(m.find("failed"), std::string::npos) << m;
          }
        }
        EXPECT_TRUE(w->completed());
      },
      std::chrono::milliseconds(1500));
}

TEST(WorkHandles, AsyncSpansCloseAtCompletionOnTheGroupsTrack) {
  hp::profile::take_events();
  hp::profile::set_recording(true);
  hp::test::run_ranks(2, [&](DistributedContext& ctx) {
    auto& g = ctx.group("world");
    auto t = torch::ones({1 << 12});
    if (ctx.rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    auto w = g.all_reduce_async(t);
    // Waited long after completion: the span still ends at completion.
    std::this_thread::sleep_for(std::chrono::milliseconds(ctx.rank() == 0 ? 600 : 400));
    w->wait();
    g.barrier();
  });
  hp::profile::set_recording(false);
  const auto events = hp::profile::take_events();
  int async = 0, blocking = 0;
  for (const auto& e : events) {
    if (e.name == "all_reduce") {
      ++async;
      bool flagged = false;
      for (const auto& a : e.args) flagged = flagged || (a.key == "async" && a.number == 1);
      EXPECT_TRUE(flagged);
      EXPECT_EQ(e.thread, hp::profile::track("in flight on world"));
      const double ms = (e.end_ns - e.begin_ns) / 1e6;
      // Rank 0 issued 200 ms before rank 1 and waited 600 ms more: the op
      // took about 200 ms (rank 0) or a few (rank 1), never the 600 ms wait.
      EXPECT_LT(ms, 450.0) << "the span ran to the wait, not to completion";
    }
    if (e.name == "barrier") {
      ++blocking;
      EXPECT_LT(e.thread, 1000) << "a blocking op's span is on its caller's thread";
    }
  }
  EXPECT_EQ(async, 2);
  EXPECT_EQ(blocking, 2);
}

// A planning context (hp-plan builds every rank's model in one): each rank's
// groups with their members and its index, and no operation on a group of
// several ranks (it names the group and says why), while a group of one
// still computes locally.
TEST(PlanningContext, KnowsEveryRanksGroupsAndRefusesToCommunicate) {
  const auto mesh = hp::test::grid(2, 2, 2);  // pp 2 x dp 2 x tp 2
  for (int rank = 0; rank < mesh.world_size(); ++rank) {
    auto ctx = DistributedContext::planning(mesh, rank);
    EXPECT_EQ(ctx->rank(), rank);
    EXPECT_EQ(ctx->world_size(), 8);
    for (const char* dim : {"pp", "dp", "tp"}) {
      auto& g = ctx->group(dim);
      EXPECT_EQ(g.size(), 2) << dim;
      EXPECT_EQ(g.global_ranks().at(static_cast<std::size_t>(g.rank())), rank) << dim;
      EXPECT_EQ(g.global_ranks(), mesh.group_ranks(dim, rank)) << dim;
    }
  }
  auto ctx = DistributedContext::planning(mesh, 3);
  auto t = torch::ones({4});
  try {
    ctx->group("tp").all_reduce(t);
    ADD_FAILURE() << "a planning context communicated";
  } catch (const CommError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("'tp'"), std::string::npos) << what;
    EXPECT_NE(what.find("planning context"), std::string::npos) << what;
  }
  auto one = DistributedContext::planning(hp::dist::ProcessMesh(), 0);
  one->group("world").all_reduce(t);
  EXPECT_TRUE(torch::equal(t, torch::ones({4})));
}
