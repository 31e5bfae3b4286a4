#pragma once
// Gathering tensors whose lengths differ between the members of a group
// (uneven shards, texts): Gloo's all-gather needs equal shapes, so every
// tensor is padded with zeros to the longest, gathered with one all-gather
// and trimmed back. The one implementation of that; checkpoint gathers,
// zero's parameter all-gather and the exchange of names all use it.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace hp::dist {

class Group;
class Work;

/// An uneven all-gather in flight (all_gather_uneven_async): wait() gives
/// every member's tensor in member order, trimmed to its length.
class UnevenGather {
 public:
  UnevenGather(std::unique_ptr<Work> work, std::vector<std::int64_t> lengths, std::int64_t dim, std::int64_t longest);
  UnevenGather(UnevenGather&&) noexcept;
  UnevenGather& operator=(UnevenGather&&) noexcept;
  ~UnevenGather();
  std::vector<at::Tensor> wait();

 private:
  std::unique_ptr<Work> work_;
  std::vector<std::int64_t> lengths_;
  std::int64_t dim_ = 0, longest_ = 0;
};

/// Every member's `t`, in member order, where the members' tensors may
/// differ in length along `dim` (every other dimension equal). The lengths
/// are exchanged first (one all-gather of one number each). Collective over
/// `g`; a group of one returns a copy of `t`.
std::vector<at::Tensor> all_gather_uneven(Group& g, const at::Tensor& t, std::int64_t dim = 0);

/// Same when every member already knows each member's length along `dim`
/// (`lengths[m]`, one per member): no exchange of lengths.
std::vector<at::Tensor> all_gather_uneven(Group& g, const at::Tensor& t, std::int64_t dim,
                                          const std::vector<std::int64_t>& lengths);
/// The same, started: the collective is issued now and completes in the
/// background (the blocking form is this, waited).
UnevenGather all_gather_uneven_async(Group& g, const at::Tensor& t, std::int64_t dim,
                                     const std::vector<std::int64_t>& lengths);

/// Every member's `text`, in member order (the texts may differ in length).
std::vector<std::string> all_gather_text(Group& g, const std::string& text);

}  // namespace hp::dist
