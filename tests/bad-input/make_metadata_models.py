#!/work/venv26/env/bin/python
"""The bad-input models that need ONNX IR 10 metadata_props (onnx >= 1.16: the venv of
tools/export_hf26_fixtures.py; Debian's python3-onnx predates them). Run from anywhere."""
import os
import onnx, onnx.helper as h, numpy as np
from onnx import TensorProto, numpy_helper
W = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "val_7")
X = h.make_tensor_value_info("x", TensorProto.FLOAT, [4, 2])
Y = h.make_tensor_value_info("y", TensorProto.FLOAT, [4, 3])
node = h.make_node("MatMul", ["x", "val_7"], ["y"], name="node_linear")
g = h.make_graph([node], "g", [X], [Y], initializer=[W])
vi = h.make_tensor_value_info("val_7", TensorProto.FLOAT, [2, 3])
vi.metadata_props.add(key="pkg.onnxscript.optimizer.folded_from", value="['m.a.weight', 'm.b.weight', 'cat']")
kind = h.make_tensor_value_info("m.c.weight", TensorProto.FLOAT, [2])
kind.metadata_props.add(key="pkg.torch.export.graph_signature.InputSpec.kind", value="PARAMETER")
g.value_info.extend([vi, kind])
m = h.make_model(g, opset_imports=[h.make_opsetid("", 20)], ir_version=10)
onnx.save(m, os.path.join(os.path.dirname(os.path.abspath(__file__)), "folded_two_params.onnx"))
