#pragma once
// Ring attention over the context-parallel group with the balanced causal
// split: the sequence is cut into 2 x cp chunks and member r holds chunks r
// and 2 cp - 1 - r. Keys and values go round the ring (posted one step
// ahead of use), each member adds the blocks its queries may see to an
// online softmax (include/hp/model/block_attention.h, block_step), and in
// backward the key and value gradients travel round the ring with them
// back to their owner. See docs/rfc/0012-context-parallel.md.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "hp/model/sequence_layout.h"

namespace hp::dist {
class Group;
}

namespace hp::context_parallel {

/// The pieces of a sequence of `global_len` positions (divisible by 2 x
/// parts) that member `index` of `parts` holds: chunk index, then chunk
/// 2 parts - 1 - index.
std::vector<SeqPiece> balanced_pieces(std::int64_t global_len, int parts, int index);

/// The whole sequences of `group` from every member's part: `x` is
/// [samples, local, ...] holding this member's balanced_pieces in order;
/// returns [samples, local x members, ...] in global order. Not
/// differentiable.
at::Tensor gather_sequence(const at::Tensor& x, dist::Group& group);

/// Causal attention by global position: q, k, v [batch, local, heads,
/// head_dim] hold this member's two chunks (balanced_pieces); returns
/// [batch, local, heads * head_dim]. Each chunk is cut into query and key
/// blocks of `block` positions (the last may be shorter), so no score
/// matrix is larger than block x block. Differentiable in q, k and v; every
/// member of `group` must call it at the same time with the same shapes.
/// `documents` ([batch, global seq] int64 by global position), when
/// defined, keeps attention inside documents (block_step::document_block).
at::Tensor ring_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, dist::Group& group,
                          std::int64_t block = 128, const at::Tensor& documents = at::Tensor());

/// Where this process's ring attention spent its time since the last call
/// (forward and backward): computing blocks, and waiting for a ring message
/// that had not arrived yet. Resets them.
struct RingTimes {
  double compute_seconds = 0, wait_seconds = 0;
  std::int64_t steps = 0;
  /// Score blocks of one head computed, forward and backward (what
  /// SequenceLayout::attention_blocks counts per pass), over every thread.
  std::int64_t blocks = 0;
};
RingTimes take_ring_times();

/// The sequence layout of member group.rank() of `group`: balanced pieces,
/// ring attention, sums and gathers over `group` (which must outlive it).
SequenceLayout balanced_layout(dist::Group& group, std::int64_t block = 128);

}  // namespace hp::context_parallel
