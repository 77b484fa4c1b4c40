#!/usr/bin/env python3
"""GPU benchmark (tests/device/run.sh): a GPT-2 124M-shaped model trained in bf16 by
tokpipec's CUDA trainer and by PyTorch on the same GPU, with the same model and batch.

    gpu_gpt2.py export DIR      (here, Debian's python3-torch 1.13) the model's graph ->
                                DIR/model.onnx (~500 MB of random weights: only tokpipec
                                reads it, to compile the trainer; the trainer starts from its
                                own random init, so the weights never travel to the GPU),
                                random tokens -> DIR/train.bin (2 MB, travels)
    gpu_gpt2.py train DIR --log FILE [--compile] [--steps N]
                                (on the GPU, its PyTorch 2.11) the same model trained in bf16
                                autocast on DIR/train.bin; one JSON line per step, as the
                                trainer's --log writes
    gpu_gpt2.py report [--device NAME] NAME=LOG...
                                tokens/s and model FLOPs utilisation of each log, against
                                the peak of the GPU NAME (nvidia-smi's name; default an
                                H100 SXM)
    gpu_gpt2.py check           (anywhere) the FLOP count's N against the model's own
                                parameters, and the peaks by device name (run.sh
                                --emulated runs it, without onnx)

Only export needs the onnx package (imported there): the GPU machine may lack it.

The model: 12 layers, C=768, 12 heads, vocab 50257, T=1024, tanh GELU, tied head, biases
(tools/export_gpt_fixtures.py's GPT); batch BATCH. PyTorch runs its attention through
scaled_dot_product_attention (flash): the same function as the exported softmax(QK^T/sqrt(d)
+ causal mask) V, in PyTorch's fastest form.

MFU = FLOPs per token * tokens/s / the GPU's dense bf16 peak (peak_bf16: the datasheets'
989 TFLOP/s for an H100 SXM and an H200, 756 for an H100 PCIe), with
FLOPs per token = 6 N + 12 L C T (PaLM's appendix B, nanoGPT's estimate_mfu: N the
parameters that multiply, i.e. without the position table; attention counted over all T
keys, the causal half included, the same for both sides).
"""
import argparse
import json
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tools"))
sys.path.insert(0, HERE)
import export_gpt_fixtures as fx  # noqa: E402
import make_parity_fixtures as parity  # noqa: E402
import train_pytorch  # noqa: E402  (read_tokens, WARMUP)

BATCH, SEQ = 16, 1024
MODEL = fx.Variant("gpt2-124m", opset=17, gelu="tanh", tied=True, vocab=50257, block=SEQ,
                   n_layer=12, n_head=12, n_embd=768, random_ln=False,
                   trace_bt=(BATCH, SEQ), test_bt=(BATCH, SEQ))
# dense bf16 tensor-core peaks (FLOP/s, the datasheets, without sparsity), by a word of
# nvidia-smi's device name; the first match wins (an H100 PCIe before any H100)
PEAKS_BF16 = [("H100 PCIe", 756e12), ("H100", 989e12), ("H200", 989e12)]
DEFAULT_DEVICE = "NVIDIA H100 80GB HBM3"  # an H100 SXM


def peak_bf16(device):
    """The dense bf16 peak of the GPU named DEVICE, None for a GPU not in PEAKS_BF16."""
    for word, peak in PEAKS_BF16:
        if word.lower() in device.lower():
            return peak
    return None


def flops_per_token(v=MODEL, T=SEQ):
    C, L, V = v.n_embd, v.n_layer, v.vocab
    # per layer: two LayerNorms (2C each), c_attn (3C^2 + 3C), c_proj (C^2 + C), the MLP
    # (4C^2 + 4C, 4C^2 + C); the tied head multiplies by wte (counted once); ln_f
    N = V * C + L * (12 * C * C + 13 * C) + 2 * C

    return 6 * N + 12 * L * C * T, N


def make_model():
    torch.manual_seed(MODEL.seed)
    model = fx.GPT(MODEL)
    with torch.no_grad():   # GPT-2's init scale for the embeddings: first loss ~ ln(vocab)
        model.wte.weight.mul_(0.02)
        model.wpe.weight.mul_(0.02)
    return model


class FlashAttention(fx.CausalSelfAttention):
    """The fixture's attention, computed by scaled_dot_product_attention."""

    def forward(self, x):
        B, T, C = x.size()
        nh = self.v.n_head
        q, k, v = (t.view(B, T, nh, C // nh).transpose(1, 2)
                   for t in self.c_attn(x).split(C, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


def export(dir):
    os.makedirs(dir, exist_ok=True)
    with torch.no_grad():
        fx.export(MODEL, make_model().eval(), dir)
    tokens = np.random.default_rng(0).integers(0, MODEL.vocab, 1 << 20)
    parity.write_tokens(os.path.join(dir, "train.bin"), tokens)


def train(dir, steps, log, compile):
    dev = torch.device("cuda")
    print(f"pytorch {torch.__version__} on {torch.cuda.get_device_name(dev)}", file=sys.stderr)
    model = make_model()
    for block in model.h:
        block.attn.__class__ = FlashAttention
    model = model.to(dev)
    opt = torch.optim.AdamW(model.parameters(), **parity.ADAMW, fused=True)  # the trainer's defaults
    step_fn = model
    if compile:
        step_fn = torch.compile(model)
    tokens = train_pytorch.read_tokens(os.path.join(dir, "train.bin"))
    B, T = MODEL.test_bt
    with open(log, "w") as f:
        for k in range(steps):
            x, y = parity.batch(tokens, k, B, T)
            x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = step_fn(x)
            loss = F.cross_entropy(logits.float().view(B * T, -1), y.view(-1))
            loss.backward()
            opt.step()
            torch.cuda.synchronize()
            ms = (time.perf_counter() - t0) * 1e3
            f.write(json.dumps({"step": k + 1, "loss": loss.item(), "ms": ms,
                                "tokens_per_s": B * T / ms * 1e3}) + "\n")
            print(f"pytorch{' compiled' if compile else ''} step {k + 1}/{steps}: "
                  f"loss {loss.item():.4f} {ms:.1f} ms", file=sys.stderr, flush=True)


def report(named_logs, device):
    fpt, N = flops_per_token()
    B, T = MODEL.test_bt
    peak = peak_bf16(device)
    against = (f"MFU against {device}'s {peak / 1e12:.0f} TFLOP/s" if peak else
               f"no MFU: no bf16 peak known for '{device}'")
    print(f"GPT-2 124M shape: {MODEL.n_layer} layers, C={MODEL.n_embd}, {MODEL.n_head} heads, "
          f"vocab {MODEL.vocab}, T={T}, B={B}, bf16; N={N / 1e6:.2f}M multiplying parameters, "
          f"{fpt / 1e9:.3f} GFLOP/token; {against}")
    print(f"  {'':22} {'tokens/s':>10} {'ms/step':>9} {'MFU':>7} {'loss@1':>8} {'loss@end':>8}")
    for item in named_logs:
        name, path = item.split("=", 1)
        if not os.path.exists(path):
            print(f"  {name:22} (no log: {path})")
            continue
        r, steps = train_pytorch.rate(path, B, T)
        mfu = f"{100 * r * fpt / peak:6.1f}%" if peak else f"{'-':>7}"
        print(f"  {name:22} {r:10.0f} {B * T / r * 1e3:9.1f} {mfu} "
              f"{steps[0]['loss']:8.4f} {steps[-1]['loss']:8.4f}")


def check():
    model = make_model()
    counted = sum(p.numel() for p in model.parameters()) - model.wpe.weight.numel()
    _, N = flops_per_token()
    if N != counted:
        sys.exit(f"gpu_gpt2.py: N={N} in the FLOP count, but the model multiplies by {counted} parameters")
    names = {"NVIDIA H100 80GB HBM3": 989e12, "NVIDIA H100 PCIe": 756e12, "NVIDIA H200": 989e12,
             "NVIDIA A100-SXM4-80GB": None}
    for device, want in names.items():
        if peak_bf16(device) != want:
            sys.exit(f"gpu_gpt2.py: the bf16 peak of '{device}' is {peak_bf16(device)}, expected {want}")
    print(f"the FLOP count's N={N} is the model's parameters less the position table; "
          f"bf16 peaks by device name: "
          f"{', '.join(f'{d} ' + (f'{p / 1e12:.0f}T' if p else 'unknown') for d, p in names.items())}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cmd", choices=["export", "train", "report", "check"])
    ap.add_argument("paths", nargs="*")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--log")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--device", default=DEFAULT_DEVICE, help="the GPU's name, for its peak (report)")
    a = ap.parse_intermixed_args()  # options after the paths too (report --device NAME LOG...)
    if a.cmd == "export":
        export(a.paths[0])
    elif a.cmd == "train":
        train(a.paths[0], a.steps, a.log, a.compile)
    elif a.cmd == "report":
        report(a.paths, a.device)
    else:
        check()


if __name__ == "__main__":
    main()
