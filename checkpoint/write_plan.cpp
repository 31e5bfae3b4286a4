#include "hp/checkpoint/write_plan.h"

#include <algorithm>
#include <map>
#include <sstream>
#include <stdexcept>

namespace hp::ckpt {

std::vector<std::vector<std::size_t>> plan_writers(const std::vector<std::vector<SliceDesc>>& by_rank) {
  struct Holders {
    std::uint64_t bytes = 0;
    std::vector<std::pair<std::size_t, std::size_t>> at;  ///< (rank, index in its list), rank order
  };
  std::map<std::string, Holders> slices;
  for (std::size_t r = 0; r < by_rank.size(); ++r) {
    for (std::size_t i = 0; i < by_rank[r].size(); ++i) {
      const auto& s = by_rank[r][i];
      auto [it, fresh] = slices.try_emplace(s.key);
      if (fresh) {
        it->second.bytes = s.bytes;
      } else if (it->second.bytes != s.bytes) {
        throw std::invalid_argument("slice " + s.key + " is " + std::to_string(it->second.bytes) + " bytes on rank " +
                                    std::to_string(it->second.at.front().first) + " but " + std::to_string(s.bytes) +
                                    " on rank " + std::to_string(r) + ": the ranks disagree about a tensor's shape");
      }
      it->second.at.emplace_back(r, i);
    }
  }
  std::vector<const std::pair<const std::string, Holders>*> order;
  for (const auto& entry : slices) order.push_back(&entry);
  std::stable_sort(order.begin(), order.end(),
                   [](const auto* a, const auto* b) { return a->second.bytes > b->second.bytes; });
  std::vector<std::uint64_t> load(by_rank.size(), 0);
  std::vector<std::vector<std::size_t>> plan(by_rank.size());
  for (const auto* entry : order) {
    const auto& holders = entry->second.at;
    auto best = holders.front();
    for (const auto& h : holders) {
      if (load[h.first] < load[best.first]) best = h;  // ties keep the lower rank
    }
    load[best.first] += entry->second.bytes;
    plan[best.first].push_back(best.second);
  }
  for (auto& p : plan) std::sort(p.begin(), p.end());
  return plan;
}

namespace {
std::string box_text(const std::vector<std::int64_t>& v) {
  std::string out;
  for (std::size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + std::to_string(v[i]);
  return out;
}
}  // namespace

std::string slice_key(const std::string& name, const std::vector<std::int64_t>& offsets,
                      const std::vector<std::int64_t>& lengths) {
  return name + "@" + box_text(offsets) + "/" + box_text(lengths);
}

std::vector<std::uint64_t> bytes_per_rank(const std::vector<std::vector<SliceDesc>>& by_rank,
                                          const std::vector<std::vector<std::size_t>>& plan) {
  std::vector<std::uint64_t> out(by_rank.size(), 0);
  for (std::size_t r = 0; r < plan.size() && r < by_rank.size(); ++r) {
    for (auto i : plan[r]) out[r] += by_rank[r].at(i).bytes;
  }
  return out;
}

std::string encode_slices(const std::vector<SliceDesc>& slices) {
  std::string out;
  for (const auto& s : slices) {
    if (s.key.find_first_of("\t\n") != std::string::npos) {
      throw std::invalid_argument("slice key '" + s.key + "' holds a tab or a newline");
    }
    out += std::to_string(s.bytes) + "\t" + s.key + "\n";
  }
  return out;
}

std::vector<SliceDesc> decode_slices(const std::string& text) {
  std::vector<SliceDesc> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const auto tab = line.find('\t');
    if (tab == std::string::npos || tab == 0) throw std::invalid_argument("malformed slice line '" + line + "'");
    out.push_back({line.substr(tab + 1), std::stoull(line.substr(0, tab))});
  }
  return out;
}

}  // namespace hp::ckpt
