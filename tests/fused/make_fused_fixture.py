#!/usr/bin/python3
"""Write tests/fixtures/fused_block: a small decoder in the Hugging Face forms of the fused
ops' chains (passes/raise_transformer.c), exported the way a user exports a causal LM
(torch.onnx.export, opset 17, fixed [B, T] input_ids, logits out), with PyTorch's logits
and training references (tools/make_parity_fixtures.py's format), so the generic fixture
tests (forward, raised, sliced, parity, the pipeline matrix) run it.

Three layers, each a different form of the rotary embedding:
    layer 0  Llama:      rotate_half over the whole head, [1, 1, T, D] tables
    layer 1  GPT-NeoX:   rotate_half over the first rotary_dim features, the rest concatenated
    layer 2  GPT-J:      rotate_every_two (stack + flatten) over the first rotary_dim of the
                         [B, T, H, D] heads, tables repeat_interleave'd to [1, T, 1, rotary_dim]
each with Llama's RMSNorm (pow(2).mean(-1), + eps, rsqrt, weight * x.to(dtype)) and a
SiLU-gated MLP; the final norm is Gemma's (x.to(f32) ..., x * (1 + weight)). Attention is causal by
a masked_fill of a lower-triangular buffer (the form raise-transformer proves today). The
Cos and Sin tables are buffers, so the export makes them initializers, which tokpipec
would train: the fixture's args freeze them (--freeze), as PyTorch does not train buffers.

Regenerate (Debian 12's python3-torch 1.13 and python3-onnx; deterministic, one thread):
    /usr/bin/python3 tests/fused/make_fused_fixture.py
"""
import json
import os
import sys
import warnings

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx import numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools"))
import make_parity_fixtures as parity  # noqa: E402  (token files, safetensors, name mapping)

OUT = os.path.join(HERE, "..", "fixtures", "fused_block")
V, C, H, D, FF, B, T, ROT = 64, 16, 2, 8, 32, 2, 16, 4
EPS = 1e-6
KINDS = ("llama", "neox", "gptj")
FROZEN = r"^blocks\.[0-9]+\.(cos|sin)$"  # the rotary tables: buffers in PyTorch
# No weight decay: the export folds Gemma's 1 + weight into the parameter tokpipec trains,
# and decaying 1 + w is not decaying w.
ADAMW = dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-7, weight_decay=0.0)


class RMSNorm(torch.nn.Module):
    def __init__(self, gemma=False):
        super().__init__()
        self.gemma = gemma
        self.weight = torch.nn.Parameter(0.1 * torch.randn(C) + (0 if gemma else 1))

    def forward(self, x):
        dtype = x.dtype
        if self.gemma:  # only the final norm casts (raise-transformer drops no-op casts;
            x = x.to(torch.float32)  # the hf_* fixtures cover them in every block)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS)
        if self.gemma:
            return (x * (1.0 + self.weight.float())).to(dtype)
        return self.weight * x.to(dtype)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def rotate_every_two(x):
    return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)


def tables(dim):
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
    return torch.outer(torch.arange(T).float(), inv_freq)  # [T, dim/2]


class Block(torch.nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.kind = kind
        self.norm1, self.norm2 = RMSNorm(), RMSNorm()
        self.q, self.k, self.v, self.o = (torch.nn.Linear(C, C, bias=False) for _ in range(4))
        self.gate, self.up = torch.nn.Linear(C, FF, bias=False), torch.nn.Linear(C, FF, bias=False)
        self.down = torch.nn.Linear(FF, C, bias=False)
        freqs = tables(D if kind == "llama" else ROT)
        if kind == "gptj":  # [1, T, 1, ROT], each frequency twice in a row
            self.register_buffer("cos", freqs.cos().repeat_interleave(2, dim=-1)[None, :, None, :])
            self.register_buffer("sin", freqs.sin().repeat_interleave(2, dim=-1)[None, :, None, :])
        else:  # [1, 1, T, dim], the halves repeated
            emb = torch.cat((freqs, freqs), dim=-1)
            self.register_buffer("cos", emb.cos()[None, None])
            self.register_buffer("sin", emb.sin()[None, None])
        self.register_buffer("causal", torch.tril(torch.ones(T, T, dtype=torch.bool)))

    def rope(self, x):
        if self.kind == "llama":
            return x * self.cos + rotate_half(x) * self.sin
        r, rest = x[..., :ROT], x[..., ROT:]
        if self.kind == "neox":
            r = r * self.cos + rotate_half(r) * self.sin
        else:
            r = r * self.cos + rotate_every_two(r) * self.sin
        return torch.cat((r, rest), dim=-1)

    def forward(self, x):
        h = self.norm1(x)
        q, k, v = (f(h).view(B, T, H, D) for f in (self.q, self.k, self.v))
        if self.kind == "gptj":  # rotary before the head transpose, as GPT-J
            q, k = self.rope(q), self.rope(k)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        if self.kind != "gptj":
            q, k = self.rope(q), self.rope(k)
        s = (q @ k.transpose(-1, -2)) / D ** 0.5
        s = s.masked_fill(~self.causal, float("-inf"))
        a = (s.softmax(-1) @ v).transpose(1, 2).reshape(B, T, C)
        x = x + self.o(a)
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(V, C)
        self.blocks = torch.nn.ModuleList(Block(k) for k in KINDS)
        self.norm = RMSNorm(gemma=True)
        self.head = torch.nn.Linear(C, V, bias=False)

    def forward(self, ids):
        x = self.embed(ids)
        for b in self.blocks:
            x = b(x)
        return self.head(self.norm(x))


def make_model():
    torch.manual_seed(11)
    m = Model()
    with torch.no_grad():
        for n, p in m.named_parameters():
            if p.ndim == 2:
                p.normal_(0, 0.1)
    return m


class GemmaShift:
    """The parameters as the export folded them: Gemma's 1 + weight is one initializer."""

    def __init__(self, model):
        self.model = model

    def named_parameters(self):
        for n, p in self.model.named_parameters():
            yield n, (1 + p if n == "norm.weight" else p)

    def named_buffers(self):
        return self.model.named_buffers()


def train(tokens, dtype):
    model = make_model().to(dtype)
    opt = torch.optim.AdamW(model.parameters(), **ADAMW)
    grads, losses = None, []
    for k in range(parity.STEPS):
        x, y = parity.batch(tokens, k, B, T)
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x).view(B * T, -1), y.view(-1))
        loss.backward()
        if k == 0:
            grads = {n: p.grad.detach().float().numpy().copy() for n, p in model.named_parameters()}
        losses.append(loss.item())
        opt.step()
    return grads, losses


def main():
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    os.makedirs(os.path.join(OUT, "test_data_set_0"), exist_ok=True)
    model = make_model().eval()
    ids = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(5))
    path = os.path.join(OUT, "model.onnx")
    torch.onnx.export(model, (ids,), path, input_names=["input_ids"], output_names=["logits"], opset_version=17)
    with torch.no_grad():
        logits = model(ids)
    for name, a in (("input_0.pb", ids.numpy()), ("output_0.pb", logits.numpy())):
        with open(os.path.join(OUT, "test_data_set_0", name), "wb") as f:
            f.write(numpy_helper.from_array(a).SerializeToString())

    tokens = parity.make_tokens(B * T * parity.STEPS + 1, V, seed=2011)
    grads, losses = train(tokens, torch.float32)
    grads64, losses64 = train(tokens, torch.float64)
    forms = parity.onnx_params(onnx.load(path), GemmaShift(model))
    named = parity.mapped(grads, forms)
    out = os.path.join(OUT, "train")
    os.makedirs(out, exist_ok=True)
    parity.write_tokens(os.path.join(out, "train.bin"), tokens.numpy())
    meta = {"batch": str(B), "seq": str(T), "loss": repr(losses[0]), "source": "tests/fused/make_fused_fixture.py"}
    parity.write_safetensors(os.path.join(out, "grads.safetensors"), named, meta)
    with open(os.path.join(out, "losses.jsonl"), "w") as f:
        for k, loss in enumerate(losses):
            f.write(json.dumps({"step": k + 1, "loss": float(np.float32(loss))}) + "\n")
    with open(os.path.join(out, "args"), "w") as f:
        lr, (b1, b2), eps, wd = (ADAMW[k] for k in ("lr", "betas", "eps", "weight_decay"))
        f.write(f"tokpipec --batch {B} --seq {T} --freeze {FROZEN}\n")
        f.write(f"trainer --lr {lr:g} --beta1 {b1:g} --beta2 {b2:g} --eps {eps:g} --weight-decay {wd:g}\n")
    spread = max(parity.max_rel(grads[k], grads64[k]) for k in grads)
    print(f"fused_block: {len(named)} gradients, loss {losses[0]:.6f} -> {losses[-1]:.6f}, "
          f"f32-vs-f64: grad {spread:.2g}, loss {max(abs(a - b) / abs(b) for a, b in zip(losses, losses64)):.2g}")


if __name__ == "__main__":
    main()
