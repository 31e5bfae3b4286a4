// include/hp/comm/slice.h: the one cut of a global tensor into the ranks'
// slices. Cutting along every dimension into 1 to 4 parts, even and uneven,
// and concatenating the parts back is bitwise the identity; the ranges tile
// the dimension in order.
#include "hp/comm/slice.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace {

TEST(Slice, CutAndReassembleIsTheIdentityOnEveryDimension) {
  auto gen = torch::make_generator<at::CPUGeneratorImpl>(7);
  const std::vector<int64_t> shape{5, 4,
                                   3};  // 5 and 3 cut unevenly by 2 and 4, 4 evenly by 2 and 4
  const auto full = torch::randn(shape, gen);
  for (int dim = 0; dim < 3; ++dim) {
    for (int64_t parts = 1; parts <= 4; ++parts) {
      std::vector<torch::Tensor> pieces;
      int64_t next = 0;
      for (int64_t i = 0; i < parts; ++i) {
        const auto [off, len] = hp::dist::split_range(shape[dim], parts, i);
        EXPECT_EQ(off, next) << "dim " << dim << ", part " << i << " of " << parts;
        next += len;
        hp::dist::Box box{std::vector<int64_t>(shape.size(), 0), shape};
        box.offsets[dim] = off;
        box.lengths[dim] = len;
        pieces.push_back(hp::dist::slice_of(full, box));
      }
      EXPECT_EQ(next, shape[dim]);
      EXPECT_TRUE(torch::equal(torch::cat(pieces, dim), full))
          << "dim " << dim << ", " << parts << " parts";
    }
  }
}

TEST(Slice, UnevenPartsPutTheLongerOnesFirst) {
  using Range = std::pair<int64_t, int64_t>;
  // 5 over 3: 2, 2, 1 (as the trainer cuts a tensor-parallel parameter).
  EXPECT_EQ(hp::dist::split_range(5, 3, 0), (Range{0, 2}));
  EXPECT_EQ(hp::dist::split_range(5, 3, 1), (Range{2, 2}));
  EXPECT_EQ(hp::dist::split_range(5, 3, 2), (Range{4, 1}));
}

}  // namespace
