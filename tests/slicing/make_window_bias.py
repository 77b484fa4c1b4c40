#!/usr/bin/python3
"""Write the window_bias/ test model and its PyTorch references (tests/slicing/window_bias.sh).

A two-layer causal LM written in the IR's raised form (model.tir), since ONNX has no
attention window: each layer is pre-LayerNorm attention with a residual, then a final
LayerNorm and an LM head.
    layer 0: 3-D (packed) attention, 4 query heads sharing 2 K/V heads (grouped-query),
             an ALiBi bias [1, 4, 1, T] (slope_h * key position) and a window of 5 keys
    layer 1: 4-D attention (Reshape, Transpose), 2 heads, a relative-position bias
             [1, 2, T, T] (random, finite everywhere) and a window of 3 keys
Query i sees key j iff i - window < j <= i (Mistral's sliding window), plus the bias.
PyTorch computes the same model the plain way (masked_fill of the band, softmax).

Files (deterministic; one thread):
    weights.safetensors  the parameters (the trainer's --init) and the two biases; model.tir
                         references its bytes (blob 0)
    model.tir            the module
    train.bin            B*T*10+1 tokens in llm.c's format
    grads.safetensors    step 1's gradient of every parameter
    losses.jsonl         the losses of 10 torch.optim.AdamW steps (the trainer's defaults)
Regenerate: /usr/bin/python3 tests/slicing/make_window_bias.py
"""
import json
import math
import os
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import make_parity_fixtures as parity  # noqa: E402  (tokens, batches, safetensors)

B, T, V, C = 2, 16, 11, 8
LAYERS = [dict(q_heads=4, kv_heads=2, head=2, window=5, packed=True, bias="alibi"),
          dict(q_heads=2, kv_heads=2, head=4, window=3, packed=False, bias="rel")]
STEPS = 10
ADAMW = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "window_bias")


def make_weights():
    gen = torch.Generator().manual_seed(11)

    def normal(*shape, std=0.3):
        return torch.randn(*shape, generator=gen) * std

    params = {"wte": normal(V, C, std=1.0)}
    for l, L in enumerate(LAYERS):
        params[f"ln{l}.w"] = 1 + normal(C, std=0.1)
        params[f"ln{l}.b"] = normal(C, std=0.1)
        params[f"wq{l}"] = normal(C, L["q_heads"] * L["head"])
        params[f"wk{l}"] = normal(C, L["kv_heads"] * L["head"])
        params[f"wv{l}"] = normal(C, L["kv_heads"] * L["head"])
        params[f"wo{l}"] = normal(L["q_heads"] * L["head"], C)
    params["lnf.w"] = 1 + normal(C, std=0.1)
    params["lnf.b"] = normal(C, std=0.1)
    params["head"] = normal(C, V)
    slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / 4) for h in range(4)])
    consts = {"alibi": (slopes[:, None] * torch.arange(T, dtype=torch.float32)[None, :]).reshape(1, 4, 1, T) * -1,
              "rel": normal(1, 2, T, T, std=1.0)}
    return params, consts


def attention(q, k, v, bias, window):
    """q [B, Hq, T, D], k and v [B, Hkv, T, D]; grouped heads share K/V like the kernel."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + bias
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    seen = (j <= i) & (j > i - window)
    return torch.softmax(s.masked_fill(~seen, float("-inf")), dim=-1) @ v


def forward(p, c, idx):
    x = p["wte"][idx]
    for l, L in enumerate(LAYERS):
        h = F.layer_norm(x, (C,), p[f"ln{l}.w"], p[f"ln{l}.b"], eps=1e-5)
        heads = lambda w, n: (h @ w).view(B, T, n, L["head"]).transpose(1, 2)  # noqa: E731
        a = attention(heads(p[f"wq{l}"], L["q_heads"]), heads(p[f"wk{l}"], L["kv_heads"]),
                      heads(p[f"wv{l}"], L["kv_heads"]), c[L["bias"]], L["window"])
        x = x + a.transpose(1, 2).reshape(B, T, -1) @ p[f"wo{l}"]
    return F.layer_norm(x, (C,), p["lnf.w"], p["lnf.b"], eps=1e-5) @ p["head"]


def train(params, consts, tokens, dtype):
    p = {k: v.clone().to(dtype).requires_grad_(True) for k, v in params.items()}
    c = {k: v.to(dtype) for k, v in consts.items()}
    opt = torch.optim.AdamW(p.values(), **ADAMW)
    grads, losses = None, []
    for k in range(STEPS):
        x, y = parity.batch(tokens, k, B, T)
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(forward(p, c, x).view(B * T, V), y.view(-1))
        loss.backward()
        if k == 0:
            grads = {n: t.grad.detach().float().numpy().copy() for n, t in p.items()}
        losses.append(loss.item())
        opt.step()
    return grads, losses


def write_safetensors(path, tensors):
    """The parity generator's safetensors writer; returns each tensor's byte offset in the
    file (for model.tir's blob references)."""
    parity.write_safetensors(path, tensors, {"source": "tests/slicing/make_window_bias.py"})
    with open(path, "rb") as f:
        size = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(size))
    return {name: 8 + size + header[name]["data_offsets"][0] for name in tensors}


def dims(a):
    return ", ".join(str(d) for d in a.shape)


def write_tir(path, params, consts, where):
    lines = ["tir 1 opset 17", 'blob 0 "weights.safetensors"', f"input %idx : i64[{B}, {T}]"]
    for kind, tensors in (("param", params), ("const", consts)):
        for name, a in tensors.items():
            lines.append(f"{kind} %{name} : f32[{dims(a)}] = blob 0 offset {where[name]} size {a.numel() * 4}")
    lines.append(f"%x0 : f32[{B}, {T}, {C}] = Embedding(%wte, %idx)")
    for l, L in enumerate(LAYERS):
        hq, hk, d = L["q_heads"], L["kv_heads"], L["head"]
        x, h = f"%x{l}", f"%h{l}"
        lines.append(f"{h} : f32[{B}, {T}, {C}] = LayerNorm({x}, %ln{l}.w, %ln{l}.b) {{axis = 2, epsilon = 1e-05}}")
        for w, n in (("q", hq), ("k", hk), ("v", hk)):
            lines.append(f"%{w}{l} : f32[{B}, {T}, {n * d}] = Linear({h}, %w{w}{l})")
        window = f"window = {L['window']}"
        if L["packed"]:
            lines.append(f"%a{l} : f32[{B}, {T}, {hq * d}] = Attention(%q{l}, %k{l}, %v{l}, %{L['bias']}) "
                         f"{{is_causal = 1, kv_num_heads = {hk}, q_num_heads = {hq}, {window}}} "
                         f'loc("/layer{l}/attn" Attention)')
            a = f"%a{l}"
        else:
            for w, n in (("q", hq), ("k", hk), ("v", hk)):
                lines.append(f"%{w}{l}.r : f32[{B}, {T}, {n}, {d}] = Reshape(%{w}{l})")
                lines.append(f"%{w}{l}.t : f32[{B}, {n}, {T}, {d}] = Transpose(%{w}{l}.r) {{perm = [0, 2, 1, 3]}}")
            lines.append(f"%a{l}.h : f32[{B}, {hq}, {T}, {d}] = Attention(%q{l}.t, %k{l}.t, %v{l}.t, %{L['bias']}) "
                         f'{{is_causal = 1, {window}}} loc("/layer{l}/attn" Attention)')
            lines.append(f"%a{l}.t : f32[{B}, {T}, {hq}, {d}] = Transpose(%a{l}.h) {{perm = [0, 2, 1, 3]}}")
            lines.append(f"%a{l} : f32[{B}, {T}, {hq * d}] = Reshape(%a{l}.t)")
            a = f"%a{l}"
        lines.append(f"%o{l} : f32[{B}, {T}, {C}] = Linear({a}, %wo{l})")
        lines.append(f"%x{l + 1} : f32[{B}, {T}, {C}] = Add({x}, %o{l})")
    n = len(LAYERS)
    lines.append(f"%hf : f32[{B}, {T}, {C}] = LayerNorm(%x{n}, %lnf.w, %lnf.b) {{axis = 2, epsilon = 1e-05}}")
    lines.append(f"%logits : f32[{B}, {T}, {V}] = Linear(%hf, %head)")
    lines.append("output %logits")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def main():
    torch.set_num_threads(1)
    os.makedirs(OUT, exist_ok=True)
    params, consts = make_weights()
    tokens = parity.make_tokens(B * T * STEPS + 1, V, seed=2024)
    where = write_safetensors(os.path.join(OUT, "weights.safetensors"),
                              {k: v.numpy() for k, v in {**params, **consts}.items()})
    write_tir(os.path.join(OUT, "model.tir"), params, consts, where)
    parity.write_tokens(os.path.join(OUT, "train.bin"), tokens.numpy())
    grads, losses = train(params, consts, tokens, torch.float32)
    grads64, losses64 = train(params, consts, tokens, torch.float64)
    write_safetensors(os.path.join(OUT, "grads.safetensors"), grads)
    with open(os.path.join(OUT, "losses.jsonl"), "w") as f:
        for k, loss in enumerate(losses):
            f.write(json.dumps({"step": k + 1, "loss": float(np.float32(loss))}) + "\n")
    spread = max(float(np.abs(grads[k] - grads64[k]).max() / np.abs(grads64[k]).max()) for k in grads)
    loss_spread = max(abs(a - b) / abs(b) for a, b in zip(losses, losses64))
    print(f"window_bias: loss {losses[0]:.6f} -> {losses[-1]:.6f}; float32 vs float64: "
          f"gradients {spread:.2g}, losses {loss_spread:.2g}")


if __name__ == "__main__":
    main()
