# MoE against dense in CPU seconds per training step (user + sys of hp-train
# and its children, 1 intra-op thread per process), from the difference of a
# 12-step and a 2-step run so that start-up cancels out. Figures printed,
# never asserted. Unlike the wall-clock tokens/s of bench_moe.sh it holds on a
# machine shared with other work. The model is bench_moe.sh's (GPT 4 x 256,
# seq 128, batch 8, micro-batch 2, 8 experts top-2, dense FFN 2 x 4 x 256).
#   python3 bench/bench_moe_cpu.py OLD_HP_TRAIN NEW_HP_TRAIN [label filter ...]
# OLD_HP_TRAIN: a build before the change to compare with (e.g. main's).
import os, resource, subprocess, sys, tempfile
H, L, T, B, M, E, K = 256, 4, 128, 8, 2, 8, 2
w = tempfile.mkdtemp()
open(f"{w}/c.yaml", "w").write(f"""model: {{type: gpt, layers: {L}, hidden: {H}, heads: 4, seq_len: {T}}}
data: {{type: text}}
training: {{global_batch_size: {B}, micro_batch_size: {M}, log_interval: 1}}
optimizer: {{lr: 0.002, schedule: constant}}
checkpoint: {{interval: 0, resume: never}}
""")
moe = ["--set", f"model.moe.num_experts={E}", "--set", f"model.moe.top_k={K}"]
ep = ["--set", "features.expert_parallel.enabled=true", "--set", "features.expert_parallel.size=2", "--nproc", "2"]
dense = ["--set", f"model.ffn_hidden={2 * 4 * H}"]
def cpu(binary, args, steps, n):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    env = dict(os.environ, HP_INTRA_OP_THREADS="1")
    subprocess.run([binary, f"{w}/c.yaml", "--set", f"run.output_dir={w}/o{n}", "--set", f"training.max_steps={steps}"] + args,
                   check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
runs = []
old, new = sys.argv[1], sys.argv[2]
cases = [("dense GPT, same active FFN (new binary)", new, dense), ("MoE, per-expert loop (old binary)", old, moe),
         ("MoE, grouped slices (new)", new, moe), ("MoE, grouped padded (new)", new, moe + ["--set", "model.moe.expert_compute=padded"]),
         ("MoE ep=2, per-expert loop (old, both ranks)", old, moe + ep), ("MoE ep=2, grouped slices (new, both ranks)", new, moe + ep)]
if len(sys.argv) > 3: cases = [c for c in cases if any(s in c[0] for s in sys.argv[3:])]
res = {}
n = 0
for label, b, args in cases:
    n += 2
    per = (cpu(b, args, 12, n) - cpu(b, args, 2, n + 1)) / 10
    res[label] = per
    print(f"{label:46s} {per:7.3f} CPU s/step  {B * T / per:8.0f} tokens per CPU second", flush=True)
d = res.get("dense GPT, same active FFN (new binary)")
if d:
    for label, per in res.items():
        print(f"{label:46s} {d / per:5.2f} x dense (per CPU second)")
