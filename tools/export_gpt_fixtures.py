#!/usr/bin/python3
"""Export small GPT models to ONNX with PyTorch's exporter and write their reference logits.

Each variant becomes tests/fixtures/<name>/ in the ONNX backend-test layout:
    model.onnx                  (+ weights.bin for the external-data variant)
    test_data_set_0/input_0.pb  token ids, int64 [B, T]
    test_data_set_0/output_0.pb logits from PyTorch, float32 [B, T, vocab]
    dims                        (dynamic-axes variants only) the --dim flags the test passes
Variants with a group go to tests/fixtures/<group>/<name>/ instead, where the test areas
that take every fixture do not find them (vocab/: vocabularies of 125, which no tensor
group of 2 or 4 ranks divides, for tests/tensor's padded-vocabulary plans).

The variants cover the export patterns the importer must accept: opset 14 (decomposed
LayerNorm) and 17 (LayerNormalization), erf and tanh GELU, tied and untied LM head, with and
without bias, static and dynamic axes, four causal-mask forms, nn.Linear (MatMul+Add) and
GPT-2 Conv1D (Reshape+Gemm+Reshape) projections, constant folding on and off, external data.

Regenerate everything (Debian 12's python3-torch 1.13 and python3-onnx):
    /usr/bin/python3 tools/export_gpt_fixtures.py
or only the variants named (the others' files stay as they are), e.g. the vocab/ ones,
made with torch 2.15 (the toolchain venv; its TorchScript exporter):
    python tools/export_gpt_fixtures.py gpt_o17_untied_headbias_v125 gpt_o17_tied_v125
"""
import collections
import inspect
import io
import math
import os
import shutil
import sys
import warnings
from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

# torch >= 2.9 exports with dynamo by default; these variants are TorchScript exports
TORCHSCRIPT = {"dynamo": False} if "dynamo" in inspect.signature(torch.onnx.export).parameters else {}
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures")


@dataclass(frozen=True)
class Variant:
    name: str
    opset: int = 17
    gelu: str = "erf"            # "erf" (exact) or "tanh"
    tied: bool = False           # LM head shares wte's weight
    bias: bool = True            # biases in Linear and LayerNorm
    mask: str = "tril_buffer"    # see CausalSelfAttention.causal_mask
    linear: str = "linear"       # "linear" (nn.Linear) or "conv1d" (HF GPT-2 addmm)
    dynamic: bool = False        # batch and seq exported as symbolic dims
    fold: bool = True            # torch.onnx.export(do_constant_folding=...)
    external: bool = False       # weights in weights.bin (external data)
    random_ln: bool = True       # False keeps LayerNorm at ones/zeros (exporter dedups them)
    vocab: int = 128
    block: int = 32
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 32
    trace_bt: tuple = (2, 16)    # (batch, seq) used to trace the export
    test_bt: tuple = (2, 16)     # (batch, seq) of the reference data; differs only if dynamic
    seed: int = 0
    head_bias: bool = False      # the LM head has a bias (untied only)
    group: str = ""              # a folder of tests/fixtures the variant goes to (see above)


VARIANTS = [
    Variant("gpt_o14_erf_tied_bias_static", opset=14, tied=True, random_ln=False),
    Variant("gpt_o17_erf_tied_bias_static", opset=17, tied=True, random_ln=False, seed=1),
    Variant("gpt_o14_tanh_untied_nobias_dyn", opset=14, gelu="tanh", bias=False, mask="range",
            dynamic=True, test_bt=(3, 11), seed=2),
    Variant("gpt_o17_tanh_untied_nobias_dyn", opset=17, gelu="tanh", bias=False,
            mask="bool_where", dynamic=True, seed=3),
    Variant("gpt_o17_erf_untied_bias_dyn_trilu", opset=17, mask="trilu_add", dynamic=True,
            test_bt=(1, 32), n_head=2, seed=4),
    Variant("gpt_o14_tanh_tied_bias_dyn_conv1d", opset=14, gelu="tanh", tied=True,
            mask="trilu_add", linear="conv1d", dynamic=True, test_bt=(4, 7), seed=5),
    Variant("gpt_o14_erf_untied_bias_static_nofold", opset=14, mask="bool_where", fold=False,
            seed=6),
    Variant("gpt_o17_erf_untied_bias_external", opset=17, external=True, n_embd=48, n_head=6,
            seed=7),
    Variant("gpt_o17_untied_headbias_v125", vocab=125, head_bias=True, group="vocab", seed=8),
    Variant("gpt_o17_tied_v125", vocab=125, tied=True, group="vocab", seed=9),
]


class LayerNorm(nn.Module):
    """LayerNorm with an optional bias (nn.LayerNorm in torch 1.13 cannot drop it)."""

    def __init__(self, n, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.bias = nn.Parameter(torch.zeros(n)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class Conv1D(nn.Module):
    """Hugging Face GPT-2's projection: weight [in, out], exported as Reshape -> Gemm -> Reshape."""

    def __init__(self, n_in, n_out):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_in, n_out) / math.sqrt(n_in))
        self.bias = nn.Parameter(torch.randn(n_out) * 0.1)

    def forward(self, x):
        shape = x.size()[:-1] + (self.weight.size(1),)
        return torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight).view(shape)


def projection(v, n_in, n_out):
    if v.linear == "conv1d":
        assert v.bias, "Conv1D always has a bias"
        return Conv1D(n_in, n_out)
    return nn.Linear(n_in, n_out, bias=v.bias)


class CausalSelfAttention(nn.Module):
    def __init__(self, v):
        super().__init__()
        self.v = v
        self.c_attn = projection(v, v.n_embd, 3 * v.n_embd)
        self.c_proj = projection(v, v.n_embd, v.n_embd)
        if v.mask == "tril_buffer":    # nanoGPT: float tril, masked_fill(== 0, -inf)
            tril = torch.tril(torch.ones(v.block, v.block))
            self.register_buffer("causal", tril.view(1, 1, v.block, v.block))
        elif v.mask == "bool_where":   # HF GPT-2: bool tril, where(mask, att, finfo.min)
            tril = torch.tril(torch.ones(v.block, v.block, dtype=torch.bool))
            self.register_buffer("causal", tril.view(1, 1, v.block, v.block))

    def causal_mask(self, att, T):
        if self.v.mask == "tril_buffer":
            return att.masked_fill(self.causal[:, :, :T, :T] == 0, float("-inf"))
        if self.v.mask == "bool_where":
            return torch.where(self.causal[:, :, :T, :T], att,
                               torch.tensor(torch.finfo(att.dtype).min, dtype=att.dtype))
        if self.v.mask == "range":     # position comparison: key j visible from query i if j <= i
            pos = torch.arange(T, device=att.device)
            visible = pos.view(1, T) <= pos.view(T, 1)
            return att.masked_fill(~visible, float("-inf"))
        if self.v.mask == "trilu_add":  # SDPA(is_causal=True)'s decomposition: additive bias
            bias = torch.zeros(T, T, dtype=att.dtype, device=att.device)
            keep = torch.ones(T, T, dtype=att.dtype, device=att.device).tril(diagonal=0)
            return att + bias.masked_fill(keep == 0, float("-inf"))
        raise ValueError(self.v.mask)

    def forward(self, x):
        B, T, C = x.size()
        nh = self.v.n_head
        q, k, v = self.c_attn(x).split(self.v.n_embd, dim=2)
        q = q.view(B, T, nh, C // nh).transpose(1, 2)    # (B, nh, T, hs)
        k = k.view(B, T, nh, C // nh).transpose(1, 2)
        v = v.view(B, T, nh, C // nh).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = F.softmax(self.causal_mask(att, T), dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class Block(nn.Module):
    def __init__(self, v):
        super().__init__()
        self.ln_1 = LayerNorm(v.n_embd, v.bias)
        self.attn = CausalSelfAttention(v)
        self.ln_2 = LayerNorm(v.n_embd, v.bias)
        self.c_fc = projection(v, v.n_embd, 4 * v.n_embd)
        self.gelu = nn.GELU(approximate="tanh" if v.gelu == "tanh" else "none")
        self.c_proj = projection(v, 4 * v.n_embd, v.n_embd)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.c_proj(self.gelu(self.c_fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self, v):
        super().__init__()
        self.wte = nn.Embedding(v.vocab, v.n_embd)
        self.wpe = nn.Embedding(v.block, v.n_embd)
        self.h = nn.ModuleList([Block(v) for _ in range(v.n_layer)])
        self.ln_f = LayerNorm(v.n_embd, v.bias)
        self.lm_head = nn.Linear(v.n_embd, v.vocab, bias=v.head_bias)
        if v.tied:
            self.lm_head.weight = self.wte.weight
        if v.random_ln:   # non-trivial scale and shift so the test sees them applied
            for m in self.modules():
                if isinstance(m, LayerNorm):
                    nn.init.normal_(m.weight, 1.0, 0.2)
                    if m.bias is not None:
                        nn.init.normal_(m.bias, 0.0, 0.2)

    def forward(self, idx):
        T = idx.size(1)
        pos = torch.arange(0, T, dtype=torch.long, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def export(v, model, dir):
    B, T = v.trace_bt
    idx = torch.zeros(B, T, dtype=torch.long)
    axes = {"idx": {0: "batch", 1: "seq"}, "logits": {0: "batch", 1: "seq"}} if v.dynamic else None
    buf = io.BytesIO()
    torch.onnx.export(model, (idx,), buf, opset_version=v.opset, input_names=["idx"],
                      output_names=["logits"], dynamic_axes=axes,
                      do_constant_folding=v.fold, **TORCHSCRIPT)
    import onnx  # here, not at the top: importers that only train (bench/gpu_gpt2.py) need no onnx
    proto = onnx.load_from_string(buf.getvalue())
    onnx.checker.check_model(proto)
    path = os.path.join(dir, "model.onnx")
    if v.external:
        onnx.save_model(proto, path, save_as_external_data=True, all_tensors_to_one_file=True,
                        location="weights.bin", size_threshold=0)
    else:
        onnx.save_model(proto, path)
    return proto


def save_tensor(array, path, name):
    from onnx import numpy_helper
    with open(path, "wb") as f:
        f.write(numpy_helper.from_array(array, name).SerializeToString())


def histogram(proto):
    ops = collections.Counter(n.op_type for n in proto.graph.node)
    return " ".join(f"{op}:{n}" for op, n in sorted(ops.items()))


def check_with_onnx_reference(path, idx, want):
    """Cross-check the export with onnx.reference (onnx >= 1.13) when it is importable."""
    try:
        from onnx.reference import ReferenceEvaluator
    except ImportError:
        return "skipped (no onnx.reference)"
    got = ReferenceEvaluator(path).run(None, {"idx": idx})[0]
    err = float(np.max(np.abs(got - want)))
    if not np.allclose(got, want, atol=1e-4, rtol=1e-4):
        sys.exit(f"{path}: onnx.reference disagrees with PyTorch: max_abs_err={err:.3g}")
    return f"onnx.reference max_abs_err={err:.2g}"


def main():
    torch.set_num_threads(1)   # fixed summation order: byte-identical outputs across runs
    # The tracer warns that head_dim and finfo.min become constants: they are static here.
    warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
    only = sys.argv[1:]  # the variants named, else all
    unknown = set(only) - {v.name for v in VARIANTS}
    if unknown:
        sys.exit(f"no such variant: {' '.join(sorted(unknown))}")
    for old in os.listdir(ROOT) if not only else []:  # drop every GPT fixture, so renamed variants go too
        if old.startswith("gpt_") and os.path.exists(os.path.join(ROOT, old, "model.onnx")):
            shutil.rmtree(os.path.join(ROOT, old))
    for v in VARIANTS:
        if only and v.name not in only:
            continue
        assert v.dynamic or v.test_bt == v.trace_bt, f"{v.name}: static shapes are the traced ones"
        torch.manual_seed(v.seed)
        model = GPT(v).eval()
        dir = os.path.join(ROOT, v.group, v.name)
        if os.path.exists(dir):  # a variant named, or one in a group folder
            shutil.rmtree(dir)
        os.makedirs(os.path.join(dir, "test_data_set_0"))
        with torch.no_grad():
            proto = export(v, model, dir)
            B, T = v.test_bt
            gen = torch.Generator().manual_seed(1000 + v.seed)
            idx = torch.randint(0, v.vocab, (B, T), generator=gen)
            logits = model(idx)
            # float32 rounding spread: how far float32 lands from a float64 evaluation
            spread = (model.double()(idx) - logits.double()).abs().max().item()
            model.float()
        data = os.path.join(dir, "test_data_set_0")
        save_tensor(idx.numpy(), os.path.join(data, "input_0.pb"), "idx")
        save_tensor(logits.numpy(), os.path.join(data, "output_0.pb"), "logits")
        if v.dynamic:
            with open(os.path.join(dir, "dims"), "w") as f:
                f.write(f"--dim batch={B} --dim seq={T}\n")
        check = check_with_onnx_reference(os.path.join(dir, "model.onnx"), idx.numpy(),
                                          logits.numpy())
        print(f"{v.name}: opset {v.opset}, {len(proto.graph.node)} nodes, "
              f"|logits|max={logits.abs().max().item():.3g}, f32-vs-f64 {spread:.2g}, {check}")
        print(f"  {histogram(proto)}")


if __name__ == "__main__":
    main()
