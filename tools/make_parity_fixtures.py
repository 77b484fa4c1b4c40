#!/usr/bin/python3
"""Write PyTorch training references for the small GPT fixtures (like llm.c's test_gpt2).

For each model in tests/fixtures/<name>/ (exported by export_gpt_fixtures.py, whose model
definitions this script reuses), train/ gets:
    train.bin          B*T*10+1 tokens in llm.c's format (int32 header of 256 words: magic
                       20240520, version 1, token count; then uint16 tokens)
    grads.safetensors  every parameter gradient of step 1, f32, keyed by ONNX initializer name
    losses.jsonl       {"step": k, "loss": x} for the 10 steps of torch.optim.AdamW
    args               the flags the parity test passes: a `tokpipec ...` line (batch, seq)
                       and a `trainer ...` line (the optimizer settings used here)

Batch k uses the B*T+1 tokens starting at k*B*T (wrapping): inputs are the first B*T as B
rows of T, targets the same shifted by one; the loss is the mean cross-entropy over B*T.

Gradients are mapped to the ONNX initializers the exporter wrote: a constant-folded
transposed weight (onnx::MatMul_N) gets the transposed gradient, a folded position table
(wpe[:T]) the gradient of those rows, a tied head's copy of wte the transposed gradient of
the whole (tied) wte, and an Identity alias of a de-duplicated LayerNorm weight is keyed by
the Identity's output name. Buffers (causal masks) are constants, not parameters.

Regenerate (Debian 12's python3-torch 1.13 and python3-onnx; deterministic, one thread):
    /usr/bin/python3 tools/make_parity_fixtures.py
or only the variants named (as export_gpt_fixtures.py), e.g. with the toolchain venv:
    python tools/make_parity_fixtures.py gpt_o17_untied_headbias_v125 gpt_o17_tied_v125
"""
import contextlib
import json
import os
import struct
import sys
import warnings

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export_gpt_fixtures as fx  # noqa: E402  (the model definitions and variants)

STEPS = 10
# The trainer's defaults (a plain run is torch.optim.AdamW(weight_decay=0)), and for half
# the fixtures settings that exercise every optimizer flag: at lr 1e-3 ten steps' losses
# hardly depend on beta2 or a small decay; at 3e-3 with decay 0.1 a wrong beta1, beta2,
# decay or rate moves them by more than the 1e-4 the test allows (and a 10x eps on the
# tied models), while the float32-vs-float64 spread stays near 1e-7.
ADAMW = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
ADAMW_FLAGS = dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-7, weight_decay=0.1)
WITH_FLAGS = {"gpt_o17_erf_tied_bias_static", "gpt_o14_tanh_tied_bias_dyn_conv1d",
              "gpt_o17_tanh_untied_nobias_dyn", "gpt_o17_erf_untied_bias_external", "gpt_o17_tied_v125"}
TOKEN_MAGIC, TOKEN_VERSION = 20240520, 1


def write_tokens(path, tokens):
    header = np.zeros(256, dtype="<i4")
    header[:3] = (TOKEN_MAGIC, TOKEN_VERSION, len(tokens))
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens, dtype="<u2").tobytes())


def write_safetensors(path, tensors, metadata):
    """safetensors: u64 LE header size, JSON header (padded to 8 bytes), raw LE data."""
    header, offset = {"__metadata__": metadata}, 0
    for name in sorted(tensors):
        a = tensors[name]
        header[name] = {"dtype": "F32", "shape": list(a.shape),
                        "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name in sorted(tensors):
            f.write(np.ascontiguousarray(tensors[name], dtype="<f4").tobytes())


def make_tokens(n, vocab, seed):
    """A learnable stream, so ten steps already lower the loss: each token is followed by a
    fixed successor three times in four, by a uniformly drawn token otherwise."""
    gen = torch.Generator().manual_seed(seed)
    successor = torch.randperm(vocab, generator=gen)
    noise = torch.randint(0, vocab, (n,), generator=gen)
    keep = torch.rand(n, generator=gen) < 0.75
    tokens = noise.clone()
    for i in range(1, n):
        tokens[i] = successor[tokens[i - 1]] if keep[i] else noise[i]
    return tokens


def batch(tokens, k, B, T):
    n = B * T
    ix = (torch.arange(n + 1) + k * n) % len(tokens)
    chunk = tokens[ix]
    return chunk[:-1].view(B, T), chunk[1:].view(B, T)


def onnx_params(proto, model):
    """ONNX initializer (or Identity alias) name -> (torch parameter, form), form one of
    'copy', '1+' (the parameter plus one: the same gradient), 'T' (2-D transpose) or
    ('rows', n) (the first n rows). Buffers and float
    initializers equal to no parameter (folded constants) are left out; every parameter
    must be found."""
    import onnx  # here, not at the top: importers that only train (bench/gpu_gpt2.py) need no onnx
    from onnx import numpy_helper
    inits = {i.name: numpy_helper.to_array(i) for i in proto.graph.initializer
             if i.data_type == onnx.TensorProto.FLOAT}
    alias = {n.output[0]: n.input[0] for n in proto.graph.node
             if n.op_type == "Identity" and n.input[0] in inits}
    params = {k: p.detach().numpy() for k, p in model.named_parameters()}
    buffers = {k for k, _ in model.named_buffers()}
    forms = {}
    for name in list(inits) + list(alias):
        value = inits[alias.get(name, name)]
        if name in buffers:
            continue
        if name in params:  # the exporter kept the parameter's name (maybe via Identity)
            assert np.array_equal(params[name], value), f"{name}: ONNX value differs from torch"
            forms[name] = (name, "copy")
            continue
        found = []
        for pname, p in params.items():
            if p.shape == value.shape and np.array_equal(p, value):
                found.append((pname, "copy"))
            if p.ndim == 1 and p.shape == value.shape and np.array_equal(p + np.float32(1), value):
                found.append((pname, "1+"))   # Gemma's RMSNorm scale (1 + w), folded
            if p.ndim == 2 and p.T.shape == value.shape and np.array_equal(p.T, value):
                found.append((pname, "T"))
            if (p.ndim == 2 and value.ndim == 2 and value.shape[0] < p.shape[0]
                    and value.shape[1] == p.shape[1] and np.array_equal(p[:value.shape[0]], value)):
                found.append((pname, ("rows", value.shape[0])))
        if not found:   # a constant the exporter folded (a rotary table, a mask): no parameter
            continue
        assert len(found) == 1, f"initializer {name}: matches {found}"
        forms[name] = found[0]
    missing = set(params) - {p for p, _ in forms.values()}
    assert not missing, f"parameters with no ONNX initializer: {sorted(missing)}"
    return forms


def mapped(grads, forms):
    out = {}
    for name, (pname, form) in forms.items():
        g = grads[pname]
        out[name] = (g.T if form == "T" else g if not isinstance(form, tuple) else
                     g[:form[1]].reshape(form[2]) if len(form) > 2 else g[:form[1]])
    return out


def gpt(v):
    """The fixture's GPT: the same draws as export_gpt_fixtures.py, identical weights."""
    torch.manual_seed(v.seed)
    return fx.GPT(v)


@contextlib.contextmanager
def default_dtype(dtype):
    """Tensors created without a dtype (Hugging Face's torch.full(..., finfo(dtype).min)
    masks) in the model's dtype, as they would be in a model built in that dtype."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def train(make_model, tokens, B, T, dtype, adamw=ADAMW):
    """The fixture's model as exported (make_model() builds it), trained for STEPS AdamW
    steps. Returns (model at init, step-1 gradients by parameter name, losses)."""
    model = make_model()
    init = {k: p.detach().clone() for k, p in model.named_parameters()}
    model.to(dtype)
    opt = torch.optim.AdamW(model.parameters(), **adamw)
    grads, losses = None, []
    for k in range(STEPS):
        x, y = batch(tokens, k, B, T)
        opt.zero_grad(set_to_none=True)
        with default_dtype(dtype):
            logits = model(x)
        loss = F.cross_entropy(logits.view(B * T, -1), y.view(-1))
        loss.backward()
        if k == 0:   # tied parameters under each of their names
            grads = {n: p.grad.detach().numpy().copy()
                     for n, p in model.named_parameters(remove_duplicate=False)}
        losses.append(loss.item())
        opt.step()
    with torch.no_grad():   # back to the initial weights, for the ONNX name mapping
        for n, p in model.named_parameters():
            p.copy_(init[n])
    return model.float(), grads, losses


def max_rel(a, b):
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def write_references(dir, name, make_model, proto, B, T, vocab, seed, adamw=ADAMW,
                     compile_flags=(), forms=None, tokens=None):
    """dir/train/ for the model make_model() builds, exported as proto: tokens drawn from
    seed (or the stream given), PyTorch's step-1 gradients keyed by ONNX name (forms: the
    mapping, default onnx_params'), 10 losses, and the args file (with compile_flags added
    to the tokpipec line). Prints the float32-vs-float64 spread."""
    if tokens is None:
        tokens = make_tokens(B * T * STEPS + 1, vocab, seed=2000 + seed)
    model, grads, losses = train(make_model, tokens, B, T, torch.float32, adamw)
    _, grads64, losses64 = train(make_model, tokens, B, T, torch.float64, adamw)
    # A gradient that is zero in exact arithmetic (a key bias: softmax ignores a shift
    # shared by every key) is float32 rounding noise, which no implementation reproduces:
    # the reference says zero (float64 gives 1e-17 where float32 gives 1e-9).
    zero = [k for k in grads if np.abs(grads64[k]).max() < 1e-12]
    for k in zero:
        grads[k] = np.zeros_like(grads[k])
    named = mapped(grads, forms or onnx_params(proto, model))

    out = os.path.join(dir, "train")
    os.makedirs(out, exist_ok=True)
    write_tokens(os.path.join(out, "train.bin"), tokens.numpy())
    meta = {"batch": str(B), "seq": str(T), "loss": repr(losses[0]),
            "source": "tools/make_parity_fixtures.py"}
    write_safetensors(os.path.join(out, "grads.safetensors"), named, meta)
    with open(os.path.join(out, "losses.jsonl"), "w") as f:
        for k, loss in enumerate(losses):
            f.write(json.dumps({"step": k + 1, "loss": float(np.float32(loss))}) + "\n")
    with open(os.path.join(out, "args"), "w") as f:
        f.write(" ".join(["tokpipec", "--batch", str(B), "--seq", str(T), *compile_flags]) + "\n")
        lr, (b1, b2), eps, wd = (adamw[k] for k in ("lr", "betas", "eps", "weight_decay"))
        f.write(f"trainer --lr {lr:g} --beta1 {b1:g} --beta2 {b2:g} --eps {eps:g} "
                f"--weight-decay {wd:g}\n")

    # float32 rounding spread: how far float32 lands from float64, the tolerances' floor
    grad_spread = max(max_rel(grads[k], grads64[k]) for k in grads if k not in zero)
    loss_spread = [abs(a - b) / abs(b) for a, b in zip(losses, losses64)]
    size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
    print(f"{name}: B={B} T={T}, lr {adamw['lr']:g} decay {adamw['weight_decay']:g}, "
          f"{len(named)} gradients ({len(zero)} zero), loss {losses[0]:.6f} -> "
          f"{losses[-1]:.6f}, f32-vs-f64: grad {grad_spread:.2g}, loss {loss_spread[0]:.2g} "
          f"(10 steps {max(loss_spread):.2g}), "
          f"{size} bytes")


def main():
    torch.set_num_threads(1)   # fixed summation order: byte-identical output across runs
    warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
    import onnx
    only = sys.argv[1:]
    for v in fx.VARIANTS:
        if only and v.name not in only:
            continue
        B, T = v.test_bt
        dir = os.path.join(fx.ROOT, v.group, v.name)
        proto = onnx.load(os.path.join(dir, "model.onnx"))   # external data too
        adamw = ADAMW_FLAGS if v.name in WITH_FLAGS else ADAMW
        write_references(dir, v.name, lambda: gpt(v), proto, B, T, v.vocab, v.seed, adamw)


if __name__ == "__main__":
    main()
