#!/usr/bin/env python3
"""The products behind bench_moe.sh's MoE / dense ratio, in isolation.

Runs on Debian's python3-torch (the same LibTorch and OpenBLAS as
hyperparallel) with the shapes of bench_moe.sh's model: hidden 256, 8
experts of FFN 1024, top-2, against a dense FFN of 2048 (the same
FLOPs). Figures are printed, never asserted; each is the best of 5
timed repetitions (this machine's noise only slows a run down).

  /usr/bin/python3 bench/bench_moe_products.py [--threads 2]

1. The FFN's forward products at 64, 128 and 256 rows per expert: the 8
   experts one after another (as the grouped node runs them, each
   expert's products on its rows) against the dense FFN on the same
   tokens, at 1 and at the given thread count.
2. Each expert product with the weight stored [out, in] (nn.Linear's and
   hyperparallel's layout) against [in, out] (Megatron's grouped MLP),
   64 rows per expert, one thread.
3. The expert weight gradients of one layer and step of 4 micro-batches:
   added into .grad per micro-batch (64 rows per product, what the grouped
   node does) against deferred to the step's last micro-batch (the 4
   micro-batches' rows of an expert gathered, one product of 256 rows).
4. The router's small ops on 256 tokens (one micro-batch of 2 sequences
   of 128): ATen's cost per call, the scale of what routing adds.
"""
import argparse
import sys
import time

try:
    import torch
except ImportError:
    sys.exit("bench_moe_products: this python cannot import torch: run it with /usr/bin/python3 (Debian's python3-torch)")

H, F, E, K = 256, 1024, 8, 2
GELU = torch.nn.functional.gelu


def best_ms(f, n=20, reps=5):
    for _ in range(3):
        f()
    best = float("inf")
    for _ in range(reps):
        s = time.perf_counter()
        for _ in range(n):
            f()
        best = min(best, (time.perf_counter() - s) / n * 1e3)
    return best


def ffn_forward(threads):
    g = torch.Generator().manual_seed(1)
    w1, b1 = torch.randn(E, F, H, generator=g), torch.randn(E, F, generator=g)
    w2, b2 = torch.randn(E, H, F, generator=g), torch.randn(E, H, generator=g)
    d1, c1 = torch.randn(K * F, H, generator=g), torch.randn(K * F, generator=g)
    d2, c2 = torch.randn(H, K * F, generator=g), torch.randn(H, generator=g)
    for t in sorted({1, threads}):
        torch.set_num_threads(t)
        for rows in (64, 128, 256):
            tokens = rows * E // K  # each token's K rows spread evenly
            x = torch.randn(rows, H, generator=g)
            xd = torch.randn(tokens, H, generator=g)

            def experts():
                for e in range(E):
                    torch.addmm(b2[e], GELU(torch.addmm(b1[e], x, w1[e].t())), w2[e].t())

            def dense():
                torch.addmm(c2, GELU(torch.addmm(c1, xd, d1.t())), d2.t())

            a, b = best_ms(experts), best_ms(dense)
            print(f"  {t} thread(s), {rows:3d} rows per expert ({tokens:4d} tokens): "
                  f"8 experts {a:6.2f} ms, dense FFN {b:6.2f} ms, dense / experts {b / a:4.2f}")


def weight_layout():
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(2)
    M = 64
    x, gp = torch.randn(M, H, generator=g), torch.randn(M, F, generator=g)
    gy, act = torch.randn(M, H, generator=g), torch.randn(M, F, generator=g)
    w1, w2 = torch.randn(E, F, H, generator=g), torch.randn(E, H, F, generator=g)
    w1t, w2t = w1.transpose(1, 2).contiguous(), w2.transpose(1, 2).contiguous()
    g1, g2 = torch.zeros(E, F, H), torch.zeros(E, H, F)
    g1t, g2t = torch.zeros(E, H, F), torch.zeros(E, F, H)
    pf, ph = torch.empty(M, F), torch.empty(M, H)
    rows = [
        ("fc1 forward", lambda: [torch.mm(x, w1[e].t(), out=pf) for e in range(E)],
         lambda: [torch.mm(x, w1t[e], out=pf) for e in range(E)]),
        ("fc2 forward", lambda: [torch.mm(act, w2[e].t(), out=ph) for e in range(E)],
         lambda: [torch.mm(act, w2t[e], out=ph) for e in range(E)]),
        ("fc2 input gradient", lambda: [torch.mm(gy, w2[e], out=pf) for e in range(E)],
         lambda: [torch.mm(gy, w2t[e].t(), out=pf) for e in range(E)]),
        ("fc1 input gradient", lambda: [torch.mm(gp, w1[e], out=ph) for e in range(E)],
         lambda: [torch.mm(gp, w1t[e].t(), out=ph) for e in range(E)]),
        ("fc2 weight gradient", lambda: [g2[e].addmm_(gy.t(), act) for e in range(E)],
         lambda: [g2t[e].addmm_(act.t(), gy) for e in range(E)]),
        ("fc1 weight gradient", lambda: [g1[e].addmm_(gp.t(), x) for e in range(E)],
         lambda: [g1t[e].addmm_(x.t(), gp) for e in range(E)]),
    ]
    total = [0.0, 0.0]
    for name, out_in, in_out in rows:
        a, b = best_ms(out_in), best_ms(in_out)
        total[0] += a
        total[1] += b
        print(f"  {name:20s} [out, in] {a:6.2f} ms   [in, out] {b:6.2f} ms")
    print(f"  {'all six':20s} [out, in] {total[0]:6.2f} ms   [in, out] {total[1]:6.2f} ms")


def deferred_weight_gradients():
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(3)
    M, MB = 64, 4
    gw1, gw2 = torch.zeros(E, F, H), torch.zeros(E, H, F)
    gp = [torch.randn(E * M, F, generator=g) for _ in range(MB)]
    x = [torch.randn(E * M, H, generator=g) for _ in range(MB)]
    gy = [torch.randn(E * M, H, generator=g) for _ in range(MB)]
    act = [torch.randn(E * M, F, generator=g) for _ in range(MB)]

    def per_micro_batch():
        for b in range(MB):
            for e in range(E):
                s = slice(e * M, (e + 1) * M)
                gw2[e].addmm_(gy[b][s].t(), act[b][s])
                gw1[e].addmm_(gp[b][s].t(), x[b][s])

    def deferred():
        for e in range(E):
            s = slice(e * M, (e + 1) * M)
            cat = lambda ts: torch.cat([t[s] for t in ts])
            gw2[e].addmm_(cat(gy).t(), cat(act))
            gw1[e].addmm_(cat(gp).t(), cat(x))

    a, b = best_ms(per_micro_batch), best_ms(deferred)
    print(f"  per micro-batch (4 x 64 rows into .grad) {a:6.2f} ms; deferred (one product of 256 rows, "
          f"after gathering them) {b:6.2f} ms: {a - b:5.2f} ms saved per layer and step at one thread")


def router_ops():
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(4)
    N = 256
    tokens, router = torch.randn(N, H, generator=g), torch.randn(E, H, generator=g)
    logits = torch.nn.functional.linear(tokens, router)
    probs = torch.softmax(logits, -1)
    order = torch.sort(probs, stable=True, dim=-1, descending=True)[1]
    experts = torch.sort(order[:, :K], -1)[0]
    y = torch.randn(N * K, H, generator=g)
    ops = [
        ("router linear [256 x 256] x [256 x 8]", lambda: torch.nn.functional.linear(tokens, router)),
        ("softmax", lambda: torch.softmax(logits, -1)),
        ("stable descending sort of 8 per token", lambda: torch.sort(probs, stable=True, dim=-1, descending=True)),
        ("topk (not stable on ties)", lambda: torch.topk(probs, K, -1)),
        ("ascending sort of the top 2", lambda: torch.sort(order[:, :K], -1)),
        ("gather of the top-2 probabilities", lambda: probs.gather(-1, experts)),
        ("rows times weights [512 x 256]", lambda: y * probs.reshape(-1)[: N * K].unsqueeze(1)),
    ]
    for name, f in ops:
        print(f"  {name:40s} {best_ms(f, n=500) * 1e3:7.1f} us")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    print(f"torch {torch.__version__}; hidden {H}, {E} experts of FFN {F}, top-{K}; dense FFN {K * F}; best of 5")
    print("1. FFN forward products (bias, gelu): 8 experts in turn against the dense FFN, same FLOPs")
    ffn_forward(a.threads)
    print("2. expert weight layout, 64 rows per expert, 8 experts, one thread")
    weight_layout()
    print("3. expert weight gradients, one layer, one step of 4 micro-batches, one thread")
    deferred_weight_gradients()
    print("4. router ops on 256 tokens, one thread, per call")
    router_ops()


if __name__ == "__main__":
    main()
