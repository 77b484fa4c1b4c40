"""Write the embedding padding-row fixtures of tests/padding/ (torch's padding_idx).

Each is a small language model whose nn.Embedding has a padding_idx, exported by today's
PyTorch, with PyTorch's training references in train/ (tools/make_parity_fixtures.py's
layout, which tests/parity/parity.sh checks): in PyTorch the padding row gets no gradient
from the lookup, so step 1's gradient of that row is zero (untied), or only the LM head's
part of it (tied). The token stream makes every third token the padding id.
test_data_set_0/ holds the first batch's tokens and PyTorch's logits. It also writes
tests/bad-input/padding_meta_*.onnx, dynamo_tied with the FX call's arguments edited.

    dynamo_tied      torch.export-based exporter (the default), tied head, padding_idx=-1
                     (nn.Embedding makes it row V-1): tokpipec reads the padding row from
                     the node metadata `pkg.torch.onnx.fx_node`
    torchscript_untied  TorchScript exporter (dynamo=False), untied head, padding_idx=3: no
                     metadata, so the args pass `--padding-idx embed.weight=-61` (row 3)

Regenerate with torch 2.x (the venv of tools/export_hf_fixtures.py's docstring, or PyPI
torch==2.15.0, onnx, onnxscript):
    python tools/make_padding_fixtures.py
"""
import contextlib
import io
import os
import sys
import warnings

import numpy as np
import onnx
import torch
from onnx import numpy_helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_parity_fixtures as parity  # noqa: E402  (references: train, name mapping, files)

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "padding")
V, C, B, T = 64, 16, 2, 16


class PadLM(torch.nn.Module):
    """embedding (with a padding row) -> x + tanh(Linear x) -> LayerNorm -> head"""

    def __init__(self, pad, tied):
        super().__init__()
        self.embed = torch.nn.Embedding(V, C, padding_idx=pad)
        self.mix = torch.nn.Linear(C, C)
        self.norm = torch.nn.LayerNorm(C)
        self.head = torch.nn.Linear(C, V, bias=False)
        if tied:
            self.head.weight = self.embed.weight

    def forward(self, input_ids):
        x = self.embed(input_ids)
        x = x + torch.tanh(self.mix(x))
        return self.head(self.norm(x))


def make(pad, tied, seed):
    torch.manual_seed(seed)
    return PadLM(pad, tied)


def export(model, path, dynamo):
    with contextlib.redirect_stdout(io.StringIO()):
        args = dict(external_data=False) if dynamo else dict(opset_version=17)
        torch.onnx.export(model, (torch.zeros(B, T, dtype=torch.long),), path, input_names=["input_ids"],
                          output_names=["logits"], dynamo=dynamo, **args)


def write_test_data(dir, model, x):
    """test_data_set_0/: the token input and PyTorch's logits (tokpipe-run's forward check)."""
    data = os.path.join(dir, "test_data_set_0")
    os.makedirs(data, exist_ok=True)
    with torch.no_grad():
        logits = model(x)
    for kind, name, value in (("input", "input_ids", x), ("output", "logits", logits)):
        with open(os.path.join(data, f"{kind}_0.pb"), "wb") as f:
            f.write(numpy_helper.from_array(value.numpy(), name).SerializeToString())


def write_bad_metadata(model_path):
    """tests/bad-input/padding_meta_*.onnx: dynamo_tied with the embedding's FX call edited
    (tests/bad-input/cases-padding.txt, tests/lit/padding-idx.test)."""
    bad = os.path.join(ROOT, "..", "bad-input")
    for name, args in (("negative", "-1"), ("not_int", "pad"), ("out_of_range", "64"),
                       ("scale_grad", "63, True")):
        proto = onnx.load(model_path)
        gather = next(n for n in proto.graph.node if n.op_type == "Gather")
        for prop in gather.metadata_props:
            if prop.key == "pkg.torch.onnx.fx_node":
                assert ", 63)" in prop.value, prop.value
                prop.value = prop.value.replace(", 63)", f", {args})")
        onnx.save(proto, os.path.join(bad, f"padding_meta_{name}.onnx"))


def main():
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    cases = [("dynamo_tied", -1, True, True, ()),
             ("torchscript_untied", 3, False, False, ("--padding-idx", "embed.weight=-61"))]
    for seed, (name, pad, tied, dynamo, flags) in enumerate(cases):
        dir = os.path.join(ROOT, name)
        os.makedirs(dir, exist_ok=True)
        path = os.path.join(dir, "model.onnx")
        export(make(pad, tied, seed).eval(), path, dynamo)
        row = pad % V
        tokens = parity.make_tokens(B * T * parity.STEPS + 1, V, seed=3000 + seed)
        tokens[::3] = row
        proto = onnx.load(path)
        write_test_data(dir, make(pad, tied, seed).eval(), tokens[:B * T].view(B, T))
        parity.write_references(dir, name, lambda: make(pad, tied, seed), proto, B, T, V, seed,
                                compile_flags=flags, tokens=tokens)
        # what the test stands on: torch gives the padding row nothing from the lookup
        model = make(pad, tied, seed)
        x, y = parity.batch(tokens, 0, B, T)
        torch.nn.functional.cross_entropy(model(x).view(B * T, -1), y.view(-1)).backward()
        g = model.embed.weight.grad[row].abs().max().item()
        assert (g > 0) if tied else (g == 0), f"{name}: padding row gradient {g}"
        print(f"{name}: padding row {row} ({int((tokens == row).sum())} of {len(tokens)} tokens), "
              f"its step-1 gradient max |g| {g:.3g} ({'the head' if tied else 'none'})")
    write_bad_metadata(os.path.join(ROOT, "dynamo_tied", "model.onnx"))


if __name__ == "__main__":
    main()
