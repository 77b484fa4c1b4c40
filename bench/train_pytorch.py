#!/usr/bin/python3
"""The PyTorch side of bench/train_vs_pytorch.sh (Debian 12's python3-torch 1.13).

    train_pytorch.py export DIR [--model M]   the benchmark model M (gpt, the default, or
                                      llama) -> DIR/model.onnx, tokens -> DIR/train.bin
    train_pytorch.py train DIR --steps N --threads K --log FILE [--model M]
                                      train the same model from the same weights on the same
                                      batches with PyTorch eager; one JSON line per step
    train_pytorch.py report A.jsonl B.jsonl [--model M]
                                      tokens/s of both logs (the median step after the
                                      warm-up steps), the ratio
"""
import argparse
import json
import os
import sys
import time
import warnings

import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import export_gpt_fixtures as fx  # noqa: E402
import make_parity_fixtures as parity  # noqa: E402

# GPT-2 style: tanh GELU, tied head, biases, nanoGPT's tril-buffer mask; opset 17.
MODEL = fx.Variant("bench", opset=17, gelu="tanh", tied=True, vocab=256, block=256,
                   n_layer=4, n_head=4, n_embd=256, trace_bt=(8, 256), test_bt=(8, 256))
TEXT = "/usr/share/common-licenses/GPL-3"
WARMUP = 3   # steps left out of the rate: first-touch page faults, thread start-up


# Llama-shaped, same size: RMSNorm, rotary embeddings (halves rotation, as HF's Llama),
# SwiGLU MLP (hidden 704, about 8/3 C, the GPT's MLP FLOPs), 4 query heads sharing 2 K/V
# heads, untied head, no biases; an additive causal mask. The Variant's fields give the
# sizes and the export's settings (fx.export).
LLAMA = fx.Variant("bench-llama", opset=17, vocab=256, block=256, n_layer=4, n_head=4,
                   n_embd=256, trace_bt=(8, 256), test_bt=(8, 256))
LLAMA_KV_HEADS, LLAMA_HIDDEN, ROPE_BASE = 2, 704, 10000.0


class RMSNorm(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5))


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class LlamaAttention(nn.Module):
    def __init__(self, v):
        super().__init__()
        self.nh, self.nkv, self.hd = v.n_head, LLAMA_KV_HEADS, v.n_embd // v.n_head
        self.q_proj = nn.Linear(v.n_embd, self.nh * self.hd, bias=False)
        self.k_proj = nn.Linear(v.n_embd, self.nkv * self.hd, bias=False)
        self.v_proj = nn.Linear(v.n_embd, self.nkv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nh * self.hd, v.n_embd, bias=False)

    def forward(self, x, cos, sin, mask):
        B, T, C = x.size()
        q = self.q_proj(x).view(B, T, self.nh, self.hd).transpose(1, 2)    # (B, nh, T, hd)
        k = self.k_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)   # (B, nkv, T, hd)
        v = self.v_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = self.nh // self.nkv   # each K/V head serves rep query heads (HF's repeat_kv)
        k = k[:, :, None].expand(B, self.nkv, rep, T, self.hd).reshape(B, self.nh, T, self.hd)
        v = v[:, :, None].expand(B, self.nkv, rep, T, self.hd).reshape(B, self.nh, T, self.hd)
        att = F.softmax(q @ k.transpose(-2, -1) / math.sqrt(self.hd) + mask, dim=-1)
        return self.o_proj((att @ v).transpose(1, 2).contiguous().view(B, T, C))


class LlamaBlock(nn.Module):
    def __init__(self, v):
        super().__init__()
        self.input_layernorm = RMSNorm(v.n_embd)
        self.self_attn = LlamaAttention(v)
        self.post_attention_layernorm = RMSNorm(v.n_embd)
        self.gate_proj = nn.Linear(v.n_embd, LLAMA_HIDDEN, bias=False)
        self.up_proj = nn.Linear(v.n_embd, LLAMA_HIDDEN, bias=False)
        self.down_proj = nn.Linear(LLAMA_HIDDEN, v.n_embd, bias=False)

    def forward(self, x, cos, sin, mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Llama(nn.Module):
    def __init__(self, v):
        super().__init__()
        hd = v.n_embd // v.n_head
        self.embed_tokens = nn.Embedding(v.vocab, v.n_embd)
        self.layers = nn.ModuleList([LlamaBlock(v) for _ in range(v.n_layer)])
        self.norm = RMSNorm(v.n_embd)
        self.lm_head = nn.Linear(v.n_embd, v.vocab, bias=False)
        # rotary tables and the causal mask: constants, not state (exported as constants)
        inv_freq = 1.0 / ROPE_BASE ** (torch.arange(0, hd, 2).float() / hd)
        angles = torch.outer(torch.arange(v.block).float(), inv_freq)
        angles = torch.cat((angles, angles), dim=-1)                     # (block, hd)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)
        mask = torch.full((v.block, v.block), float("-inf")).triu(1)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, idx):
        T = idx.size(1)
        cos, sin, mask = self.cos[:T], self.sin[:T], self.mask[:T, :T]
        x = self.embed_tokens(idx)
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        return self.lm_head(self.norm(x))


def variant(name):
    return {"gpt": MODEL, "llama": LLAMA}[name]


def make_model(name="gpt"):
    """The benchmark model's initial weights; small embeddings (GPT-2's init) keep the
    first logits near zero (loss ~ ln 256)."""
    if name == "llama":
        torch.manual_seed(LLAMA.seed)
        model = Llama(LLAMA)
        with torch.no_grad():
            model.embed_tokens.weight.mul_(0.02)
        return model
    torch.manual_seed(MODEL.seed)
    model = fx.GPT(MODEL)
    with torch.no_grad():
        model.wte.weight.mul_(0.02)
        model.wpe.weight.mul_(0.02)
    return model


def export(dir, name="gpt"):
    warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
    os.makedirs(dir, exist_ok=True)
    with torch.no_grad():
        fx.export(variant(name), make_model(name).eval(), dir)
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


def train(dir, steps, threads, log, name="gpt"):
    torch.set_num_threads(threads)
    B, T = variant(name).test_bt
    tokens = read_tokens(os.path.join(dir, "train.bin"))
    model = make_model(name)   # the exported weights
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


def rate(path, B, T):
    """Tokens/s of the median timed step: robust to other load on a shared machine."""
    steps = [json.loads(line) for line in open(path) if line.strip()]
    timed = steps[WARMUP:] or steps
    return B * T / float(np.median([s["ms"] for s in timed])) * 1e3, steps


def report(ours, theirs, name="gpt"):
    v = variant(name)
    B, T = v.test_bt
    (r1, s1), (r2, s2) = rate(ours, B, T), rate(theirs, B, T)
    what = ("GPT" if name == "gpt" else
            f"Llama (RMSNorm, rotary, SwiGLU {LLAMA_HIDDEN}, {LLAMA_KV_HEADS} K/V heads)")
    print(f"{what} {v.n_layer} layers, C={v.n_embd}, {v.n_head} heads, T={T}, B={B}, "
          f"vocab {v.vocab}; {len(s1)} steps, median step time of steps {WARMUP + 1}..")
    print(f"  {'':16} {'tokens/s':>10} {'ms/step':>9} {'loss@1':>9} {'loss@end':>9}")
    for who, r, s in (("tokpipe trainer", r1, s1), ("pytorch eager", r2, s2)):
        print(f"  {who:16} {r:10.0f} {B * T / r * 1e3:9.1f} {s[0]['loss']:9.4f} "
              f"{s[-1]['loss']:9.4f}")
    print(f"  ratio tokpipe/pytorch: {r1 / r2:.2f}x")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cmd", choices=["export", "train", "report"])
    ap.add_argument("paths", nargs="+")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--log")
    ap.add_argument("--model", choices=["gpt", "llama"], default="gpt")
    a = ap.parse_args()
    if a.cmd == "export":
        export(a.paths[0], a.model)
    elif a.cmd == "train":
        train(a.paths[0], a.steps, a.threads, a.log or os.path.join(a.paths[0], "pytorch.jsonl"),
              a.model)
    else:
        report(*a.paths[:2], a.model)


if __name__ == "__main__":
    main()
