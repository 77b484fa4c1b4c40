#!/usr/bin/python3
"""Writes the importer fuzzer's seed corpus (committed): small ONNX node tests, the
bad-input models, and two tiny GPT exports with dynamic axes (shape arithmetic to fold).
Regenerate: /usr/bin/python3 tests/fuzz/make_corpus.py"""
import glob
import io
import os
import shutil
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
NODE = "/usr/share/libonnx-testdata/data/node"
NODE_TESTS = """add matmul_2d gemm_all_attributes reshape_negative_dim slice_neg_steps
split_variable_parts_2d squeeze unsqueeze_two_axes expand_dim_changed where_example equal
cast_FLOAT_to_DOUBLE shape_start_1 range_int32_type_negative_delta tril_neg
constantofshape_int_zeros identity dropout_default_mask softmax_axis_1 logsoftmax_axis_0
reduce_mean_keepdims_example reduce_sum_keepdims_example layer_normalization_3d_axis1_epsilon
sce_mean_weight nllloss_NCd1_ii transpose_all_permutations_0 concat_3d_axis_negative_1
gather_negative_indices pow_types_float32_int64 erf""".split()


def main():
    corpus = os.path.join(HERE, "corpus")
    shutil.rmtree(corpus, ignore_errors=True)
    os.makedirs(corpus)
    for t in NODE_TESTS:
        shutil.copy(os.path.join(NODE, "test_" + t, "model.onnx"), os.path.join(corpus, t + ".onnx"))
    for f in glob.glob(os.path.join(ROOT, "tests", "bad-input", "*.onnx")):
        shutil.copy(f, os.path.join(corpus, "bad_" + os.path.basename(f)))
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import export_gpt_fixtures as gpt  # the fixture exporter's model and export()
    tiny = dict(vocab=8, block=8, n_layer=1, n_head=2, n_embd=4, trace_bt=(2, 3), dynamic=True)
    for v in (gpt.Variant("gpt_tiny_o14", opset=14, mask="range", **tiny),
              gpt.Variant("gpt_tiny_o17", opset=17, mask="trilu_add", gelu="tanh", **tiny)):
        torch.manual_seed(0)
        tmp = os.path.join(corpus, v.name)
        os.makedirs(tmp)
        with torch.no_grad():
            gpt.export(v, gpt.GPT(v).eval(), tmp)
        os.rename(os.path.join(tmp, "model.onnx"), tmp + ".onnx")
        os.rmdir(tmp)


if __name__ == "__main__":
    main()
