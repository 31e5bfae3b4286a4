#include "hp/comm/gather.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <utility>

#include "hp/comm/group.h"

namespace hp::dist {

std::vector<at::Tensor> all_gather_uneven(Group& g, const at::Tensor& t, std::int64_t dim) {
  if (g.size() == 1) return {t.clone()};
  if (dim < 0) dim += t.dim();
  const auto lens = g.all_gather_list(at::full({1}, t.size(dim), at::kLong));
  std::vector<std::int64_t> lengths;
  for (const auto& l : lens) lengths.push_back(l.item<std::int64_t>());
  return all_gather_uneven(g, t, dim, lengths);
}

UnevenGather::UnevenGather(std::unique_ptr<Work> work, std::vector<std::int64_t> lengths, std::int64_t dim,
                           std::int64_t longest)
    : work_(std::move(work)), lengths_(std::move(lengths)), dim_(dim), longest_(longest) {}
UnevenGather::UnevenGather(UnevenGather&&) noexcept = default;
UnevenGather& UnevenGather::operator=(UnevenGather&&) noexcept = default;
UnevenGather::~UnevenGather() = default;

std::vector<at::Tensor> UnevenGather::wait() {
  const at::Tensor all = work_->wait();
  std::vector<at::Tensor> parts;
  if (lengths_.size() == 1) return {all};
  for (std::size_t i = 0; i < lengths_.size(); ++i) {
    parts.push_back(all.narrow(dim_, static_cast<std::int64_t>(i) * longest_, lengths_[i]));
  }
  return parts;
}

namespace {

/// `t` padded with zeros along `dim` to the longest member's length (at
/// least one element, so no member sends an empty tensor), and that length.
std::pair<at::Tensor, std::int64_t> padded_to_longest(Group& g, const at::Tensor& t, std::int64_t dim,
                                                      const std::vector<std::int64_t>& lengths) {
  if (lengths.size() != static_cast<std::size_t>(g.size()) ||
      lengths[static_cast<std::size_t>(g.rank())] != t.size(dim)) {
    throw std::logic_error("internal error: all_gather_uneven on group '" + g.name() + "' got " +
                           std::to_string(lengths.size()) + " lengths for " +
                           std::to_string(g.size()) + " members, or not this member's " +
                           std::to_string(t.size(dim)) + "; please report");
  }
  const std::int64_t longest =
      std::max<std::int64_t>(*std::max_element(lengths.begin(), lengths.end()), 1);
  at::Tensor padded = t.detach();
  if (t.size(dim) < longest) {
    auto shape = t.sizes().vec();
    shape[static_cast<std::size_t>(dim)] = longest - t.size(dim);
    padded = at::cat({padded, at::zeros(shape, t.options())}, dim);
  }
  return {padded.contiguous(), longest};
}

}  // namespace

std::vector<at::Tensor> all_gather_uneven(Group& g, const at::Tensor& t, std::int64_t dim,
                                          const std::vector<std::int64_t>& lengths) {
  if (g.size() == 1) return {t.clone()};
  if (dim < 0) dim += t.dim();
  // Gathered as a list (no concatenated copy: checkpoint gathers are large).
  auto parts = g.all_gather_list(padded_to_longest(g, t, dim, lengths).first);
  for (std::size_t i = 0; i < parts.size(); ++i) parts[i] = parts[i].narrow(dim, 0, lengths[i]);
  return parts;
}

UnevenGather all_gather_uneven_async(Group& g, const at::Tensor& t, std::int64_t dim,
                                     const std::vector<std::int64_t>& lengths) {
  if (dim < 0) dim += t.dim();
  if (g.size() == 1) return UnevenGather(g.all_gather_async(t.detach(), dim), lengths, dim, t.size(dim));
  auto [padded, longest] = padded_to_longest(g, t, dim, lengths);
  return UnevenGather(g.all_gather_async(padded, dim), lengths, dim, longest);
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
