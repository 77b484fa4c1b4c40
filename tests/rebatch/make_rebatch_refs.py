#!/usr/bin/python3
"""Write PyTorch logits of the fixed-batch GPT fixtures at batches other than the traced one.

tests/fixtures/<name>/model.onnx of a static variant (export_gpt_fixtures.py) was traced at
batch 2; tokpipec --batch B re-batches it (passes/rebatch.c). For B in BATCHES this writes
tests/rebatch/<name>/b<B>/input_0.pb (token ids, int64 [B, T]) and output_0.pb (the logits
of the same PyTorch model, float32 [B, T, vocab]). The model is rebuilt from the variant's
seed; it must reproduce the fixture's committed logits to float rounding (1e-5; other
weights move them by 1e-2 and more), so the weights are the exported ones.

Regenerate (Debian 12's python3-torch 1.13 and python3-onnx; deterministic, one thread):
    /usr/bin/python3 tests/rebatch/make_rebatch_refs.py
"""
import os
import sys

import numpy as np
import onnx
import torch
from onnx import numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools"))
import export_gpt_fixtures as fx  # noqa: E402  (the model definitions and variants)

BATCHES = (1, 4)


def main():
    torch.set_num_threads(1)
    for v in fx.VARIANTS:
        if v.dynamic:
            continue
        torch.manual_seed(v.seed)
        model = fx.GPT(v).eval()
        data = os.path.join(fx.ROOT, v.name, "test_data_set_0")
        idx = numpy_helper.to_array(onnx.load_tensor(os.path.join(data, "input_0.pb")))
        want = numpy_helper.to_array(onnx.load_tensor(os.path.join(data, "output_0.pb")))
        with torch.no_grad():
            got = model(torch.from_numpy(np.array(idx))).numpy()
        if not np.allclose(got, want, rtol=0, atol=1e-5):
            sys.exit(f"{v.name}: the rebuilt model does not reproduce the fixture's logits "
                     f"(max_abs_err={np.abs(got - want).max():.3g}): regenerate the fixtures first")
        T = v.trace_bt[1]
        for B in BATCHES:
            gen = torch.Generator().manual_seed(2000 + 10 * v.seed + B)
            ids = torch.randint(0, v.vocab, (B, T), generator=gen)
            with torch.no_grad():
                logits = model(ids)
            out = os.path.join(HERE, v.name, f"b{B}")
            os.makedirs(out, exist_ok=True)
            fx.save_tensor(ids.numpy(), os.path.join(out, "input_0.pb"), "idx")
            fx.save_tensor(logits.numpy(), os.path.join(out, "output_0.pb"), "logits")
        print(f"{v.name}: batches {', '.join(map(str, BATCHES))} of {T} tokens")


if __name__ == "__main__":
    main()
