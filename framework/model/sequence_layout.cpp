#include "hp/model/sequence_layout.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <stdexcept>
#include <string>

namespace hp {

at::Tensor take_pieces(const at::Tensor& x, std::int64_t dim, const std::vector<SeqPiece>& pieces) {
  std::vector<at::Tensor> parts;
  parts.reserve(pieces.size());
  for (const auto& p : pieces) {
    if (p.offset < 0 || p.offset + p.length > x.size(dim)) {
      throw std::invalid_argument("take_pieces: piece [" + std::to_string(p.offset) + ", " +
                                  std::to_string(p.offset + p.length) + ") is outside a sequence of " +
                                  std::to_string(x.size(dim)) + " positions");
    }
    parts.push_back(x.narrow(dim, p.offset, p.length));
  }
  return parts.size() == 1 ? parts[0].contiguous() : at::cat(parts, dim);
}

at::Tensor piece_positions(const std::vector<SeqPiece>& pieces) {
  std::vector<at::Tensor> parts;
  for (const auto& p : pieces) parts.push_back(at::arange(p.offset, p.offset + p.length, at::kLong));
  return parts.empty() ? at::empty({0}, at::kLong) : at::cat(parts);
}

std::vector<SeqPiece> sub_pieces(const std::vector<SeqPiece>& pieces, std::int64_t begin, std::int64_t length) {
  std::vector<SeqPiece> out;
  std::int64_t local = 0;  // local position where the current piece starts
  const std::int64_t end = begin + length;
  for (const auto& p : pieces) {
    const auto lo = std::max(begin, local), hi = std::min(end, local + p.length);
    if (lo < hi) out.push_back({p.offset + (lo - local), hi - lo});
    local += p.length;
  }
  return out;
}

}  // namespace hp
