#!/usr/bin/env python3
"""An independent Llama-family decoder in PyTorch, written from the published
definitions, against one hyperparallel process.

reference.py HF_DIR RUN_DIR STEP

HF_DIR holds config.json and model.safetensors as `hp-ckpt export --to-hf`
wrote them from the checkpoint taken just before STEP (the weights STEP
starts from). RUN_DIR is the run that went on: its metrics.jsonl has STEP's
loss, grads_stepSTEP/ its gradients (after the reduction, before clipping)
and activations_stepSTEP/ the step's batch ("batch:tokens@sN",
"batch:labels@sN" per micro-batch). The model here:
  RMSNorm        x / sqrt(mean(x^2) + eps) * g
  rotary (RoPE)  rotate-half: x cos + rotate_half(x) sin, angle_i = pos * theta^(-2i/d),
                 the second half of the features repeating the first half's angles
  attention      grouped-query: query head j reads key/value head j // (heads / kv_heads);
                 causal softmax(q k^T / sqrt(d)) v; optional per-head RMSNorm of q, k (Qwen3)
  SwiGLU FFN     down(silu(gate x) * up x)
  MoE (Mixtral)  softmax router, top-k, the k weights renormalised, experts summed
The loss is the mean cross entropy over every token of the global batch.
Passes when the loss is within 1e-6 relative of the run's and every gradient
within 1e-5 (max |a - b| / max |b|) of the run's, as the run names them."""
import json
import math
import struct
import sys

import torch


def read_safetensors(path):
    """{name: tensor} of a safetensors file (the format: an 8-byte header
    length, a JSON header, the raw little-endian data)."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    dtypes = {"F32": torch.float32, "BF16": torch.bfloat16, "F64": torch.float64, "I64": torch.int64,
              "I32": torch.int32, "F16": torch.float16, "BOOL": torch.bool, "U8": torch.uint8}
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        raw = bytearray(data[8 + n + b:8 + n + end])
        t = torch.frombuffer(raw, dtype=dtypes[e["dtype"]]) if raw else torch.empty(0, dtype=dtypes[e["dtype"]])
        out[name] = t.reshape(e["shape"]).clone()
    return out


def rms_norm(x, g, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * g


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope(x, theta):
    # x: [batch, seq, heads, d]; positions 0..seq-1
    d = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    angles = torch.arange(x.shape[1], dtype=torch.float32)[:, None] * inv_freq[None, :]
    emb = torch.cat((angles, angles), dim=-1)[None, :, None, :]
    return x * emb.cos() + rotate_half(x) * emb.sin()


def forward(c, w, ids):
    H, nh = c["hidden_size"], c["num_attention_heads"]
    nkv, eps, theta = c["num_key_value_heads"], c["rms_norm_eps"], c["rope_theta"]
    d = H // nh
    B, T = ids.shape
    h = w["model.embed_tokens.weight"][ids]
    causal = torch.ones(T, T, dtype=torch.bool).triu(1)
    for i in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % i
        a = rms_norm(h, w[p + "input_layernorm.weight"], eps)
        def proj(name):
            y = a @ w[p + "self_attn.%s.weight" % name].t()
            if p + "self_attn.%s.bias" % name in w:
                y = y + w[p + "self_attn.%s.bias" % name]
            return y
        q = proj("q_proj").view(B, T, nh, d)
        k = proj("k_proj").view(B, T, nkv, d)
        v = proj("v_proj").view(B, T, nkv, d)
        if p + "self_attn.q_norm.weight" in w:
            q = rms_norm(q, w[p + "self_attn.q_norm.weight"], eps)
            k = rms_norm(k, w[p + "self_attn.k_norm.weight"], eps)
        q, k = rope(q, theta), rope(k, theta)
        group = nh // nkv
        k = k.repeat_interleave(group, dim=2)
        v = v.repeat_interleave(group, dim=2)
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(d)
        probs = scores.masked_fill(causal, float("-inf")).softmax(-1)
        ctx = torch.einsum("bhqk,bkhd->bqhd", probs, v).reshape(B, T, H)
        h = h + ctx @ w[p + "self_attn.o_proj.weight"].t()
        m = rms_norm(h, w[p + "post_attention_layernorm.weight"], eps)
        if c.get("num_local_experts"):
            h = h + mixtral_moe(c, w, p + "block_sparse_moe.", m)
        else:
            gate = m @ w[p + "mlp.gate_proj.weight"].t()
            up = m @ w[p + "mlp.up_proj.weight"].t()
            h = h + (torch.nn.functional.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].t()
    h = rms_norm(h, w["model.norm.weight"], eps)
    head = w["model.embed_tokens.weight"] if c.get("tie_word_embeddings") else w["lm_head.weight"]
    return h @ head.t()


def mixtral_moe(c, w, p, x):
    E, k = c["num_local_experts"], c["num_experts_per_tok"]
    flat = x.reshape(-1, x.shape[-1])
    probs = (flat @ w[p + "gate.weight"].t()).softmax(-1)
    top, idx = probs.topk(k, dim=-1)
    top = top / top.sum(-1, keepdim=True)
    out = torch.zeros_like(flat)
    for e in range(E):
        rows, slot = (idx == e).nonzero(as_tuple=True)
        if rows.numel() == 0:
            continue
        xe = flat[rows]
        q = "%sexperts.%d." % (p, e)
        ye = (torch.nn.functional.silu(xe @ w[q + "w1.weight"].t()) * (xe @ w[q + "w3.weight"].t())) @ w[q + "w2.weight"].t()
        out = out.index_add(0, rows, ye * top[rows, slot].unsqueeze(-1))
    return out.view_as(x)


def hp_name(hf):
    """The run's name for an HF tensor, and the expert index (or None)."""
    import re
    m = re.match(r"model\.layers\.(\d+)\.(.*)", hf)
    if not m:
        return {"model.embed_tokens.weight": "embed.tok.weight", "model.norm.weight": "head.ln.weight",
                "lm_head.weight": "head.out.weight"}[hf], None
    i, rest = m.group(1), m.group(2)
    b = "blocks.%s." % i
    m = re.match(r"block_sparse_moe\.experts\.(\d+)\.(w1|w2|w3)\.weight", rest)
    if m:
        return b + "moe.experts.%s.weight" % {"w1": "gate", "w3": "up", "w2": "down"}[m.group(2)], int(m.group(1))
    fixed = {"input_layernorm.weight": "ln1.weight", "post_attention_layernorm.weight": "ln2.weight",
             "self_attn.o_proj.weight": "attn.proj.weight", "self_attn.q_norm.weight": "attn.q_norm.weight",
             "self_attn.k_norm.weight": "attn.k_norm.weight", "mlp.gate_proj.weight": "mlp.gate.weight",
             "mlp.up_proj.weight": "mlp.up.weight", "mlp.down_proj.weight": "mlp.down.weight",
             "block_sparse_moe.gate.weight": "moe.router.weight"}
    if rest in fixed:
        return b + fixed[rest], None
    m = re.match(r"self_attn\.(q|k|v)_proj\.(weight|bias)", rest)
    return b + "attn.%s.%s" % (m.group(1), m.group(2)), None


def main(hf_dir, run_dir, step):
    torch.set_num_threads(1)
    c = json.load(open(hf_dir + "/config.json"))
    w32 = {n: t.float().requires_grad_(True) for n, t in read_safetensors(hf_dir + "/model.safetensors").items()}
    batch = read_safetensors("%s/activations_step%d/activations-rank00000.safetensors" % (run_dir, step))
    firsts = sorted(int(k.split("@s")[1]) for k in batch if k.startswith("batch:tokens@s"))
    ids = torch.cat([batch["batch:tokens@s%d" % s] for s in firsts]).long()
    labels = torch.cat([batch["batch:labels@s%d" % s] for s in firsts]).long()
    logits = forward(c, w32, ids)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
    loss.backward()
    rows = [json.loads(l) for l in open(run_dir + "/metrics.jsonl") if l.strip()]
    run_loss = [r["loss"] for r in rows if r.get("step") == step and "loss" in r][0]
    rel = abs(loss.item() - run_loss) / abs(run_loss)
    print("loss at step %d: reference %.9f, run %.9f, relative %.2e (bar 1e-6)" % (step, loss.item(), run_loss, rel))
    failed = [] if rel <= 1e-6 else ["loss"]
    grads = {}
    import glob
    for f in glob.glob("%s/grads_step%d/*.safetensors" % (run_dir, step)):
        grads.update(read_safetensors(f))
    stacks = {}
    worst = (0.0, "")
    for n, t in w32.items():
        name, e = hp_name(n)
        if name not in grads:
            failed.append(name + " (no gradient in the run)")
            continue
        g = grads[name] if e is None else grads[name][e]
        ref = t.grad
        err = (g - ref).abs().max().item() / max(ref.abs().max().item(), 1e-30)
        worst = max(worst, (err, n))
        if err > 1e-5:
            failed.append("%s (%s): %.2e" % (n, name, err))
    print("compared %d gradients, max relative error %.2e (%s; bar 1e-5)" % (len(w32), worst[0], worst[1]))
    if failed:
        sys.exit("FAIL: " + "; ".join(failed[:8]))
    print("PASS")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
