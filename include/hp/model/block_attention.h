#pragma once
// Causal attention computed block by block (the FlashAttention algorithm on
// CPU with LibTorch matmuls): the forward keeps a running row maximum and sum
// per query row over key blocks and never forms the [batch, heads, seq, seq]
// scores; the backward recomputes each block's probabilities from q, k and
// the saved per-row log-sum-exp. See docs/rfc/0011-block-attention.md.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>

namespace hp {

/// Same contract as causal_attention (include/hp/model/layers.h): q, k, v are
/// [batch, seq, heads, head_dim]; returns [batch, seq, heads * head_dim].
/// `block` (>= 1) is the query and key block length; it need not divide seq.
/// Differentiable in q, k and v. `documents` ([batch, seq] int64, the
/// document number of each position, non-decreasing along a sample), when
/// defined, also hides every key of another document than its query's;
/// key blocks wholly in earlier documents are skipped.
at::Tensor block_causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  std::int64_t block, const at::Tensor& documents = at::Tensor());

/// The block step both block attention and ring attention (context
/// parallel) are made of: the online-softmax recurrence over key blocks and
/// its backward, on one head's rows. Queries are pre-scaled by 1 / sqrt(d).
namespace block_step {

/// [B, T, h, d] -> a new contiguous [B * h, T, d] (never the input's storage).
at::Tensor to_rows(const at::Tensor& x);

/// Runs f(bh) for every head row bh in [0, BH), heads split over the
/// intra-op threads (one parallel region, not one per small matmul); each
/// head runs on one thread with single-threaded ops, so the numbers do not
/// depend on the thread count. Autograd is off inside.
void for_each_head(std::int64_t BH, const std::function<void(std::int64_t)>& f);

/// Running row maximum [rows, 1], row sum [rows, 1] and unnormalised output
/// [rows, d] of some query rows; undefined before the first block.
struct OnlineSoftmax {
  at::Tensor m, l, acc;
};

/// Adds key block k, v ([cols, d]) to the state of query rows qs ([rows, d]):
/// scores qs k^T, masked to -inf where `mask` ([rows, cols], true = hidden;
/// undefined: nothing hidden) is set. Every row must see at least one key,
/// unless `rows_may_be_hidden` (documents: a row may see none of a block;
/// its state stays empty until a block it sees, and every row sees its own
/// position in some block).
void add_block(OnlineSoftmax& st, const at::Tensor& qs, const at::Tensor& k, const at::Tensor& v,
               const at::Tensor& mask, bool rows_may_be_hidden = false);

/// Documents handed to an autograd function as a plain argument: an
/// undefined tensor argument is refused by LibTorch's autograd functions,
/// and the documents take no gradient.
struct DocumentsArg {
  at::Tensor t;
};

/// The document part of a block of one sample: queries at positions [q0,
/// q0 + rows), keys at [k0, k0 + cols) of `docs` ([seq] int64, contiguous,
/// non-decreasing). False when every key lies in an earlier document than
/// every query (nothing to add: skip the block). Otherwise, when the block
/// spans more than one document, `mask` becomes mask | (documents differ).
bool document_block(const at::Tensor& docs, std::int64_t q0, std::int64_t rows, std::int64_t k0, std::int64_t cols,
                    at::Tensor& mask);

/// Writes acc / l into `out` ([rows, d]) and m + log l into `lse` ([rows]).
void finish(const OnlineSoftmax& st, at::Tensor out, at::Tensor lse);

/// One block's share of the backward: with P = exp(qs k^T (masked) - lse),
/// dv += P^T dout, dS = P * (dout v^T - D), dq += dS k, dk += dS^T qs (dq
/// still to be scaled by 1 / sqrt(d)). `lse` and `D` = rowsum(dout * out)
/// are [rows, 1].
void backward_block(const at::Tensor& qs, const at::Tensor& k, const at::Tensor& v, const at::Tensor& dout,
                    const at::Tensor& lse, const at::Tensor& D, const at::Tensor& mask, at::Tensor dq,
                    at::Tensor dk, at::Tensor dv);

}  // namespace block_step

/// model.attention_auto_seq's default: the shortest sequence at which
/// model.attention: auto picks block attention (the measured crossover,
/// docs/rfc/0011-block-attention.md section 9.1).
constexpr std::int64_t kAutoBlockSeq = 512;

/// The attention path of model.attention = `option` ("auto", "eager" or
/// "block") at sequence length `seq`: "auto" is "block" when seq >=
/// `auto_seq`, else "eager"; the others are themselves.
std::string resolve_attention(const std::string& option, std::int64_t seq, std::int64_t auto_seq);

}  // namespace hp
