#pragma once
// Causal attention computed block by block (the FlashAttention algorithm on
// CPU with LibTorch matmuls): the forward keeps a running row maximum and sum
// per query row over key blocks and never forms the [batch, heads, seq, seq]
// scores; the backward recomputes each block's probabilities from q, k and
// the saved per-row log-sum-exp. See docs/rfc/0011-block-attention.md.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

namespace hp {

/// Same contract as causal_attention (framework/model/layers.h): q, k, v are
/// [batch, seq, heads, head_dim]; returns [batch, seq, heads * head_dim].
/// `block` (>= 1) is the query and key block length; it need not divide seq.
/// Differentiable in q, k and v.
at::Tensor block_causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  std::int64_t block);

/// model.attention_auto_seq's default: the shortest sequence at which
/// model.attention: auto picks block attention (the measured crossover,
/// docs/rfc/0011-block-attention.md section 9.1).
constexpr std::int64_t kAutoBlockSeq = 512;

/// The attention path of model.attention = `option` ("auto", "eager" or
/// "block") at sequence length `seq`: "auto" is "block" when seq >=
/// `auto_seq`, else "eager"; the others are themselves.
std::string resolve_attention(const std::string& option, std::int64_t seq, std::int64_t auto_seq);

}  // namespace hp
