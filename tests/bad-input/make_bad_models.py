#!/usr/bin/python3
"""Writes the small broken ONNX models of tests/bad-input (committed, so the tests need no
Python). Regenerate: /usr/bin/python3 tests/bad-input/make_bad_models.py
Each model is broken in exactly one way; CMakeLists.txt pins the diagnostic for each."""
import os

import numpy as np
from onnx import TensorProto, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
F = TensorProto.FLOAT


def model(nodes, inputs, outputs, inits=(), opset=17, domains=()):
    graph = helper.make_graph(nodes, "bad", inputs, outputs, initializer=list(inits))
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, 1) for d in domains]
    m = helper.make_model(graph, opset_imports=opsets, producer_name="make_bad_models")
    m.ir_version = 8
    return m


def save(m, name):
    path = os.path.join(HERE, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(m.SerializeToString())


def vi(name, shape, dtype=F):
    return helper.make_tensor_value_info(name, dtype, shape)


def matmul_model(w_shape=(3, 4)):
    w = numpy_helper.from_array(np.ones(w_shape, np.float32), "W")
    return model([helper.make_node("MatMul", ["x", "W"], ["y"], name="matmul")],
                 [vi("x", [2, 3])], [vi("y", [2, 4])], [w])


def external_model(location, offset="0", length="48"):
    """MatMul whose weight lives in external data at `location`."""
    w = TensorProto(name="W", data_type=F, dims=[3, 4])
    w.data_location = TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", offset), ("length", length)):
        e = w.external_data.add()
        e.key, e.value = k, v
    return model([helper.make_node("MatMul", ["x", "W"], ["y"], name="matmul")],
                 [vi("x", [2, 3])], [vi("y", [2, 4])], [w])


def main():
    good = matmul_model().SerializeToString()
    with open(os.path.join(HERE, "truncated.onnx"), "wb") as f:
        f.write(good[: len(good) // 2])  # cut inside the initializer's raw_data
    with open(os.path.join(HERE, "not_protobuf.onnx"), "wb") as f:
        f.write(b"this is not an ONNX model, just text\n")

    save(model([helper.make_node("MatMul", ["x", "W"], ["y"], name="matmul")],
               [vi("x", [2, 3])], [vi("y", [2, 4])]), "missing_initializer.onnx")

    save(model([helper.make_node("Add", ["x", "b"], ["a"], name="add"),
                helper.make_node("Relu", ["a"], ["b"], name="relu")],
               [vi("x", [2, 3])], [vi("b", [2, 3])]), "cycle.onnx")

    save(model([helper.make_node("MatMul", ["x", "W"], ["y"], name="matmul")],
               [vi("x", [2, 3])], [vi("y", [2, 5])],
               [numpy_helper.from_array(np.ones((4, 5), np.float32), "W")]), "shape_mismatch.onnx")

    save(model([helper.make_node("Relu", ["x"], ["y"], name="relu")],
               [vi("x", [2, 3])], [vi("y", [3, 2])]), "output_type_mismatch.onnx")

    save(model([helper.make_node("Abs", ["x"], ["y"], name="abs")],
               [vi("x", [2, 3])], [vi("y", [2, 3])]), "unsupported_op.onnx")

    save(model([helper.make_node("Gelu", ["x"], ["y"], name="gelu")],
               [vi("x", [2, 3])], [vi("y", [2, 3])]), "op_newer_than_opset.onnx")

    save(model([helper.make_node("FastGelu", ["x"], ["y"], name="fused_gelu", domain="com.microsoft")],
               [vi("x", [2, 3])], [vi("y", [2, 3])], domains=["com.microsoft"]), "unknown_domain.onnx")

    save(model([helper.make_node("Relu", ["x"], ["y"], name="relu")],
               [vi("x", [2, 3])], [vi("y", [2, 3])], opset=11), "opset_11.onnx")

    save(model([helper.make_node("Relu", ["x"], ["y"], name="relu")],
               [vi("x", [2, 3])], [vi("y", [2, 3])], opset=24), "opset_24.onnx")

    save(model([helper.make_node("Relu", ["x"], ["y"], name="relu")],
               [vi("x", ["batch", 3])], [vi("y", ["batch", 3])]), "symbolic_dim.onnx")

    w = numpy_helper.from_array(np.ones((3, 4), np.float32), "W")
    w.raw_data = w.raw_data[:40]
    save(model([helper.make_node("MatMul", ["x", "W"], ["y"], name="matmul")],
               [vi("x", [2, 3])], [vi("y", [2, 4])], [w]), "raw_data_size.onnx")

    save(model([helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape")],
               [vi("x", [2, 3]), vi("shape", [2], TensorProto.INT64)], [vi("y", [3, 2])]),
         "shape_not_constant.onnx")

    # external data: absolute path, `..`, and a symlink leading out of the model's folder
    # (CMakeLists.txt makes ext_symlink/weights.bin -> ../outside.bin at configure time)
    save(external_model("/etc/passwd"), "ext_absolute/model.onnx")
    save(external_model("../outside.bin"), "ext_dotdot/model.onnx")
    save(external_model("weights.bin"), "ext_symlink/model.onnx")
    save(external_model("weights.bin"), "ext_short/model.onnx")
    with open(os.path.join(HERE, "ext_short", "weights.bin"), "wb") as f:
        f.write(np.ones(6, np.float32).tobytes())  # 24 of the 48 bytes
    with open(os.path.join(HERE, "outside.bin"), "wb") as f:
        f.write(np.ones(12, np.float32).tobytes())

    # tokpipe-run test data that does not fit its model: one input file for two inputs,
    # and an input of the wrong shape
    save(model([helper.make_node("Add", ["x", "y"], ["z"], name="add")],
               [vi("x", [2, 3]), vi("y", [2, 3])], [vi("z", [2, 3])]), "run_data/model.onnx")
    for name, arrays in (("one_input", [np.ones((2, 3), np.float32)]),
                         ("wrong_shape", [np.ones((3, 2), np.float32), np.ones((2, 3), np.float32)])):
        folder = os.path.join(HERE, "run_data", name)
        os.makedirs(folder, exist_ok=True)
        for i, a in enumerate(arrays):
            with open(os.path.join(folder, f"input_{i}.pb"), "wb") as f:
                f.write(numpy_helper.from_array(a, "xy"[i]).SerializeToString())
        with open(os.path.join(folder, "output_0.pb"), "wb") as f:
            f.write(numpy_helper.from_array(np.full((2, 3), 2, np.float32), "z").SerializeToString())

    frontend_models()
    ops_models()
    opset_models()


I64_MIN, I64_MAX = -2**63, 2**63 - 1


def save_run(m, name, inputs, outputs):
    """A model with its tokpipe-run test data (test_data_set_0/input_N.pb, output_N.pb)."""
    save(m, name + "/model.onnx")
    folder = os.path.join(HERE, name, "test_data_set_0")
    os.makedirs(folder, exist_ok=True)
    for kind, arrays in (("input", inputs), ("output", outputs)):
        for i, (n, a) in enumerate(arrays):
            with open(os.path.join(folder, f"{kind}_{i}.pb"), "wb") as f:
                f.write(numpy_helper.from_array(a, n).SerializeToString())


def frontend_models():
    """The frontend's cases (cases-frontend.txt, extreme/)."""
    # a string attribute with an empty value (protobuf leaves its bytes NULL)
    save(model([helper.make_node("Gelu", ["x"], ["y"], name="gelu", approximate="")],
               [vi("x", [2])], [vi("y", [2])], opset=20), "empty_string_attr.onnx")
    # a graph input shadowing an initializer of another shape
    m = matmul_model()
    m.graph.input.append(vi("W", [4, 3]))
    save(m, "input_shadows_initializer.onnx")
    # external data offsets and lengths that are no byte positions
    for name, offset, length in (("ext_offset_max", str(I64_MAX), "48"),
                                 ("ext_offset_range", "99999999999999999999", "48"),
                                 ("ext_offset_text", "12abc", "48"),
                                 ("ext_length_negative", "0", "-48")):
        save(external_model("weights.bin", offset, length), name + "/model.onnx")
        with open(os.path.join(HERE, name, "weights.bin"), "wb") as f:
            f.write(np.ones(12, np.float32).tobytes())
    # a node name holding ESC: the diagnostic shows it escaped
    save(model([helper.make_node("Abs", ["x"], ["y"], name="abs\x1b[31mred")],
               [vi("x", [2])], [vi("y", [2])]), "esc_node_name.onnx")

    # an empty shape with huge dims: bounded like any other
    shape = numpy_helper.from_array(np.array([0, 2**62, 2**62], np.int64), "shape")
    save(model([helper.make_node("ConstantOfShape", ["shape"], ["y"], name="fill")], [],
               [vi("y", [0, 2**62, 2**62])], [shape]), "empty_huge_shape.onnx")

    shape = numpy_helper.from_array(np.array([0, 2**62, 2**62], np.int64), "shape")
    save(model([helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape", allowzero=1)], [vi("x", [0])],
               [vi("y", [0, 2**62, 2**62])], [shape]), "reshape_empty_huge.onnx")

    # an output name holding ESC: tokpipe-run's verdict line shows it escaped
    x = np.array([-1, 2], np.float32)
    save_run(model([helper.make_node("Relu", ["x"], ["y\x1b[2J"], name="relu")], [vi("x", [2])], [vi("y\x1b[2J", [2])]),
             "esc_output", [("x", x)], [("y\x1b[2J", np.maximum(x, 0))])

    # legal but extreme values: tokpipe-run must give numpy's (ONNX's) result
    x = np.arange(5, dtype=np.float32)
    slices = [(3, I64_MIN, I64_MIN), (0, 0, I64_MIN), (1, I64_MAX, 2), (I64_MIN, I64_MAX, I64_MAX),
              (I64_MAX, I64_MIN, -1), (-1, I64_MIN, I64_MAX), (4, -6, -3)]
    nodes, inits, outs = [], [], []
    for i, (start, end, step) in enumerate(slices):
        for k, v in (("starts", start), ("ends", end), ("axes", 0), ("steps", step)):
            inits.append(numpy_helper.from_array(np.array([v], np.int64), f"{k}{i}"))
        nodes.append(helper.make_node("Slice", ["x", f"starts{i}", f"ends{i}", f"axes{i}", f"steps{i}"],
                                      [f"y{i}"], name=f"slice{i}"))
        outs.append((f"y{i}", x[start:end:step]))
    save_run(model(nodes, [vi("x", [5])], [vi(n, list(a.shape)) for n, a in outs], inits),
             "extreme/slice", [("x", x)], outs)
    # a backward slice of an empty dim is empty (clamping must not make it one element)
    x = np.zeros((0, 2), np.float32)
    inits = [numpy_helper.from_array(np.array([v], np.int64), k)
             for k, v in (("starts", -1), ("ends", I64_MIN), ("axes", 0), ("steps", -1))]
    save_run(model([helper.make_node("Slice", ["x", "starts", "ends", "axes", "steps"], ["y"], name="slice")],
                   [vi("x", [0, 2])], [vi("y", [0, 2])], inits),
             "extreme/slice_empty", [("x", x)], [("y", x[-1:I64_MIN:-1])])
    x = np.arange(1, 13, dtype=np.float32).reshape(3, 4)
    nodes, inits, outs = [], [], []
    for i, (k, upper) in enumerate(((I64_MAX, 1), (I64_MAX, 0), (I64_MIN, 1), (I64_MIN, 0), (-2, 1), (2, 0))):
        inits.append(numpy_helper.from_array(np.array(k, np.int64), f"k{i}"))
        nodes.append(helper.make_node("Trilu", ["x", f"k{i}"], [f"y{i}"], name=f"trilu{i}", upper=upper))
        k_in = max(min(k, 4), -3)  # numpy's tri() overflows at the extremes; the meaning is the same
        outs.append((f"y{i}", np.triu(x, k_in) if upper else np.tril(x, k_in)))
    save_run(model(nodes, [vi("x", [3, 4])], [vi(n, [3, 4]) for n, _ in outs], inits),
             "extreme/trilu", [("x", x)], outs)


def ops_models():
    """The ops computed from constants (cases-ops.txt, ops/)."""
    i64 = TensorProto.INT64
    axes = numpy_helper.from_array(np.array([0, 1], np.int64), "axes")
    save(model([helper.make_node("CumSum", ["x", "axes"], ["y"], name="cumsum")],
               [vi("x", [2, 3])], [vi("y", [2, 3])], [axes]), "ops/cumsum_two_axes.onnx")
    save(model([helper.make_node("CumSum", ["x", "axis"], ["y"], name="cumsum")],
               [vi("x", [2, 3]), vi("axis", [], i64)], [vi("y", [2, 3])]), "ops/cumsum_axis_input.onnx")
    axis = numpy_helper.from_array(np.array(-3, np.int64), "axis")
    save(model([helper.make_node("CumSum", ["x", "axis"], ["y"], name="cumsum")],
               [vi("x", [2, 3])], [vi("y", [2, 3])], [axis]), "ops/cumsum_axis_range.onnx")
    repeats = numpy_helper.from_array(np.array([2], np.int64), "repeats")
    save(model([helper.make_node("Tile", ["x", "repeats"], ["y"], name="tile")],
               [vi("x", [2, 3])], [vi("y", [4, 3])], [repeats]), "ops/tile_repeats_count.onnx")
    repeats = numpy_helper.from_array(np.array([1, -1], np.int64), "repeats")
    save(model([helper.make_node("Tile", ["x", "repeats"], ["y"], name="tile")],
               [vi("x", [2, 3])], [vi("y", [2, 3])], [repeats]), "ops/tile_repeats_negative.onnx")
    save(model([helper.make_node("GatherElements", ["x", "i"], ["y"], name="gather", axis=2)],
               [vi("x", [2, 3]), vi("i", [2, 3], i64)], [vi("y", [2, 3])]), "ops/gather_elements_axis.onnx")
    # constant operands: folded at import, where the index is checked
    data = numpy_helper.from_array(np.arange(6, dtype=np.int64).reshape(2, 3), "x")
    idx = numpy_helper.from_array(np.array([[0, 3]], np.int64), "i")
    save(model([helper.make_node("GatherElements", ["x", "i"], ["y"], name="gather", axis=1)],
               [], [vi("y", [1, 2], i64)], [data, idx]), "ops/gather_elements_index.onnx")
    save(model([helper.make_node("Max", ["a", "b", "c"], ["y"], name="max")],
               [vi("a", [2, 3]), vi("b", [3]), vi("c", [2])], [vi("y", [2, 3])]), "ops/max_broadcast.onnx")
    # ops whose version changed since the model's opset stay refused, the op and opset named
    save(model([helper.make_node("Max", ["a", "b"], ["y"], name="max")],
               [vi("a", [2]), vi("b", [2])], [vi("y", [2])], opset=12), "ops/max_opset12.onnx")
    repeats = numpy_helper.from_array(np.array([2], np.int64), "repeats")
    save(model([helper.make_node("Tile", ["x", "repeats"], ["y"], name="tile")],
               [vi("x", [2])], [vi("y", [4])], [repeats], opset=12), "ops/tile_opset12.onnx")
    # a mixture's router: TopK of the k smallest, K past the axis; and the eager
    # experts' routing as TorchScript exports it, OneHot before NonZero: NonZero is named
    k = numpy_helper.from_array(np.array([2], np.int64), "k")
    save(model([helper.make_node("TopK", ["x", "k"], ["v", "i"], name="topk", largest=0)],
               [vi("x", [3, 4])], [vi("v", [3, 2]), vi("i", [3, 2], i64)], [k]), "ops/topk_smallest.onnx")
    k = numpy_helper.from_array(np.array([5], np.int64), "k")
    save(model([helper.make_node("TopK", ["x", "k"], ["v", "i"], name="topk")],
               [vi("x", [3, 4])], [vi("v", [3, 5]), vi("i", [3, 5], i64)], [k]), "ops/topk_k_range.onnx")
    depth = numpy_helper.from_array(np.array(4, np.int64), "depth")
    onoff = numpy_helper.from_array(np.array([0, 1], np.int64), "onoff")
    save(model([helper.make_node("OneHot", ["i", "depth", "onoff"], ["hot"], name="experts/OneHot"),
                helper.make_node("NonZero", ["hot"], ["where"], name="experts/NonZero")],
               [vi("i", [3, 2], i64)], [vi("where", [3, None], i64)], [depth, onoff]), "ops/moe_eager_nonzero.onnx")


def opset_models():
    """The ops of today's exporter at opsets 18..23 (cases-opsets.txt, opsets/)."""
    i64 = TensorProto.INT64
    data = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "x")
    idx = numpy_helper.from_array(np.array([[1, 3]], np.int64), "i")
    save(model([helper.make_node("GatherND", ["x", "i"], ["y"], name="gathernd")],
               [], [vi("y", [1])], [data, idx], opset=20), "opsets/gathernd_index.onnx")
    # indices known at run time only: the Gather that GatherND lowers onto reports the tuple
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    save_run(model([helper.make_node("GatherND", ["x", "i"], ["y"], name="gathernd")],
                   [vi("x", [2, 3]), vi("i", [1, 2], i64)], [vi("y", [1])], opset=20),
             "opsets/gathernd_runtime", [("x", x), ("i", np.array([[0, 4]], np.int64))],
             [("y", np.zeros(1, np.float32))])
    save(model([helper.make_node("GatherND", ["x", "i"], ["y"], name="gathernd", batch_dims=1)],
               [vi("x", [2, 3]), vi("i", [3, 1], i64)], [vi("y", [3])], opset=20), "opsets/gathernd_batch.onnx")
    save(model([helper.make_node("RMSNormalization", ["x", "scale"], ["y"], name="rms", axis=-1)],
               [vi("x", [2, 3, 4]), vi("scale", [3])], [vi("y", [2, 3, 4])], opset=23), "opsets/rms_scale.onnx")
    cache = numpy_helper.from_array(np.ones((8, 3), np.float32), "cos")
    save(model([helper.make_node("RotaryEmbedding", ["x", "cos", "cos", "pos"], ["y"], name="rotary")],
               [vi("x", [1, 2, 4, 8]), vi("pos", [1, 4], i64)], [vi("y", [1, 2, 4, 8])], [cache], opset=23),
         "opsets/rotary_cache.onnx")
    first = numpy_helper.from_array(np.array(2, np.int64), "at")
    save(model([helper.make_node("SplitToSequence", ["x"], ["seq"], name="split", axis=0),
                helper.make_node("SequenceAt", ["seq", "at"], ["y"], name="at")],
               [vi("x", [2, 3])], [vi("y", [1, 3])], [first], opset=20), "opsets/sequence_at_range.onnx")


if __name__ == "__main__":
    main()
