// Sum of squares of a tensor's elements in double, in one pass over the data.
#pragma once

namespace at {
class Tensor;
}

namespace hp {

/// sum(x^2) accumulated in double. Float tensors (contiguous or not) take one
/// read pass with no temporary: fixed chunks of 64 Ki elements summed on
/// the intra-op threads, each with eight running sums, the chunk sums added
/// in order, so the result depends only on the data and the element count,
/// never on the thread count. Other dtypes: x.to(double).pow(2).sum().
double sum_of_squares(const at::Tensor& x);

}  // namespace hp
