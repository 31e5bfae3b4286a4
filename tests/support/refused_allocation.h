#pragma once
// A death test shared by the CPU allocators' tests: a child process under
// a 4 GiB address-space limit asks for an 8 GiB tensor; the allocator must
// throw (not abort) with a one-line message matching `pattern` (a gtest
// regex), which the child prints before exiting 0.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

namespace hp::test {

inline void expect_eight_gib_refused_with(const std::string& pattern) {
  EXPECT_EXIT(
      {
        struct rlimit limit;
        getrlimit(RLIMIT_AS, &limit);
        limit.rlim_cur = std::size_t{4} << 30;  // 4 GiB of address space
        setrlimit(RLIMIT_AS, &limit);
        try {
          at::Tensor t = at::empty({std::int64_t{2} << 30}, at::kFloat);  // 8 GiB
          std::fprintf(stderr, "allocated\n");
          std::exit(1);
        } catch (const std::exception& e) {
          std::fprintf(stderr, "%s\n", e.what());
          std::exit(0);
        }
      },
      ::testing::ExitedWithCode(0), pattern);
}

}  // namespace hp::test
