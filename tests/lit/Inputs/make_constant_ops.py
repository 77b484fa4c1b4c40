#!/usr/bin/python3
"""Writes rotary_constants.onnx (committed, so the tests need no Python), the position and
rotary tables of Hugging Face exports computed from constants (constant-ops.test):
OPT's positions (CumSum of the attention mask), Llama's inv_freq x positions through
Sin/Cos, GPT-J's Tile and GatherElements of the tables, a Max clamp.
Regenerate: /usr/bin/python3 tests/lit/Inputs/make_constant_ops.py [OUT.onnx] [--float-init]
(--float-init: inv_freq as a float initializer, which tokpipec imports as a parameter)."""
import os
import sys

import numpy as np
from onnx import TensorProto, helper, numpy_helper


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    out = args[0] if args else os.path.join(os.path.dirname(os.path.abspath(__file__)), "rotary_constants.onnx")
    T, half = 6, 4
    inv_freq = (1.0 / (10000 ** (np.arange(0, 2 * half, 2, dtype=np.float32) / (2 * half)))).astype(np.float32)
    inits = [numpy_helper.from_array(np.ones((1, T), np.int64), "attention_mask"),
             numpy_helper.from_array(np.array(1, np.int64), "axis1"),
             numpy_helper.from_array(np.array([1], np.int64), "one"),
             numpy_helper.from_array(np.array([-1], np.int64), "last"),
             numpy_helper.from_array(np.array([1, 1, 1], np.int64), "repeats"),
             numpy_helper.from_array(np.tile(np.arange(2 * half)[::-1], (1, T, 1)).astype(np.int64), "order")]
    nodes = [helper.make_node("Constant", [], ["floor"], name="floor", value_float=-0.5)]
    if "--float-init" in sys.argv:
        inits.append(numpy_helper.from_array(inv_freq, "inv_freq"))
    else:
        nodes.append(helper.make_node("Constant", [], ["inv_freq"], name="inv_freq",
                                      value=numpy_helper.from_array(inv_freq)))
    nodes += [
        helper.make_node("CumSum", ["attention_mask", "axis1"], ["csum"], name="positions/CumSum"),
        helper.make_node("Sub", ["csum", "one"], ["pos"], name="positions/Sub"),
        helper.make_node("Cast", ["pos"], ["pos_f"], name="positions/Cast", to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["pos_f", "last"], ["pos_col"], name="rotary/Unsqueeze"),
        helper.make_node("Mul", ["pos_col", "inv_freq"], ["freqs"], name="rotary/Mul"),
        helper.make_node("Concat", ["freqs", "freqs"], ["emb"], name="rotary/Concat", axis=-1),
        helper.make_node("Cos", ["emb"], ["cos"], name="rotary/Cos"),
        helper.make_node("Sin", ["emb"], ["sin"], name="rotary/Sin"),
        helper.make_node("Tile", ["sin", "repeats"], ["sin_tiled"], name="rotary/Tile"),
        helper.make_node("GatherElements", ["sin_tiled", "order"], ["sin_rev"], name="rotary/GatherElements", axis=2),
        helper.make_node("Max", ["cos", "floor"], ["cos_clamped"], name="rotary/Max"),
        helper.make_node("Mul", ["x", "cos_clamped"], ["xc"], name="apply/Mul"),
        helper.make_node("Mul", ["x", "sin_rev"], ["xs"], name="apply/Mul_1"),
        helper.make_node("Add", ["xc", "xs"], ["y"], name="apply/Add"),
    ]
    graph = helper.make_graph(nodes, "rotary_constants",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, T, 2 * half])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, T, 2 * half])], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="make_constant_ops")
    m.ir_version = 8
    with open(out, "wb") as f:
        f.write(m.SerializeToString())


if __name__ == "__main__":
    main()
