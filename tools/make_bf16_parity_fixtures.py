#!/usr/bin/python3
"""Write PyTorch mixed-precision references for `tokpipec --precision bf16|fp16` (tests/parity).

For a GPT fixture (tools/export_gpt_fixtures.py's model, its weights), train_bf16/ gets what
make_parity_fixtures.py writes to train/ (train.bin, grads.safetensors, losses.jsonl, args),
from a run under torch.autocast("cpu", dtype=torch.bfloat16) with fp32 master weights and
fp32 AdamW state: the products compute on bf16 operands, the loss in fp32 (F.cross_entropy
of the logits cast to fp32), and the step-1 gradients are the fp32 masters' .grad.
train_fp16/ the same under torch.autocast("cpu", dtype=torch.float16) with
torch.amp.GradScaler's dynamic loss scaling (initial scale 2^16, its defaults), the
gradients unscaled.

It prints how far the autocast run lands from the fp32 one (gradients relative to each
tensor's largest magnitude, losses relative): the size of bf16 rounding on this model,
which the parity test's tolerances are set from.

Regenerate (deterministic, one thread):
    /work/venv26/env/bin/python tools/make_bf16_parity_fixtures.py
"""
import json
import os
import sys
import warnings

import numpy as np
import onnx
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export_gpt_fixtures as fx  # noqa: E402
import make_parity_fixtures as mp  # noqa: E402

# (fixture, batch, seq): the dynamic-shape fixture at 4 rows, so the test can also split them
# into microbatches and the sequence into slices
FIXTURES = [("gpt_o17_erf_untied_bias_dyn_trilu", 4, 32)]


def train(make_model, tokens, B, T, dtype):
    """dtype None: fp32; torch.bfloat16 or torch.float16: autocast (fp16 with GradScaler)."""
    model = make_model()
    init = {k: p.detach().clone() for k, p in model.named_parameters()}
    opt = torch.optim.AdamW(model.parameters(), **mp.ADAMW)
    scaler = torch.amp.GradScaler("cpu", enabled=dtype == torch.float16)
    grads, losses = None, []
    for k in range(mp.STEPS):
        x, y = mp.batch(tokens, k, B, T)
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            logits = model(x)
        loss = F.cross_entropy(logits.float().view(B * T, -1), y.view(-1))
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        if k == 0:
            grads = {n: p.grad.detach().float().numpy().copy()
                     for n, p in model.named_parameters(remove_duplicate=False)}
        losses.append(loss.item())
        scaler.step(opt)
        scaler.update()
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(init[n])
    return model, grads, losses


def write(dir, name, proto, v, tokens, B, T, dtype, precision, grads32, losses32):
    """train_<precision>/ of the fixture from a run under autocast in dtype."""
    model, grads, losses = train(lambda: mp.gpt(v), tokens, B, T, dtype)
    named = mp.mapped(grads, mp.onnx_params(proto, model))
    out = os.path.join(dir, "train_" + precision)
    os.makedirs(out, exist_ok=True)
    mp.write_tokens(os.path.join(out, "train.bin"), tokens.numpy())
    meta = {"batch": str(B), "seq": str(T), "loss": repr(losses[0]), "precision": "autocast " + precision,
            "source": "tools/make_bf16_parity_fixtures.py"}
    mp.write_safetensors(os.path.join(out, "grads.safetensors"), named, meta)
    with open(os.path.join(out, "losses.jsonl"), "w") as f:
        for k, loss in enumerate(losses):
            f.write(json.dumps({"step": k + 1, "loss": float(np.float32(loss))}) + "\n")
    a = mp.ADAMW
    with open(os.path.join(out, "args"), "w") as f:
        f.write(f"tokpipec --batch {B} --seq {T} --precision {precision}\n")
        f.write(f"trainer --lr {a['lr']:g} --beta1 {a['betas'][0]:g} --beta2 {a['betas'][1]:g} "
                f"--eps {a['eps']:g} --weight-decay {a['weight_decay']:g}\n")
    spread = max(mp.max_rel(grads[k], grads32[k]) for k in grads)
    loss_spread = max(abs(p - q) / abs(q) for p, q in zip(losses, losses32))
    print(f"{name}: B={B} T={T}, loss {losses[0]:.6f} -> {losses[-1]:.6f}; autocast {precision} vs fp32: "
          f"grad {spread:.2g} of the largest, loss {abs(losses[0] - losses32[0]) / losses32[0]:.2g} "
          f"(10 steps {loss_spread:.2g})")


def main():
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
    variants = {v.name: v for v in fx.VARIANTS}
    for name, B, T in FIXTURES:
        v = variants[name]
        dir = os.path.join(fx.ROOT, name)
        proto = onnx.load(os.path.join(dir, "model.onnx"))
        tokens = mp.make_tokens(B * T * mp.STEPS + 1, v.vocab, seed=3000 + v.seed)
        _, grads32, losses32 = train(lambda: mp.gpt(v), tokens, B, T, None)
        for dtype, precision in ((torch.bfloat16, "bf16"), (torch.float16, "fp16")):
            write(dir, name, proto, v, tokens, B, T, dtype, precision, grads32, losses32)


if __name__ == "__main__":
    main()
