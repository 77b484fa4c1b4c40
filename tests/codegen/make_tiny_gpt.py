#!/usr/bin/python3
"""Export tiny_gpt.onnx, the one-layer GPT whose generated plan is the golden file
tiny_gpt.plan.c: the fixture exporter's model (tools/export_gpt_fixtures.py) made as small
as it goes, with a tied LM head (a re-tied, derived initializer) and fresh LayerNorms (the
exporter's Identity aliases), so the plan shows every table. Debian 12's python3-torch:
    /usr/bin/python3 tests/codegen/make_tiny_gpt.py
"""
import os
import sys
import warnings

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools"))
import export_gpt_fixtures as fx  # noqa: E402


def main():
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
    v = fx.Variant("tiny_gpt", opset=17, tied=True, random_ln=False, vocab=16, block=8,
                   n_layer=1, n_head=2, n_embd=8, trace_bt=(2, 4), test_bt=(2, 4), seed=11)
    torch.manual_seed(v.seed)
    model = fx.GPT(v).eval()
    tmp = os.path.join(HERE, "tiny_gpt.tmp")
    os.makedirs(tmp, exist_ok=True)
    with torch.no_grad():
        fx.export(v, model, tmp)
    os.replace(os.path.join(tmp, "model.onnx"), os.path.join(HERE, "tiny_gpt.onnx"))
    os.rmdir(tmp)


if __name__ == "__main__":
    main()
