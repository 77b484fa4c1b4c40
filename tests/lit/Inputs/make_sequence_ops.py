#!/usr/bin/python3
"""Writes split_to_sequence.onnx and its test data split_to_sequence/ (input_0.pb, the
expected output_N.pb; committed, so the tests need no Python): the tensor
sequences torch's dynamo exporter writes without its optimizer (optimize=False), a
SplitToSequence read back by SequenceAt, in the forms ONNX allows (sequence-ops.test):
sizes given, chunks of a scalar split (the last one smaller), one element per index
squeezed (keepdims 0), a negative position.
Regenerate: /usr/bin/python3 tests/lit/Inputs/make_sequence_ops.py"""
import os

import numpy as np
from onnx import TensorProto, checker, helper, numpy_helper


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    inits = [numpy_helper.from_array(np.array([2, 4], np.int64), "sizes"),
             numpy_helper.from_array(np.array(4, np.int64), "chunk"),
             numpy_helper.from_array(np.array(0, np.int64), "first"),
             numpy_helper.from_array(np.array(1, np.int64), "second"),
             numpy_helper.from_array(np.array(-1, np.int64), "last")]
    nodes = [
        helper.make_node("SplitToSequence", ["x", "sizes"], ["by_sizes"], name="by_sizes", axis=-1),
        helper.make_node("SequenceAt", ["by_sizes", "second"], ["sized"], name="sized"),
        helper.make_node("SplitToSequence", ["x", "chunk"], ["by_chunks"], name="by_chunks", axis=2),
        helper.make_node("SequenceAt", ["by_chunks", "last"], ["chunked"], name="chunked"),
        helper.make_node("SplitToSequence", ["x"], ["rows"], name="rows", axis=1, keepdims=0),
        helper.make_node("SequenceAt", ["rows", "first"], ["row"], name="row"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 6])
    outs = [helper.make_tensor_value_info("sized", TensorProto.FLOAT, [2, 3, 4]),
            helper.make_tensor_value_info("chunked", TensorProto.FLOAT, [2, 3, 2]),
            helper.make_tensor_value_info("row", TensorProto.FLOAT, [2, 6])]
    graph = helper.make_graph(nodes, "split_to_sequence", [x], outs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)
    checker.check_model(model, full_check=True)
    with open(os.path.join(here, "split_to_sequence.onnx"), "wb") as f:
        f.write(model.SerializeToString())
    data = os.path.join(here, "split_to_sequence")
    os.makedirs(data, exist_ok=True)
    x_data = np.arange(2 * 3 * 6, dtype=np.float32).reshape(2, 3, 6) / 8
    tensors = [(x_data, "x", "input_0.pb"), (x_data[:, :, 2:], "sized", "output_0.pb"),
               (x_data[:, :, 4:], "chunked", "output_1.pb"), (x_data[:, 0, :], "row", "output_2.pb")]
    for array, name, file in tensors:
        with open(os.path.join(data, file), "wb") as f:
            f.write(numpy_helper.from_array(np.ascontiguousarray(array), name).SerializeToString())


if __name__ == "__main__":
    main()
