#!/usr/bin/python3
"""The PyTorch side of bench/kernels_forward.sh: PyTorch's forward ops at the same sizes as
bench/kernels_forward.c, one line per op (name, median and minimum milliseconds).

    kernels_forward.py --threads K [--reps N]
    kernels_forward.py table TOKPIPE.txt PYTORCH.txt     the two side by side, with ratios
"""
import argparse
import math
import sys
import time

# The per-step op counts of the benchmark GPT's forward (4 layers): what "forward" sums.
STEP = {"embedding": 1, "add": 9, "layernorm": 9, "linear_qkv": 4, "qkv_heads": 4,
        "attention": 4, "heads_back": 4, "linear_proj": 4, "linear_fc": 4, "gelu_tanh": 4,
        "linear_fc2": 4, "head": 1, "cross_entropy": 1}


def measure(threads, reps):
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    B, T, C, H, D, V, Fd = 8, 256, 256, 4, 64, 256, 1024
    R = B * T
    idx = torch.randint(0, V, (B, T))
    targets = torch.randint(0, V, (R,))
    wte = torch.randn(V, C) * 0.02
    x, res = torch.randn(B, T, C), torch.randn(B, T, C)
    ln_w, ln_b = torch.randn(C), torch.randn(C)
    # nn.Linear's layout: weight (out, in)
    wqkv, bqkv = torch.randn(3 * C, C) * 0.06, torch.randn(3 * C) * 0.02
    wproj, bproj = torch.randn(C, C) * 0.06, torch.randn(C) * 0.02
    wfc, bfc = torch.randn(Fd, C) * 0.06, torch.randn(Fd) * 0.02
    wfc2, bfc2 = torch.randn(C, Fd) * 0.03, torch.randn(C) * 0.02
    ln = torch.randn(B, T, C)
    qkv = torch.randn(B, T, 3 * C)
    q, k, v = (torch.randn(B, H, T, D) for _ in range(3))
    att = torch.randn(B, H, T, D)
    fc = torch.randn(B, T, Fd) * 2
    logits = torch.randn(R, V) * 3
    causal = torch.tril(torch.ones(T, T)).view(1, 1, T, T)

    def qkv_heads():   # views in PyTorch; the copies happen in the products that read them
        a, b, c = qkv.split(C, dim=2)
        return (a.view(B, T, H, D).transpose(1, 2), b.view(B, T, H, D).transpose(1, 2),
                c.view(B, T, H, D).transpose(1, 2))

    def attention():   # nanoGPT's attention, as the benchmark model computes it
        s = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D))
        s = s.masked_fill(causal[:, :, :T, :T] == 0, float("-inf"))
        return F.softmax(s, dim=-1) @ v

    ops = [
        ("embedding", lambda: F.embedding(idx, wte)),
        ("add", lambda: x + res),
        ("layernorm", lambda: F.layer_norm(res, (C,), ln_w, ln_b, 1e-5)),
        ("linear_qkv", lambda: F.linear(ln, wqkv, bqkv)),
        ("qkv_heads", qkv_heads),
        ("attention", attention),
        ("heads_back", lambda: att.transpose(1, 2).contiguous().view(B, T, C)),
        ("linear_proj", lambda: F.linear(ln, wproj, bproj)),
        ("linear_fc", lambda: F.linear(ln, wfc, bfc)),
        ("gelu_tanh", lambda: F.gelu(fc, approximate="tanh")),
        ("gelu_erf", lambda: F.gelu(fc)),
        ("linear_fc2", lambda: F.linear(fc, wfc2, bfc2)),
        ("head", lambda: F.linear(ln, wte)),
        ("cross_entropy", lambda: F.cross_entropy(logits, targets)),
        ("softmax", lambda: F.softmax(logits, dim=-1)),
        ("log_softmax", lambda: F.log_softmax(logits, dim=-1)),
    ]
    print(f"# pytorch {torch.__version__} ops, {torch.get_num_threads()} threads, {reps} reps: "
          "op median_ms min_ms")
    with torch.no_grad():
        for name, fn in ops:
            for _ in range(3):
                fn()
            t = []
            for _ in range(reps):
                t0 = time.perf_counter()
                fn()
                t.append((time.perf_counter() - t0) * 1e3)
            t.sort()
            print(f"{name:<14} {t[reps // 2]:9.4f} {t[0]:9.4f}", flush=True)


def read(path):
    rows = {}
    for line in open(path):
        if line.strip() and not line.startswith("#"):
            name, med, low = line.split()
            rows[name] = (float(med), float(low))
    return rows


def table(ours_path, theirs_path):
    ours, theirs = read(ours_path), read(theirs_path)
    print(f"{'op':<14} {'tokpipe ms':>17} {'pytorch ms':>17} {'pytorch/tokpipe':>16}")
    print(f"{'':<14} {'median (min)':>17} {'median (min)':>17} {'median (min)':>16}")
    for name in ours:
        (a, amin), (b, bmin) = ours[name], theirs.get(name, (math.nan, math.nan))
        print(f"{name:<14} {a:9.3f} ({amin:5.3f}) {b:9.3f} ({bmin:5.3f}) {b / a:9.2f} ({bmin / amin:4.2f})")
    f = [sum(n * rows[op][k] for op, n in STEP.items()) for rows in (ours, theirs) for k in (0, 1)]
    print(f"{'forward/step':<14} {f[0]:9.2f} ({f[1]:5.1f}) {f[2]:9.2f} ({f[3]:5.1f}) {f[2] / f[0]:9.2f} "
          f"({f[3] / f[1]:4.2f})   (op times x counts per step)")


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "table":
        table(sys.argv[2], sys.argv[3])
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--reps", type=int, default=30)
    a = ap.parse_args()
    measure(a.threads, a.reps)


if __name__ == "__main__":
    main()
