#!/usr/bin/python3
"""Writes the fixed-batch models of tests/bad-input/rebatch (committed; cases-rebatch.txt pins
their diagnostics): token ids [2, 3] embedded, then one op whose batch rows cannot be
separated, so tokpipec --batch / --microbatches cannot re-batch them (passes/rebatch.c).
Regenerate: /usr/bin/python3 tests/bad-input/make_rebatch_models.py"""
import numpy as np
from onnx import TensorProto, helper, numpy_helper

from make_bad_models import model, save, vi


def embedded(nodes, out_shape, inits=()):
    """input_ids [2, 3] -> Gather of a [5, 4] table -> e [2, 3, 4] -> nodes -> y."""
    table = numpy_helper.from_array(np.arange(20, dtype=np.float32).reshape(5, 4) / 20, "table")
    gather = helper.make_node("Gather", ["table", "input_ids"], ["e"], name="embed")
    return model([gather] + nodes, [vi("input_ids", [2, 3], TensorProto.INT64)],
                 [vi("y", out_shape)], [table] + list(inits))


def main():
    # a bias per batch row, as a constant: row 1 differs from row 0
    bias = helper.make_tensor("bias", TensorProto.FLOAT, [2, 1, 4], [0, 0, 0, 0, 1, 1, 1, 1])
    save(embedded([helper.make_node("Constant", [], ["bias"], name="bias", value=bias),
                   helper.make_node("Add", ["e", "bias"], ["y"], name="add_bias")], [2, 3, 4]),
         "rebatch/rows_differ.onnx")
    # a softmax across the batch
    save(embedded([helper.make_node("Softmax", ["e"], ["y"], name="batch_softmax", axis=0)], [2, 3, 4]),
         "rebatch/batch_softmax.onnx")


if __name__ == "__main__":
    main()
