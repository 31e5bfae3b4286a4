#include "backends/dist/gather.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "backends/dist/group.h"

namespace hp::dist {

std::vector<at::Tensor> all_gather_uneven(Group& g, const at::Tensor& t, std::int64_t dim) {
  if (g.size() == 1) return {t.clone()};
  if (dim < 0) dim += t.dim();
  const auto lens = g.all_gather_list(at::full({1}, t.size(dim), at::kLong));
  std::vector<std::int64_t> lengths;
  for (const auto& l : lens) lengths.push_back(l.item<std::int64_t>());
  return all_gather_uneven(g, t, dim, lengths);
}

std::vector<at::Tensor> all_gather_uneven(Group& g, const at::Tensor& t, std::int64_t dim,
                                          const std::vector<std::int64_t>& lengths) {
  if (g.size() == 1) return {t.clone()};
  if (dim < 0) dim += t.dim();
  if (lengths.size() != static_cast<std::size_t>(g.size()) ||
      lengths[static_cast<std::size_t>(g.rank())] != t.size(dim)) {
    throw std::logic_error("internal error: all_gather_uneven on group '" + g.name() + "' got " +
                           std::to_string(lengths.size()) + " lengths for " +
                           std::to_string(g.size()) + " members, or not this member's " +
                           std::to_string(t.size(dim)) + "; please report");
  }
  // At least one element along dim, so no member sends an empty tensor.
  const std::int64_t longest =
      std::max<std::int64_t>(*std::max_element(lengths.begin(), lengths.end()), 1);
  at::Tensor padded = t.detach();
  if (t.size(dim) < longest) {
    auto shape = t.sizes().vec();
    shape[static_cast<std::size_t>(dim)] = longest - t.size(dim);
    padded = at::cat({padded, at::zeros(shape, t.options())}, dim);
  }
  auto parts = g.all_gather_list(padded.contiguous());
  for (std::size_t i = 0; i < parts.size(); ++i) parts[i] = parts[i].narrow(dim, 0, lengths[i]);
  return parts;
}

std::vector<std::string> all_gather_text(Group& g, const std::string& text) {
  if (g.size() == 1) return {text};
  at::Tensor bytes = at::empty({static_cast<std::int64_t>(text.size())}, at::kByte);
  if (!text.empty()) std::memcpy(bytes.data_ptr(), text.data(), text.size());
  std::vector<std::string> out;
  for (const auto& part : all_gather_uneven(g, bytes, 0)) {
    out.emplace_back(static_cast<const char*>(part.data_ptr()),
                     static_cast<std::size_t>(part.numel()));
  }
  return out;
}

}  // namespace hp::dist
