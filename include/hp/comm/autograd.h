#pragma once
// Collectives that autograd can differentiate, as the parallel layers need
// them. Each pairs a forward op with its mirror in backward:
//   copy_to_group        identity            | all-reduce (sum) of the gradient
//   reduce_from_group    all-reduce (sum)    | identity
//   scatter_to_group     keep own chunk      | all-gather along dim
//   gather_from_group    all-gather along dim| keep own chunk
//   reduce_scatter_to_group  reduce-scatter  | all-gather      (sequence parallel)
//   all_gather_from_group    all-gather      | reduce-scatter  (sequence parallel)
//   all_to_all           rows by counts      | all-to-all with the counts swapped
// The group must outlive the autograd graph that uses it.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace hp::dist {

class Group;

at::Tensor copy_to_group(const at::Tensor& x, Group& g);
at::Tensor reduce_from_group(const at::Tensor& x, Group& g);
at::Tensor scatter_to_group(const at::Tensor& x, Group& g, std::int64_t dim);
at::Tensor gather_from_group(const at::Tensor& x, Group& g, std::int64_t dim);
at::Tensor reduce_scatter_to_group(const at::Tensor& x, Group& g, std::int64_t dim);
at::Tensor all_gather_from_group(const at::Tensor& x, Group& g, std::int64_t dim);
at::Tensor all_to_all(const at::Tensor& x, Group& g, const std::vector<std::int64_t>& send_counts,
                      const std::vector<std::int64_t>& recv_counts);

}  // namespace hp::dist
