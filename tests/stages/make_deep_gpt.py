#!/usr/bin/python3
"""Export deep_gpt.onnx, the model of the pipeline-stage tests: the fixture exporter's GPT
(tools/export_gpt_fixtures.py) with 4 layers, so that it cuts into up to 4 stages, a tied
LM head (a parameter on the first and the last stage) and symbolic batch and sequence dims
(--batch and --seq choose them), as small as it goes. Debian 12's python3-torch:
    /usr/bin/python3 tests/stages/make_deep_gpt.py
With --references (the model as exported, deep_gpt.onnx unchanged): its PyTorch training
references for B 4, T 8 in deep_gpt_parity/train/ (tools/make_parity_fixtures.py's files:
train.bin, step-1 gradients, 10 losses, args), which the interleaved pipeline tests compare
with (4 layers: 2 ranks x 2 chunks).
"""
import os
import sys
import warnings

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools"))
import export_gpt_fixtures as fx  # noqa: E402


def variant():
    return fx.Variant("deep_gpt", opset=17, tied=True, vocab=32, block=16, n_layer=4, n_head=2,
                   n_embd=16, dynamic=True, trace_bt=(2, 8), test_bt=(2, 8), seed=21)


def references():
    import onnx
    import make_parity_fixtures as parity
    v = variant()
    proto = onnx.load(os.path.join(HERE, "deep_gpt.onnx"))
    parity.write_references(os.path.join(HERE, "deep_gpt_parity"), v.name, lambda: parity.gpt(v), proto, 4, 8,
                            v.vocab, v.seed)


def main():
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
    if sys.argv[1:] == ["--references"]:
        references()
        return
    v = variant()
    torch.manual_seed(v.seed)
    model = fx.GPT(v).eval()
    tmp = os.path.join(HERE, "deep_gpt.tmp")
    os.makedirs(tmp, exist_ok=True)
    with torch.no_grad():
        fx.export(v, model, tmp)
    os.replace(os.path.join(tmp, "model.onnx"), os.path.join(HERE, "deep_gpt.onnx"))
    for f in os.listdir(tmp):
        os.remove(os.path.join(tmp, f))
    os.rmdir(tmp)


if __name__ == "__main__":
    main()
