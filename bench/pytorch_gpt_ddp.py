"""The PyTorch side of bench/bench_vs_pytorch.sh: hyperparallel's `model.type: gpt`
rebuilt in plain PyTorch (same parameters, same shapes, same math), trained on
the same byte tokens with AdamW, one process or several under torchrun with
DDP over Gloo.

  python3 pytorch_gpt_ddp.py --layers 4 --hidden 256 --heads 4 --count-only
  torchrun --standalone --nproc_per_node 2 --redirects 2 --tee 2 pytorch_gpt_ddp.py ... --out FILE

Rank 0 writes one JSON object per step to --out (step, step_seconds,
tokens_per_second), as hp-train's metrics.jsonl does. The model, as
framework/model/zoo.cpp and layers.cpp build it (defaults of model.*):
  token embedding [vocab, H] + learned positions [seq, H] (added), dropout 0;
  per block, pre-LayerNorm (eps 1e-5, weight and bias):
    h += proj(attention(qkv(ln1(h)))), qkv one H -> 3H linear with bias whose
    rows go head by head ([head][q|k|v][head_dim]), eager causal softmax
    attention scaled by 1/sqrt(head_dim), proj H -> H with bias;
    h += fc2(gelu(fc1(ln2(h)))), fc1 H -> 4H, fc2 4H -> H, both with bias,
    exact (erf) GELU;
  final LayerNorm, output H -> vocab without bias, untied;
  loss: cross entropy summed over the tokens / tokens.
With --model llama, hyperparallel's `model.type: llama` instead: token
embedding, no position table; per block, pre-RMSNorm (eps 1e-5, gain only):
    h += proj(attention(q, k, v)), q H -> H, k and v H -> kv_heads x head_dim,
    no biases, rotary positions (rotate-half, theta 10000) on q and k,
    grouped-query attention (each key/value head serves heads / kv_heads
    query heads), eager causal softmax;
    h += down(silu(gate(x)) * up(x)), gate and up H -> ffn, down ffn -> H,
    x = rms2(h), no biases;
  final RMSNorm, output H -> vocab, untied.
Init: linear and embedding weights N(0, 0.02), biases 0, LayerNorm 1 and 0
(RMSNorm gains 1).
Optimizer: AdamW (lr 1e-3, betas 0.9/0.999, eps 1e-8, weight decay 0, the
options' defaults), global-norm gradient clip 1.0 (optimizer.grad_clip's
default), constant learning rate.
"""

import argparse
import json
import math
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):
    def __init__(self, hidden, heads):
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)

    def forward(self, x):
        B, T, _ = x.shape
        # [B, T, heads, 3, head_dim]: q, k and v of a head side by side, as hp lays them out.
        q, k, v = self.qkv(x).view(B, T, self.heads, 3, self.head_dim).unbind(3)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, h, T, d]
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        mask = torch.ones(T, T, dtype=torch.bool).triu(1)
        scores = scores.masked_fill(mask, float("-inf"))
        ctx = torch.matmul(torch.softmax(scores, -1), v)  # [B, h, T, d]
        return self.proj(ctx.transpose(1, 2).reshape(B, T, -1))


class Block(nn.Module):
    def __init__(self, hidden, heads, ffn):
        super().__init__()
        self.ln1 = nn.LayerNorm(hidden, eps=1e-5)
        self.attn = Attention(hidden, heads)
        self.ln2 = nn.LayerNorm(hidden, eps=1e-5)
        self.fc1 = nn.Linear(hidden, ffn)
        self.fc2 = nn.Linear(ffn, hidden)

    def forward(self, h):
        h = h + self.attn(self.ln1(h))
        return h + self.fc2(F.gelu(self.fc1(self.ln2(h))))


class GPT(nn.Module):
    def __init__(self, vocab, seq, layers, hidden, heads, ffn, std=0.02):
        super().__init__()
        self.tok = nn.Embedding(vocab, hidden)
        self.pos = nn.Parameter(torch.empty(seq, hidden))
        self.blocks = nn.ModuleList(Block(hidden, heads, ffn) for _ in range(layers))
        self.ln = nn.LayerNorm(hidden, eps=1e-5)
        self.out = nn.Linear(hidden, vocab, bias=False)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=std)
                if getattr(m, "bias", None) is not None:
                    nn.init.zeros_(m.bias)
        nn.init.normal_(self.pos, std=std)

    def forward(self, ids, labels):
        h = self.tok(ids) + self.pos[: ids.shape[1]]
        for b in self.blocks:
            h = b(h)
        logits = self.out(self.ln(h))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


class RMSNorm(nn.Module):
    def __init__(self, hidden, eps=1e-5):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(hidden))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotary(x, theta=10000.0):
    """Rotate-half rotary embedding of x [B, T, heads, d] at positions 0..T-1."""
    d, T = x.shape[-1], x.shape[1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    angles = torch.arange(T, dtype=torch.float32)[:, None] * inv_freq[None, :]
    emb = torch.cat((angles, angles), -1)[None, :, None, :]
    half = d // 2
    return x * emb.cos() + torch.cat((-x[..., half:], x[..., :half]), -1) * emb.sin()


class LlamaBlock(nn.Module):
    def __init__(self, hidden, heads, kv_heads, ffn):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, hidden // heads
        self.ln1, self.ln2 = RMSNorm(hidden), RMSNorm(hidden)
        self.q = nn.Linear(hidden, hidden, bias=False)
        self.k = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.v = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.proj = nn.Linear(hidden, hidden, bias=False)
        self.gate = nn.Linear(hidden, ffn, bias=False)
        self.up = nn.Linear(hidden, ffn, bias=False)
        self.down = nn.Linear(ffn, hidden, bias=False)

    def forward(self, h):
        B, T, H = h.shape
        x = self.ln1(h)
        q = rotary(self.q(x).view(B, T, self.heads, self.head_dim))
        k = rotary(self.k(x).view(B, T, self.kv_heads, self.head_dim))
        v = self.v(x).view(B, T, self.kv_heads, self.head_dim)
        group = self.heads // self.kv_heads
        k, v = k.repeat_interleave(group, 2), v.repeat_interleave(group, 2)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        ctx = torch.matmul(torch.softmax(scores, -1), v).transpose(1, 2).reshape(B, T, H)
        h = h + self.proj(ctx)
        x = self.ln2(h)
        return h + self.down(F.silu(self.gate(x)) * self.up(x))


class Llama(nn.Module):
    def __init__(self, vocab, layers, hidden, heads, kv_heads, ffn, std=0.02):
        super().__init__()
        self.tok = nn.Embedding(vocab, hidden)
        self.blocks = nn.ModuleList(LlamaBlock(hidden, heads, kv_heads, ffn) for _ in range(layers))
        self.ln = RMSNorm(hidden)
        self.out = nn.Linear(hidden, vocab, bias=False)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=std)

    def forward(self, ids, labels):
        h = self.tok(ids)
        for b in self.blocks:
            h = b(h)
        logits = self.out(self.ln(h))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


def read_corpus(path):
    """The bytes hp's `data.type: text` reads: a file, or every regular file under
    a directory in sorted order, skipping symlinks, *.dat and files with a NUL
    byte in their first 4096 bytes; the first (1 - valid_fraction) is train."""
    files = []
    if os.path.isdir(path):
        for root, _, names in os.walk(path):
            for n in names:
                p = os.path.join(root, n)
                if os.path.islink(p) or not os.path.isfile(p) or n.endswith(".dat"):
                    continue
                files.append(p)
        files.sort()
    else:
        files = [path]
    text = bytearray()
    for p in files:
        with open(p, "rb") as f:
            b = f.read()
        if b"\0" in b[:4096]:
            continue
        text += b
    return text


def vm_bytes(field):
    """A /proc/self/status figure (VmRSS, VmHWM) in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=["gpt", "llama"], default="gpt")
    ap.add_argument("--kv-heads", type=int, default=0, help="llama: key/value heads (0: --heads)")
    ap.add_argument("--ffn", type=int, default=0, help="FFN width (0: gpt 4 x hidden; llama required)")
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--hidden", type=int, required=True)
    ap.add_argument("--heads", type=int, required=True)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--global-batch", type=int, default=8)
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=0, help="intra-op threads (0: cores / ranks)")
    ap.add_argument("--bucket-mb", type=float, default=25.0)
    ap.add_argument("--zero", action="store_true", help="ZeroRedundancyOptimizer (optimizer state sharded)")
    ap.add_argument("--data", default="/usr/share/games/fortunes")
    ap.add_argument("--valid-fraction", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--count-only", action="store_true", help="print the parameter count and exit")
    ap.add_argument("--out", default="")
    ap.add_argument("--bf16", action="store_true",
                    help="CPU autocast to bf16 (torch.autocast('cpu', torch.bfloat16)) around forward and loss")
    a = ap.parse_args()

    torch.manual_seed(a.seed)
    if a.model == "llama":
        if not a.ffn:
            raise SystemExit("--model llama needs --ffn")
        model = Llama(a.vocab, a.layers, a.hidden, a.heads, a.kv_heads or a.heads, a.ffn)
    else:
        model = GPT(a.vocab, a.seq, a.layers, a.hidden, a.heads, a.ffn or 4 * a.hidden)
    params = sum(p.numel() for p in model.parameters())
    if a.count_only:
        print(f"pytorch {a.model}: {params} parameters")
        return

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    threads = a.threads or max(1, (os.cpu_count() or 1) // local_world)
    torch.set_num_threads(threads)
    if a.global_batch % (a.micro_batch * world):
        raise SystemExit(f"--global-batch {a.global_batch} is not a multiple of micro-batch x ranks "
                         f"= {a.micro_batch * world}")
    accum = a.global_batch // (a.micro_batch * world)

    train = model
    if world > 1:
        dist.init_process_group("gloo")
        train = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=a.bucket_mb)
    if a.zero:
        if world == 1:
            raise SystemExit("--zero needs more than one rank")
        from torch.distributed.optim import ZeroRedundancyOptimizer
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW,
                                      lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)

    text = read_corpus(a.data)
    train_end = int(len(text) * (1.0 - a.valid_fraction))
    corpus = torch.frombuffer(text, dtype=torch.uint8)[:train_end]
    span = train_end - a.seq - 1 + 1
    gen = torch.Generator().manual_seed(a.seed * 1000 + rank)
    offsets = torch.arange(a.seq + 1)

    if rank == 0:
        print(f"pytorch {torch.__version__}: {a.model} {a.layers} x {a.hidden} ({a.heads} heads"
              f"{', %d key/value heads, ffn %d' % (a.kv_heads or a.heads, a.ffn) if a.model == 'llama' else ''}), "
              f"{params} parameters; "
              f"{world} rank(s) x {threads} thread(s), global batch {a.global_batch}, micro-batch {a.micro_batch}, "
              f"{accum} micro-batch(es) per rank per step" +
              (f", DDP gloo bucket_cap_mb {a.bucket_mb:g}" if world > 1 else "") +
              (", ZeroRedundancyOptimizer" if a.zero else "") +
              (", CPU autocast to bf16" if a.bf16 else "") +
              f"; corpus {len(text)} bytes ({train_end} train)", flush=True)
    out = open(a.out, "w") if a.out and rank == 0 else None
    # Resident memory after setup (model, optimizer, corpus): a step's peak
    # minus this is the step's activation and temporary memory.
    setup_rss = vm_bytes("VmRSS")
    tokens_per_step = a.global_batch * a.seq
    model.train()
    for step in range(1, a.steps + 1):
        t0 = time.perf_counter()
        for i in range(accum):
            starts = torch.randint(0, span, (a.micro_batch,), generator=gen)
            window = corpus[starts[:, None] + offsets].long()
            ids, labels = window[:, :-1], window[:, 1:]
            last = i == accum - 1
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
                if world > 1 and not last:
                    with train.no_sync():
                        loss = train(ids, labels) / accum
                else:
                    loss = train(ids, labels) / accum
            if world > 1 and not last:
                with train.no_sync():
                    loss.backward()
            else:
                loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        dt = time.perf_counter() - t0
        if rank == 0:
            rec = {"step": step, "step_seconds": dt, "tokens_per_second": tokens_per_step / dt,
                   "grad_norm": float(norm), "resident_after_setup_bytes": setup_rss,
                   "peak_resident_memory_bytes": vm_bytes("VmHWM")}
            print(json.dumps(rec), flush=True)
            if out:
                out.write(json.dumps(rec) + "\n")
                out.flush()
    if out:
        out.close()
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
