#include "hp/comm/placement.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <stdexcept>

#include "hp/comm/mesh.h"

namespace hp::dist {

std::string Placement::str() const {
  switch (kind) {
    case Kind::kReplicate: return "R";
    case Kind::kShard: return "S(" + std::to_string(dim) + ")";
    case Kind::kHeadTail: return "HT(" + std::to_string(dim) + ")";
    case Kind::kPartial: return "P";
  }
  return "?";
}

bool Placement::parse(const std::string& text, Placement& out) {
  if (text == "R") return out = replicate(), true;
  if (text == "P") return out = partial(), true;
  for (auto [prefix, kind] : {std::pair<const char*, Kind>{"S(", Kind::kShard}, {"HT(", Kind::kHeadTail}}) {
    const std::string p = prefix;
    if (text.size() > p.size() + 1 && text.compare(0, p.size(), p) == 0 && text.back() == ')') {
      const std::string digits = text.substr(p.size(), text.size() - p.size() - 1);
      if (digits.empty() || digits.size() > 3 ||
          !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        return false;
      }
      out = {kind, std::stoi(digits)};
      return true;
    }
  }
  return false;
}

std::string describe(const Placements& placements) {
  if (placements.empty()) return "replicated";
  std::string out;
  for (const auto& p : placements) out += (out.empty() ? "" : " ") + p.dim + ":" + p.placement.str();
  return out;
}

std::vector<std::string> shard_dims(const Placements& placements) {
  std::vector<std::string> out;
  for (const auto& p : placements) {
    if (p.placement.shards()) out.push_back(p.dim);
  }
  return out;
}

std::vector<MeshCoord> coords_of(const ProcessMesh& mesh, const Placements& placements, int rank) {
  std::vector<MeshCoord> out;
  for (const auto& p : placements) {
    const int n = mesh.group_size(p.dim);
    if (n == 0) {
      throw std::invalid_argument("a placement names mesh dimension '" + p.dim + "', which this mesh (" +
                                  mesh.shape() + ") does not have");
    }
    out.push_back({n, mesh.group_index(p.dim, rank)});
  }
  return out;
}

std::vector<std::int64_t> Part::local_shape() const {
  auto s = boxes.at(0).lengths;
  if (cat_dim >= 0) {
    std::int64_t n = 0;
    for (const auto& b : boxes) n += b.lengths[static_cast<std::size_t>(cat_dim)];
    s[static_cast<std::size_t>(cat_dim)] = n;
  }
  return s;
}

namespace {

/// [offset, offset + length) of the pieces concatenated along `d`.
std::vector<Box> take_range(const std::vector<Box>& pieces, std::size_t d, std::int64_t offset,
                            std::int64_t length) {
  std::vector<Box> out;
  std::int64_t pos = 0;
  for (const auto& b : pieces) {
    const std::int64_t lo = std::max(offset, pos), hi = std::min(offset + length, pos + b.lengths[d]);
    if (hi > lo) {
      Box s = b;
      s.offsets[d] = b.offsets[d] + (lo - pos);
      s.lengths[d] = hi - lo;
      out.push_back(std::move(s));
    }
    pos += b.lengths[d];
  }
  if (out.empty()) {  // an empty part (more parts than elements): one empty box
    Box s = pieces.front();
    s.lengths[d] = 0;
    out.push_back(std::move(s));
  }
  return out;
}

std::int64_t extent(const std::vector<Box>& pieces, std::size_t d, bool concatenated) {
  if (!concatenated) return pieces.front().lengths[d];
  std::int64_t n = 0;
  for (const auto& b : pieces) n += b.lengths[d];
  return n;
}

}  // namespace

Part part_of(const std::vector<std::int64_t>& shape, const Placements& placements,
             const std::vector<MeshCoord>& coords) {
  if (coords.size() != placements.size()) {
    throw std::invalid_argument("part_of: " + std::to_string(coords.size()) + " coordinates for " +
                                std::to_string(placements.size()) + " placements");
  }
  Part part;
  part.boxes.push_back(Box{std::vector<std::int64_t>(shape.size(), 0), shape});
  const auto ndim = static_cast<int>(shape.size());
  for (std::size_t i = 0; i < placements.size(); ++i) {
    const Placement& p = placements[i].placement;
    const MeshCoord c = coords[i];
    if (p.kind == Placement::Kind::kReplicate) continue;
    if (p.kind == Placement::Kind::kPartial) {
      part.partial = true;
      part.partial_zero = part.partial_zero || c.index != 0;
      continue;
    }
    if (p.dim < 0 || p.dim >= ndim) {
      throw std::invalid_argument("placement " + placements[i].dim + ":" + p.str() + " cuts dimension " +
                                  std::to_string(p.dim) + " of a " + std::to_string(ndim) + "-dimensional tensor");
    }
    if (c.size == 1) continue;
    const auto d = static_cast<std::size_t>(p.dim);
    const bool along_cat = part.cat_dim == p.dim;
    const std::int64_t total = extent(part.boxes, d, along_cat);
    if (p.kind == Placement::Kind::kShard) {
      const auto [off, len] = split_range(total, c.size, c.index);
      if (along_cat) {
        part.boxes = take_range(part.boxes, d, off, len);
      } else {
        for (auto& b : part.boxes) {
          b.offsets[d] += off;
          b.lengths[d] = len;
        }
      }
      continue;
    }
    // Head-tail: chunks index and 2n - 1 - index of 2n.
    if (part.cat_dim >= 0 && !along_cat) {
      throw std::invalid_argument("placement " + placements[i].dim + ":" + p.str() +
                                  ": head-tail on a second tensor dimension (already on " +
                                  std::to_string(part.cat_dim) + ")");
    }
    const auto [o1, l1] = split_range(total, 2 * c.size, c.index);
    const auto [o2, l2] = split_range(total, 2 * c.size, 2 * c.size - 1 - c.index);
    std::vector<Box> head = take_range(part.boxes, d, o1, l1);
    std::vector<Box> tail = take_range(part.boxes, d, o2, l2);
    head.insert(head.end(), tail.begin(), tail.end());
    part.boxes = std::move(head);
    part.cat_dim = p.dim;
  }
  return part;
}

at::Tensor cut(const at::Tensor& full, const Part& part) {
  if (part.partial_zero) return at::zeros(part.local_shape(), full.options());
  if (part.boxes.size() == 1) return slice_of(full, part.boxes[0]).clone(at::MemoryFormat::Contiguous);
  std::vector<at::Tensor> pieces;
  for (const auto& b : part.boxes) pieces.push_back(slice_of(full, b));
  return at::cat(pieces, part.cat_dim);
}

void place(at::Tensor& full, const at::Tensor& local, const Part& part) {
  std::int64_t pos = 0;
  for (const auto& b : part.boxes) {
    at::Tensor piece = local;
    if (part.cat_dim >= 0) {
      const auto len = b.lengths[static_cast<std::size_t>(part.cat_dim)];
      piece = local.narrow(part.cat_dim, pos, len);
      pos += len;
    }
    at::Tensor dst = slice_of(full, b);
    if (part.partial) {
      dst.add_(piece);
    } else {
      dst.copy_(piece);
    }
  }
}

}  // namespace hp::dist
