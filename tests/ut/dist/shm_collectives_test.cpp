// The shared-memory collectives (ContextOptions::shm_collectives): an
// all-reduce bitwise the sum in member order on every member, equal to
// Gloo's at two members; reduce-scatters (uneven) and all-gathers bitwise
// Gloo's path at 2-4 members; uneven all-to-alls deliver what the senders
// sent on both paths; tensors of one element to several slots, in
// flight beside Gloo's operations, and failures that name the member: a
// peer process that exited (a real second process), a peer that never
// comes (the timeout).
// Ranks as threads share the segment as processes do (each maps it).
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "hp/comm/context.h"
#include "hp/comm/group.h"
#include "tests/support/multi_rank.h"

extern char** environ;

using hp::dist::CommError;
using hp::dist::ContextOptions;
using hp::dist::DistributedContext;
using hp::dist::Work;

namespace {

// Floats per slot of the segment (ShmCollectives::kSlotBytes / 4): sizes around
// it take one, two and four pieces.
constexpr std::int64_t kSlotFloats = (2 << 20) / 4;

const std::vector<std::int64_t> kSizes{
    1, 3, 17, 1000, kSlotFloats - 1, kSlotFloats + 5, 3 * kSlotFloats + 123};

torch::Tensor input_of(int r, std::size_t i, std::int64_t n, at::ScalarType type) {
  auto g = torch::make_generator<at::CPUGeneratorImpl>(4200 + 100 * r + static_cast<int>(i));
  return torch::randn({n}, g).to(type);
}

/// ((x0 + x1) + x2) + ...: what every member must get, bit for bit.
torch::Tensor member_order_sum(int n, std::size_t i, std::int64_t size, at::ScalarType type) {
  auto sum = input_of(0, i, size, type);
  for (int q = 1; q < n; ++q) sum.add_(input_of(q, i, size, type));
  return sum;
}

ContextOptions with_shm(bool on) {
  ContextOptions o;
  o.shm_collectives = on;
  return o;
}

/// `body(ctx, group size)` on every rank of groups of 2, 3 and 4, on shared
/// memory and on Gloo (checking that the groups use the one asked for).
template <class F>
void at_2_to_4_members_on_both_paths(const F& body) {
  for (int n : {2, 3, 4}) {
    for (bool shm : {true, false}) {
      hp::test::run_ranks(hp::test::grid(1, n, 1), with_shm(shm), [&](DistributedContext& ctx) {
        EXPECT_EQ(!ctx.shm_groups().empty(), shm);
        body(ctx, n, shm);
      });
    }
  }
}

}  // namespace

TEST(ShmCollectives, EveryMemberGetsTheMemberOrderSumBitwiseAndTwoMembersGetGloosSum) {
  for (int n : {2, 3, 4}) {
    for (bool shm : {true, false}) {
      if (!shm && n != 2) continue;  // Gloo's ring sums in another order past two members
      hp::test::run_ranks(hp::test::grid(1, n, 1), with_shm(shm), [&](DistributedContext& ctx) {
        const bool expect_shm = shm;
        EXPECT_EQ(!ctx.shm_groups().empty(), expect_shm) << "groups on shared memory";
        EXPECT_TRUE(ctx.shm_fallbacks().empty())
            << (ctx.shm_fallbacks().empty() ? "" : ctx.shm_fallbacks()[0]);
        auto& g = ctx.group("world");
        for (auto type : {at::kFloat, at::kDouble}) {
          for (std::size_t i = 0; i < kSizes.size(); ++i) {
            auto t = input_of(ctx.rank(), i, kSizes[i], type);
            g.all_reduce(t);
            EXPECT_TRUE(torch::equal(t, member_order_sum(n, i, kSizes[i], type)))
                << "n=" << n << " shm=" << shm << " " << t.scalar_type() << " size " << kSizes[i];
          }
        }
      });
    }
  }
}

TEST(ShmCollectives, ReduceScatterAndAllGatherAreBitwiseGloosPath) {
  for (int n : {2, 3, 4}) {
    // [shm][rank]: every result of the script below.
    std::vector<std::vector<std::vector<torch::Tensor>>> results(
        2, std::vector<std::vector<torch::Tensor>>(n));
    for (bool shm : {true, false}) {
      hp::test::run_ranks(hp::test::grid(1, n, 1), with_shm(shm), [&](DistributedContext& ctx) {
        EXPECT_EQ(!ctx.shm_groups().empty(), shm);
        auto& g = ctx.group("world");
        const int r = ctx.rank();
        auto& out = results[shm ? 0 : 1][static_cast<std::size_t>(r)];
        // Uneven chunks (one empty) of rows of 3, across several slots.
        const std::int64_t rows = kSlotFloats;  // 3 * kSlotFloats floats: two pieces
        std::vector<std::int64_t> counts(static_cast<std::size_t>(n), rows / n);
        counts[0] += rows % n + counts[1];
        counts[1] = 0;
        auto t = input_of(r, 0, rows * 3, at::kFloat).view({rows, 3});
        out.push_back(g.reduce_scatter(t, counts));
        out.push_back(g.reduce_scatter(input_of(r, 1, 12 * n, at::kDouble).view({2, 6 * n}), 1,
                                       hp::dist::ReduceKind::kAvg));
        out.push_back(g.all_gather(input_of(r, 2, kSlotFloats + 7, at::kFloat)));
        out.push_back(g.all_gather(input_of(r, 3, 15, at::kFloat).view({3, 5}), 1));
        for (auto& p : g.all_gather_list(torch::arange(4, torch::kLong) + r))
          out.push_back(p.clone());
      });
    }
    for (int r = 0; r < n; ++r) {
      const auto& a = results[0][static_cast<std::size_t>(r)];
      const auto& b = results[1][static_cast<std::size_t>(r)];
      ASSERT_EQ(a.size(), b.size());
      for (std::size_t i = 0; i < a.size(); ++i) {
        EXPECT_EQ(a[i].sizes(), b[i].sizes()) << "n=" << n << " rank " << r << " result " << i;
        EXPECT_TRUE(a[i].sizes() == b[i].sizes() && torch::equal(a[i], b[i]))
            << "n=" << n << " rank " << r << " result " << i;
      }
    }
  }
}

TEST(ShmCollectives, AllGatherIntoPiecesPutsEveryMembersBytesInItsPiecesOnBothPaths) {
  // Member m's length: several slots for some, one element, none (member 1).
  auto length = [](int m) -> std::int64_t {
    return m == 1 ? 0 : m == 2 ? 1 : 2 * kSlotFloats + 333 * (m + 1);
  };
  // Member m's pieces: cut at a third and at one element past the half (a
  // piece of zero elements included when the length is small).
  auto cuts = [&](int m) {
    const std::int64_t n = length(m);
    const std::int64_t a = n / 3, b = std::min(n, n / 2 + 1);
    return std::vector<std::int64_t>{a, b - a, n - b};
  };
  at_2_to_4_members_on_both_paths([&](DistributedContext& ctx, int n, bool shm) {
    auto& g = ctx.group("world");
    const int r = ctx.rank();
    std::vector<std::vector<torch::Tensor>> out(static_cast<std::size_t>(n));
    std::vector<torch::Tensor> whole;
    for (int m = 0; m < n; ++m) {
      // Each member's destination: pieces of one buffer after five guard
      // elements that must stay untouched.
      whole.push_back(torch::full({length(m) + 5}, -7.0f));
      std::int64_t off = 5;
      for (std::int64_t k : cuts(m)) {
        out[static_cast<std::size_t>(m)].push_back(whole.back().narrow(0, off, k));
        off += k;
      }
    }
    // Twice in flight, the second on a stream of another size (the pieces
    // of round one are filled when round two is issued).
    auto first = g.all_gather_into_async(input_of(r, 7, length(r), at::kFloat), out);
    auto second_in = input_of(r, 8, 3, at::kFloat);
    std::vector<std::vector<torch::Tensor>> out2(static_cast<std::size_t>(n));
    std::vector<torch::Tensor> whole2;
    for (int m = 0; m < n; ++m) {
      whole2.push_back(torch::empty({3}));
      out2[static_cast<std::size_t>(m)].push_back(whole2.back());
    }
    auto second = g.all_gather_into_async(second_in, out2);
    second->wait();
    first->wait();
    for (int m = 0; m < n; ++m) {
      const auto& w = whole[static_cast<std::size_t>(m)];
      EXPECT_TRUE(torch::equal(w.narrow(0, 5, length(m)), input_of(m, 7, length(m), at::kFloat)))
          << "n=" << n << " shm=" << shm << " rank " << r << " member " << m;
      EXPECT_TRUE(torch::equal(w.narrow(0, 0, 5), torch::full({5}, -7.0f)))
          << "wrote before the pieces";
      EXPECT_TRUE(torch::equal(whole2[static_cast<std::size_t>(m)], input_of(m, 8, 3, at::kFloat)));
    }
  });
}

TEST(ShmCollectives, AllToAllDeliversEveryMembersRowsInSourceOrderOnBothPaths) {
  // Rows member j sends member d: none for some pairs, more than a slot for
  // one (120000 rows of 5 floats: two pieces), none at all from member 2.
  // Asynchronous and blocking exchanges, some in flight together.
  auto count = [](int j, int d, int n) -> std::int64_t {
    if (j == 2 || (j == 1 && d == 0)) return 0;
    if (j == 0 && d == n - 1) return 120000;
    return ((j + 1) * (d + 2) * 37) % 101;
  };
  auto rows = [](int j, int d, std::int64_t c, at::ScalarType type) {
    return input_of(j, 10 + static_cast<std::size_t>(d), c * 5, type).view({c, 5});
  };
  at_2_to_4_members_on_both_paths([&](DistributedContext& ctx, int n, bool shm) {
    auto& g = ctx.group("world");
    const int r = ctx.rank();
    for (auto type : {at::kFloat, at::kLong}) {
      std::vector<std::int64_t> send, recv;
      std::vector<torch::Tensor> parts, expected;
      for (int m = 0; m < n; ++m) {
        send.push_back(count(r, m, n));
        recv.push_back(count(m, r, n));
        parts.push_back(rows(r, m, send.back(), type));
        expected.push_back(rows(m, r, recv.back(), type));
      }
      // Twice in flight, the second the first's reverse.
      auto first = g.all_to_all_async(torch::cat(parts), send, recv);
      auto second = g.all_to_all_async(torch::cat(expected), recv, send);
      const auto back = second->wait();
      const auto got = first->wait();
      EXPECT_TRUE(torch::equal(got, torch::cat(expected)))
          << "n=" << n << " shm=" << shm << " rank " << r;
      EXPECT_TRUE(torch::equal(back, torch::cat(parts)))
          << "n=" << n << " shm=" << shm << " rank " << r;
      // Blocking (on shared memory run by the caller when the group's
      // thread is idle), alone and behind an exchange still in flight
      // (then queued after it).
      EXPECT_TRUE(torch::equal(g.all_to_all(torch::cat(parts), send, recv), torch::cat(expected)));
      auto ahead = g.all_to_all_async(torch::cat(expected), recv, send);
      EXPECT_TRUE(torch::equal(g.all_to_all(torch::cat(parts), send, recv), torch::cat(expected)));
      EXPECT_TRUE(torch::equal(ahead->wait(), torch::cat(parts)));
    }
  });
}

TEST(ShmCollectives, ManyInFlightBesideGlooOperationsInIssueOrder) {
  hp::test::run_ranks(hp::test::grid(1, 3, 1), with_shm(true), [&](DistributedContext& ctx) {
    auto& g = ctx.group("world");
    const int r = ctx.rank();
    std::vector<torch::Tensor> sums, avgs;
    std::vector<std::unique_ptr<Work>> works;
    for (std::size_t i = 0; i < 6; ++i) {
      sums.push_back(input_of(r, i, kSizes[i], at::kFloat));
      works.push_back(g.all_reduce_async(sums.back()));
      // Gloo's operations in between: a maximum, integers.
      avgs.push_back(input_of(r, 20 + i, 33, at::kDouble));
      works.push_back(g.all_reduce_async(avgs.back(), hp::dist::ReduceKind::kAvg));
    }
    auto maxed = torch::full({5}, static_cast<float>(r));
    auto max_work = g.all_reduce_async(maxed, hp::dist::ReduceKind::kMax);
    auto ints = torch::full({7}, static_cast<std::int64_t>(r + 1));
    auto int_work = g.all_reduce_async(ints);
    auto gathered = g.all_gather_async(torch::full({2}, static_cast<float>(r)));
    // Waited in the reverse order.
    auto all = gathered->wait();
    int_work->wait();
    max_work->wait();
    for (auto it = works.rbegin(); it != works.rend(); ++it) (*it)->wait();
    for (std::size_t i = 0; i < 6; ++i) {
      EXPECT_TRUE(torch::equal(sums[i], member_order_sum(3, i, kSizes[i], at::kFloat)))
          << "sum " << i;
      EXPECT_TRUE(torch::equal(avgs[i], member_order_sum(3, 20 + i, 33, at::kDouble).div_(3)))
          << "average " << i;
    }
    EXPECT_TRUE(torch::equal(maxed, torch::full({5}, 2.0f)));
    EXPECT_TRUE(torch::equal(ints, torch::full({7}, static_cast<std::int64_t>(6))));
    EXPECT_TRUE(torch::equal(all, torch::tensor({0.f, 0.f, 1.f, 1.f, 2.f, 2.f})));
  });
}

TEST(ShmCollectives, AnAllToAllWhoseSizesDisagreeFailsOnEveryMemberNamingTheSender) {
  // Member 0 sends 3 rows to member 1, which expects 2: member 1 names the
  // sender and both sizes; member 0 learns that its peer failed (nobody
  // reads past the stream's end or waits for the timeout).
  hp::test::run_ranks(
      hp::test::grid(1, 2, 1), with_shm(true),
      [&](DistributedContext& ctx) {
        const int r = ctx.rank();
        const std::vector<std::int64_t> send = r == 0 ? std::vector<std::int64_t>{1, 3} : std::vector<std::int64_t>{2, 1};
        const std::vector<std::int64_t> recv = r == 0 ? std::vector<std::int64_t>{1, 2} : std::vector<std::int64_t>{2, 1};
        const auto t0 = std::chrono::steady_clock::now();
        try {
          ctx.group("world").all_to_all(torch::ones({send[0] + send[1], 1}), send, recv);
          ADD_FAILURE() << "rank " << r << ": an all_to_all with disagreeing sizes completed";
        } catch (const CommError& e) {
          const std::string what = e.what();
          EXPECT_NE(what.find("all_to_all on group 'world'"), std::string::npos) << what;
          const std::string cause = r == 1 ? "member 0 sends 12 bytes to member 1, which expects 8"
                                           : "member 1 failed an earlier shared-memory operation";
          EXPECT_NE(what.find(cause), std::string::npos) << what;
        }
        EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20));
      },
      std::chrono::seconds(30));
}

TEST(ShmCollectives, APeerThatNeverComesFailsAtTheTimeoutNamingOpGroupAndMember) {
  hp::test::run_ranks(
      hp::test::grid(1, 2, 1), with_shm(true),
      [&](DistributedContext& ctx) {
        if (ctx.rank() == 1) return;  // never joins
        auto t = torch::ones({10});
        const auto t0 = std::chrono::steady_clock::now();
        try {
          ctx.group("world").all_reduce(t);
          ADD_FAILURE() << "an all_reduce without its peer completed";
        } catch (const CommError& e) {
          const std::string what = e.what();
          EXPECT_NE(what.find("rank 0: all_reduce on group 'world'"), std::string::npos) << what;
          EXPECT_NE(what.find("member 1 did not reach the shared-memory operation within 3"),
                    std::string::npos)
              << what;
        }
        EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20));
      },
      std::chrono::seconds(3));
}

namespace {

/// Rank `rank` of a 2-process job meeting at the FileStore `file`.
std::shared_ptr<DistributedContext> join_pair(int rank, const std::string& file) {
  hp::dist::DistEnv env;
  env.rank = rank;
  env.world_size = 2;
  env.source = "test";
  return DistributedContext::create(
      env, hp::test::grid(1, 2, 1),
      ContextOptions().with_file(file).with_timeout(std::chrono::seconds(60)));
}

}  // namespace

// The second process of the next test: joins the job, then exits.
TEST(ShmCollectivesChild, JoinsThenExits) {
  const char* file = std::getenv("HP_SHM_TEST_STORE");
  if (!file) GTEST_SKIP() << "run by ShmCollectives.AnExitedPeerProcessIsNamedLongBeforeTheTimeout";
  std::_Exit(join_pair(1, file)->shm_groups().empty() ? 3 : 0);
}

TEST(ShmCollectives, AnExitedPeerProcessIsNamedLongBeforeTheTimeout) {
  const std::string file =
      (std::filesystem::temp_directory_path() / ("hp_shm_exit_" + std::to_string(::getpid())))
          .string();
  std::filesystem::remove(file);
  const std::string store = "HP_SHM_TEST_STORE=" + file;
  std::vector<std::string> env_text{store};
  for (char** e = environ; *e; ++e) env_text.emplace_back(*e);
  std::vector<char*> envp;
  for (auto& s : env_text) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  std::string filter = "--gtest_filter=ShmCollectivesChild.JoinsThenExits";
  char* argv[] = {self.data(), filter.data(), nullptr};
  pid_t child = 0;
  ASSERT_EQ(::posix_spawn(&child, self.c_str(), nullptr, nullptr, argv, envp.data()), 0);

  {
    auto ctx = join_pair(0, file);
    ASSERT_FALSE(ctx->shm_groups().empty());
    auto t = torch::ones({1000});
    const auto t0 = std::chrono::steady_clock::now();
    try {
      ctx->group("world").all_reduce(t);
      ADD_FAILURE() << "an all_reduce whose peer exited completed";
    } catch (const CommError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("rank 0: all_reduce on group 'world'"), std::string::npos) << what;
      EXPECT_NE(what.find("member 1 (pid " + std::to_string(child) + ") has exited"),
                std::string::npos)
          << what;
    }
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10))
        << "found by the timeout (60 s), not the exit";
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "the child joined with shared memory";
  std::filesystem::remove(file);
}

/// bf16 (mixed precision) on shared memory and on Gloo, whose LibTorch 1.13
/// build has no bf16 at all: copies move the bf16 bytes, sums exchange them
/// and add in fp32 in member order, so every member gets the same bits, the
/// member-order fp32 sum rounded once, and the bytes counted are half of
/// fp32's.
TEST(ShmCollectives, Bf16MovesItsOwnBytesAndSumsInFp32OnBothPaths) {
  at_2_to_4_members_on_both_paths([](DistributedContext& ctx, int n, bool shm) {
    auto& g = ctx.group("world");
    const std::int64_t len = 6 * n;
    const std::string where = "n=" + std::to_string(n) + " shm=" + std::to_string(shm);
    auto sum_of_bf16 = input_of(0, 0, len, at::kBFloat16).to(at::kFloat);
    for (int q = 1; q < n; ++q) sum_of_bf16.add_(input_of(q, 0, len, at::kBFloat16).to(at::kFloat));
    const auto expect = sum_of_bf16.to(at::kBFloat16);
    // all_reduce
    const auto before = g.stats().count("all_reduce") ? g.stats().at("all_reduce").bytes : 0;
    auto t = input_of(ctx.rank(), 0, len, at::kBFloat16);
    g.all_reduce(t);
    EXPECT_EQ(t.scalar_type(), at::kBFloat16) << where;
    EXPECT_TRUE(torch::equal(t, expect)) << where;
    EXPECT_EQ(g.stats().at("all_reduce").bytes - before, static_cast<std::uint64_t>(2 * len * (n - 1))) << where;
    // reduce_scatter: this member's chunk of the same sum
    auto rs = g.reduce_scatter(input_of(ctx.rank(), 0, len, at::kBFloat16), 0);
    EXPECT_TRUE(torch::equal(rs, expect.narrow(0, ctx.rank() * 6, 6))) << where;
    EXPECT_EQ(g.stats().at("reduce_scatter").bytes, static_cast<std::uint64_t>(2 * 6 * (n - 1))) << where;
    // all_gather, all_to_all, broadcast, send/recv: the bytes as they are
    auto mine = input_of(ctx.rank(), 1, 5, at::kBFloat16);
    std::vector<torch::Tensor> all;
    for (int q = 0; q < n; ++q) all.push_back(input_of(q, 1, 5, at::kBFloat16));
    EXPECT_TRUE(torch::equal(g.all_gather(mine, 0), torch::cat(all))) << where;
    std::vector<std::int64_t> counts(static_cast<std::size_t>(n), 1);
    auto rows = input_of(ctx.rank(), 2, n, at::kBFloat16).view({n, 1});
    auto got = g.all_to_all(rows, counts, counts);
    for (int q = 0; q < n; ++q) {
      EXPECT_TRUE(torch::equal(got[q], input_of(q, 2, n, at::kBFloat16).view({n, 1})[ctx.rank()])) << where;
    }
    auto b = input_of(ctx.rank(), 3, 7, at::kBFloat16);
    g.broadcast(b, n - 1);
    EXPECT_TRUE(torch::equal(b, input_of(n - 1, 3, 7, at::kBFloat16))) << where;
    auto in = at::empty({9}, at::kBFloat16);
    auto send = g.isend(input_of(ctx.rank(), 4, 9, at::kBFloat16), (ctx.rank() + 1) % n);
    g.recv(in, (ctx.rank() + n - 1) % n);
    send->wait();
    EXPECT_TRUE(torch::equal(in, input_of((ctx.rank() + n - 1) % n, 4, 9, at::kBFloat16))) << where;
  });
}
