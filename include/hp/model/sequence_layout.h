#pragma once
// How a feature lays the positions of every sequence over ranks (context
// parallel): which pieces of the global sequence this rank holds, and the
// causal attention that reaches the keys and values of the positions other
// ranks hold. Framework code and layers use it without knowing which feature
// set it or over which mesh dimension: the trainer cuts every batch to the
// pieces before the forward, position tables and dropout masks follow the
// global positions, and the attention layer calls the layout's attention
// instead of the local causal one.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace hp {

/// `length` consecutive positions of the global sequence starting at `offset`.
struct SeqPiece {
  std::int64_t offset = 0;
  std::int64_t length = 0;
};

struct SequenceLayout {
  std::string owner;  ///< the feature that set it
  /// The global sequence is `parts` times what one rank holds.
  std::int64_t parts = 1;
  /// The pieces this rank holds of a global sequence of `global_len`
  /// positions, in the order its local tensors keep them.
  std::function<std::vector<SeqPiece>(std::int64_t global_len)> pieces;
  /// Causal attention by global position over q, k, v ([batch, local, heads,
  /// head_dim], this rank's positions in local order); returns [batch, local,
  /// heads * head_dim]. Differentiable in q, k and v. `documents` ([batch,
  /// global seq] int64 by global position, or undefined) keeps attention
  /// inside documents as block_causal_attention does.
  std::function<at::Tensor(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& documents)>
      attention;
  /// Sums `t` in place over the ranks that hold the other positions of the
  /// same samples (per-sequence statistics: a router's expert counts).
  std::function<void(at::Tensor& t)> sum;
  /// The whole sequence from every such rank's part: `x` is [samples, local,
  /// ...] in local order; returns [samples, global, ...] in global order. Not
  /// differentiable (decisions over a whole sequence: capacity).
  std::function<at::Tensor(const at::Tensor& x)> gather;
  /// What `attention` computes on this rank, for cost models (the
  /// planner): per head of one sample whose global sequence is
  /// `global_len` long, `count` score blocks of at most `size` x `size`.
  /// Unset when the attention is not computed by blocks.
  struct Blocks {
    std::int64_t size = 0;
    double count = 0;
  };
  std::function<Blocks(std::int64_t global_len)> attention_blocks;

  /// The pieces of a local sequence of `local_len` positions.
  std::vector<SeqPiece> local_pieces(std::int64_t local_len) const { return pieces(local_len * parts); }
};

/// `x` cut along `dim` to `pieces` (positions of x along dim are global
/// positions), concatenated in order.
at::Tensor take_pieces(const at::Tensor& x, std::int64_t dim, const std::vector<SeqPiece>& pieces);
/// The global positions of `pieces`, in order, as an int64 tensor.
at::Tensor piece_positions(const std::vector<SeqPiece>& pieces);
/// Local positions [begin, begin + length) of `pieces` (a rank that splits
/// its local sequence further, as sequence parallel does), as pieces.
std::vector<SeqPiece> sub_pieces(const std::vector<SeqPiece>& pieces, std::int64_t begin, std::int64_t length);

}  // namespace hp
