// The large block pool (include/hp/memory/large_pool.h) as the process's
// CPU allocator: best fit among the freed blocks, free neighbours joined,
// small requests to the allocator before it, a repeated step reusing what
// it freed, blocks freed on another thread. One process-wide allocator:
// the tests run in order in this binary of their own and measure
// differences.
#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>

#include <cstdint>
#include <thread>
#include <vector>

#include "tests/support/refused_allocation.h"
#include "hp/memory/large_pool.h"

namespace {

using hp::memory::large_block_pool_stats;

constexpr std::size_t kKiB = 1024;
constexpr std::size_t kMin = 64 * kKiB;

c10::DataPtr take(std::size_t n) { return c10::GetCPUAllocator()->allocate(n); }
std::uintptr_t at(const c10::DataPtr& p) { return reinterpret_cast<std::uintptr_t>(p.get()); }

class LargePool : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { hp::memory::use_large_block_pool(kMin); }
};

TEST_F(LargePool, SmallRequestsGoToTheAllocatorBefore) {
  ASSERT_TRUE(hp::memory::large_block_pool_installed());
  const auto before = large_block_pool_stats();
  {
    at::Tensor t = at::ones({1000}, at::kFloat);  // 4000 bytes
    EXPECT_EQ(large_block_pool_stats().in_use_bytes, before.in_use_bytes);
    EXPECT_EQ(t.sum().item<double>(), 1000.0);
    at::Tensor big = at::ones({kMin / 4}, at::kFloat);  // exactly the threshold
    EXPECT_EQ(large_block_pool_stats().in_use_bytes - before.in_use_bytes, kMin);
    EXPECT_EQ(big.sum().item<double>(), static_cast<double>(kMin / 4));
  }
  EXPECT_EQ(large_block_pool_stats().in_use_bytes, before.in_use_bytes);
}

TEST_F(LargePool, TheSmallestFreedBlockThatFitsIsTakenAndSplit) {
  // Blocks between the two freed ones keep them apart.
  auto a = take(512 * kKiB), s1 = take(kMin), b = take(256 * kKiB), s2 = take(kMin);
  const std::uintptr_t a_at = at(a), b_at = at(b);
  EXPECT_EQ(a_at % 4096, 0u);
  a.clear();
  b.clear();
  auto c = take(200 * kKiB);  // rounded to 200 KiB (whole pages): fits both, b is the smaller
  EXPECT_EQ(at(c), b_at);
  auto d = take(kMin - 100);  // below the threshold: not the pool's
  EXPECT_NE(at(d), b_at + 200 * kKiB);
  auto f = take(kMin + 1);  // rounds to 68 KiB: b's remaining 56 KiB is too small, so a's start
  EXPECT_EQ(at(f), a_at);
  auto e = take(444 * kKiB);  // what is left of a
  EXPECT_EQ(at(e), a_at + 68 * kKiB);
}

TEST_F(LargePool, FreedNeighboursAreJoined) {
  auto x = take(256 * kKiB), y = take(256 * kKiB), z = take(kMin), w = take(128 * kKiB), v = take(kMin);
  ASSERT_EQ(at(y), at(x) + 256 * kKiB) << "consecutive requests lie end to end";
  const std::uintptr_t x_at = at(x);
  y.clear();
  x.clear();  // joins y (after it)
  w.clear();
  auto joined = take(512 * kKiB);
  EXPECT_EQ(at(joined), x_at) << "x and y, freed apart, serve one request of both sizes";
}

TEST_F(LargePool, ARepeatedStepReusesWhatItFreed) {
  // A step of varied sizes with interleaved lifetimes (an MoE's buffers
  // follow the routing: the sizes change a little from step to step).
  auto step = [](int k) {
    std::vector<c10::DataPtr> held;
    for (int i = 0; i < 12; ++i) {
      held.push_back(take((64 + 48 * i + 4 * (k % 3)) * kKiB));
      if (i % 3 == 2) held.erase(held.begin() + i / 3);  // an early one freed
    }
  };
  step(0);
  step(1);
  step(2);
  const auto after_warm = large_block_pool_stats();
  for (int k = 3; k < 30; ++k) step(k);
  const auto after = large_block_pool_stats();
  EXPECT_EQ(after.touched_bytes, after_warm.touched_bytes) << "27 more steps took no fresh memory";
  EXPECT_EQ(after.in_use_bytes, after_warm.in_use_bytes);
}

TEST_F(LargePool, BlocksFreedOnAnotherThreadAreReusedAtOnce) {
  const auto before = large_block_pool_stats();
  auto p = take(300 * kKiB);
  const std::uintptr_t p_at = at(p);
  std::thread([q = std::move(p)]() mutable { q.clear(); }).join();
  EXPECT_EQ(large_block_pool_stats().in_use_bytes, before.in_use_bytes);
  auto again = take(300 * kKiB);
  EXPECT_EQ(at(again), p_at);
  // Two threads at once: every block comes back.
  auto churn = [] {
    for (int i = 0; i < 200; ++i) {
      at::Tensor t = at::empty({static_cast<std::int64_t>((64 + i % 7 * 32) * 256)}, at::kFloat);
      t.fill_(1);
    }
  };
  std::thread t1(churn), t2(churn);
  t1.join();
  t2.join();
  again.clear();
  EXPECT_EQ(large_block_pool_stats().in_use_bytes, before.in_use_bytes);
}

}  // namespace

// Address space the system will not reserve is a one-line error naming the
// bytes, the cause and the option that runs without the pool, thrown to the
// caller (not an abort): a child process under an address-space limit asks
// for more than the limit allows.
TEST_F(LargePool, AReservationTheSystemRefusesIsAnErrorNamingTheFix) {
  hp::test::expect_eight_gib_refused_with(
      "large block pool: reserving 8589934592 bytes of address space: Cannot allocate memory \\(out of address "
      "space, or vm.overcommit_memory=2 with too little commit left; run.large_block_pool=false runs without the "
      "pool\\)");
}
