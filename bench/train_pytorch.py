#!/usr/bin/python3
"""The PyTorch side of bench/train_vs_pytorch.sh (Debian 12's python3-torch 1.13).

    train_pytorch.py export DIR       the benchmark GPT -> DIR/model.onnx, tokens -> DIR/train.bin
    train_pytorch.py train DIR --steps N --threads K --log FILE
                                      train the same model from the same weights on the same
                                      batches with PyTorch eager; one JSON line per step
    train_pytorch.py report A.jsonl B.jsonl
                                      tokens/s of both logs (the median step after the
                                      warm-up steps), the ratio
"""
import argparse
import json
import os
import sys
import time
import warnings

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import export_gpt_fixtures as fx  # noqa: E402
import make_parity_fixtures as parity  # noqa: E402

# GPT-2 style: tanh GELU, tied head, biases, nanoGPT's tril-buffer mask; opset 17.
MODEL = fx.Variant("bench", opset=17, gelu="tanh", tied=True, vocab=256, block=256,
                   n_layer=4, n_head=4, n_embd=256, trace_bt=(8, 256), test_bt=(8, 256))
TEXT = "/usr/share/common-licenses/GPL-3"
WARMUP = 3   # steps left out of the rate: first-touch page faults, thread start-up


def make_model():
    """The benchmark model's initial weights; GPT-2's small embedding init keeps the tied
    head's first logits near zero (loss ~ ln 256)."""
    torch.manual_seed(MODEL.seed)
    model = fx.GPT(MODEL)
    with torch.no_grad():
        model.wte.weight.mul_(0.02)
        model.wpe.weight.mul_(0.02)
    return model


def export(dir):
    warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
    os.makedirs(dir, exist_ok=True)
    with torch.no_grad():
        fx.export(MODEL, make_model().eval(), dir)
    if os.path.exists(TEXT):   # byte-level tokens of an English text, like tokpipe-tokens
        tokens = np.frombuffer(open(TEXT, "rb").read(), dtype=np.uint8)
    else:
        tokens = np.random.default_rng(0).integers(0, MODEL.vocab, 1 << 16)
    parity.write_tokens(os.path.join(dir, "train.bin"), tokens)


def read_tokens(path):
    raw = open(path, "rb").read()
    header = np.frombuffer(raw[:1024], dtype="<i4")
    assert header[0] == parity.TOKEN_MAGIC, f"{path}: not a token file"
    return torch.from_numpy(np.frombuffer(raw[1024:], dtype="<u2")[:header[2]].astype(np.int64))


def train(dir, steps, threads, log):
    torch.set_num_threads(threads)
    B, T = MODEL.test_bt
    tokens = read_tokens(os.path.join(dir, "train.bin"))
    model = make_model()   # the exported weights
    opt = torch.optim.AdamW(model.parameters(), **parity.ADAMW)
    with open(log, "w") as f:
        for k in range(steps):
            t0 = time.perf_counter()
            x, y = parity.batch(tokens, k, B, T)
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x).view(B * T, -1), y.view(-1))
            loss.backward()
            opt.step()
            ms = (time.perf_counter() - t0) * 1e3
            f.write(json.dumps({"step": k + 1, "loss": loss.item(), "ms": ms,
                                "tokens_per_s": B * T / ms * 1e3}) + "\n")
            print(f"pytorch step {k + 1}/{steps}: loss {loss.item():.4f} {ms:.0f} ms",
                  file=sys.stderr)


def rate(path):
    """Tokens/s of the median timed step: robust to other load on a shared machine."""
    steps = [json.loads(line) for line in open(path) if line.strip()]
    timed = steps[WARMUP:] or steps
    B, T = MODEL.test_bt
    return B * T / float(np.median([s["ms"] for s in timed])) * 1e3, steps


def report(ours, theirs):
    B, T = MODEL.test_bt
    (r1, s1), (r2, s2) = rate(ours), rate(theirs)
    print(f"GPT {MODEL.n_layer} layers, C={MODEL.n_embd}, T={MODEL.test_bt[1]}, "
          f"B={MODEL.test_bt[0]}, vocab {MODEL.vocab}; {len(s1)} steps, "
          f"median step time of steps {WARMUP + 1}..")
    print(f"  {'':16} {'tokens/s':>10} {'ms/step':>9} {'loss@1':>9} {'loss@end':>9}")
    for name, r, s in (("tokpipe trainer", r1, s1), ("pytorch eager", r2, s2)):
        print(f"  {name:16} {r:10.0f} {B * T / r * 1e3:9.1f} {s[0]['loss']:9.4f} "
              f"{s[-1]['loss']:9.4f}")
    print(f"  ratio tokpipe/pytorch: {r1 / r2:.2f}x")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cmd", choices=["export", "train", "report"])
    ap.add_argument("paths", nargs="+")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--log")
    a = ap.parse_args()
    if a.cmd == "export":
        export(a.paths[0])
    elif a.cmd == "train":
        train(a.paths[0], a.steps, a.threads, a.log or os.path.join(a.paths[0], "pytorch.jsonl"))
    else:
        report(*a.paths[:2])


if __name__ == "__main__":
    main()
