// The block cache (include/hp/memory/block_cache.h) as the process's CPU
// allocator: large blocks reused by size class (eight per doubling), small ones to the allocator
// before it, the cap on what it keeps, the per-step trim, and c10's raw
// allocate / deallocate. One process-wide allocator: the tests run in order
// in this binary of their own and measure differences.
#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>

#include "tests/support/refused_allocation.h"
#include "hp/memory/block_cache.h"

namespace {

using hp::memory::block_cache_stats;

constexpr std::size_t kMiB = 1 << 20;

class BlockCache : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { hp::memory::use_block_cache(kMiB, 64 * kMiB); }
  void SetUp() override { hp::memory::release_block_cache(); }
};

TEST_F(BlockCache, ALargeBlockFreedIsReusedForItsSizeClassAndOnlyThat) {
  ASSERT_TRUE(hp::memory::block_cache_installed());
  const auto before = block_cache_stats();
  void* first = nullptr;
  {
    // 3 MiB + 20 bytes: between 2 and 4 MiB the classes are 256 KiB apart.
    at::Tensor t = at::empty({3 * 1024 * 1024 / 4 + 5}, at::kFloat);
    first = t.data_ptr();
    EXPECT_EQ(block_cache_stats().in_use_bytes - before.in_use_bytes, 3 * kMiB + 256 * 1024);
    EXPECT_EQ(block_cache_stats().maps - before.maps, 1u);
    t.fill_(7);
  }
  EXPECT_EQ(block_cache_stats().in_use_bytes, before.in_use_bytes);
  EXPECT_EQ(block_cache_stats().cached_bytes - before.cached_bytes, 3 * kMiB + 256 * 1024);
  {
    // Another size of the same class (an MoE's buffers follow the routing).
    at::Tensor same = at::empty({(3 * 1024 + 200) * 1024 / 4}, at::kFloat);
    EXPECT_EQ(same.data_ptr(), first) << "the freed block of the same class is handed out again";
    EXPECT_EQ(block_cache_stats().reuses - before.reuses, 1u);
    same.fill_(2);
    EXPECT_EQ(same.sum().item<double>(), 2.0 * (3 * 1024 + 200) * 1024 / 4);
    at::Tensor other = at::empty({2 * 1024 * 1024 / 4}, at::kFloat);
    EXPECT_NE(other.data_ptr(), first);
    EXPECT_EQ(block_cache_stats().maps - before.maps, 2u) << "another class is mapped anew";
    other.fill_(1.5);
    EXPECT_EQ(other.sum().item<double>(), 1.5 * 2 * 1024 * 1024 / 4);
  }
}

TEST_F(BlockCache, SmallBlocksGoToTheAllocatorBefore) {
  const auto before = block_cache_stats();
  {
    at::Tensor t = at::ones({1000}, at::kFloat);
    EXPECT_EQ(block_cache_stats().in_use_bytes, before.in_use_bytes);
    EXPECT_EQ(t.sum().item<float>(), 1000.0f);
  }
  EXPECT_EQ(block_cache_stats().maps, before.maps);
  EXPECT_EQ(block_cache_stats().cached_bytes, before.cached_bytes);
}

TEST_F(BlockCache, KeepsAtMostItsCapOfFreedBlocksTheOldestUnmappedFirst) {
  const auto before = block_cache_stats();
  {
    // Five 20 MiB blocks freed in order: a 64 MiB cap keeps the last three.
    std::vector<at::Tensor> ts;
    for (int i = 0; i < 5; ++i) ts.push_back(at::empty({20 * 1024 * 1024 / 4}, at::kFloat));
    std::vector<void*> ptrs;
    for (auto& t : ts) ptrs.push_back(t.data_ptr());
    ts.clear();
    EXPECT_EQ(block_cache_stats().cached_bytes, 60 * kMiB);
    EXPECT_EQ(block_cache_stats().evictions - before.evictions, 2u);
    // What is handed out again is one of the three kept (freed last).
    at::Tensor again = at::empty({20 * 1024 * 1024 / 4}, at::kFloat);
    EXPECT_TRUE(again.data_ptr() == ptrs[2] || again.data_ptr() == ptrs[3] || again.data_ptr() == ptrs[4]);
  }
}

TEST_F(BlockCache, TrimGivesBackWhatAWholeIntervalDidNotAskFor) {
  {
    at::Tensor a = at::empty({5 * 1024 * 1024 / 4}, at::kFloat);
    at::Tensor b = at::empty({6 * 1024 * 1024 / 4}, at::kFloat);
  }
  ASSERT_EQ(block_cache_stats().cached_bytes, 11 * kMiB);
  hp::memory::trim_block_cache();  // the interval they were freed in: both kept
  EXPECT_EQ(block_cache_stats().cached_bytes, 11 * kMiB);
  { at::Tensor a = at::empty({5 * 1024 * 1024 / 4}, at::kFloat); }  // the 5 MiB one is asked for again
  hp::memory::trim_block_cache();  // the 6 MiB one stayed free all interval
  EXPECT_EQ(block_cache_stats().cached_bytes, 5 * kMiB);
  hp::memory::release_block_cache();
  EXPECT_EQ(block_cache_stats().cached_bytes, 0u);
}

TEST_F(BlockCache, RawAllocateAndDeallocateWorkForLargeAndSmallBlocks) {
  c10::Allocator* a = c10::GetCPUAllocator();
  const auto before = block_cache_stats();
  void* big = a->raw_allocate(4 * kMiB);
  void* small = a->raw_allocate(100);
  EXPECT_EQ(block_cache_stats().in_use_bytes - before.in_use_bytes, 4 * kMiB);
  static_cast<char*>(big)[4 * kMiB - 1] = 1;
  static_cast<char*>(small)[99] = 1;
  a->raw_deallocate(big);
  a->raw_deallocate(small);
  EXPECT_EQ(block_cache_stats().in_use_bytes, before.in_use_bytes);
  EXPECT_EQ(block_cache_stats().cached_bytes - before.cached_bytes, 4 * kMiB);
}

}  // namespace

// A block the system will not map is a one-line error naming the size and
// the cause, thrown to the caller (not an abort): a child process under an
// address-space limit asks for more than the limit allows.
TEST_F(BlockCache, AMappingTheSystemRefusesIsAnErrorNamingTheSize) {
  hp::test::expect_eight_gib_refused_with(
      "block cache: mapping 8589934592 bytes: Cannot allocate memory \\(out of memory or address space\\)");
}
