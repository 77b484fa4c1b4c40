#!/work/venv26/env/bin/python
"""Export tiny Hugging Face causal LMs with today's torch.onnx.export at each opset 18..23.

Each fixture becomes tests/fixtures/opsets/<name>/ (one level below the other fixtures, so
the areas that take every tests/fixtures/*/ do not pick these up; tests/fixtures, parity
and matrix register their own checks of these):
    model.onnx                  torch.onnx.export(..., dynamo=True, opset_version=K,
                                external_data=False) of a wrapper returning the logits: one
                                input_ids [2, 16], fixed shapes; the exporter's optimizer on
                                unless the name ends in _noopt (optimize=False: CastLike, ...);
                                names ending in _ts: the TorchScript exporter (dynamo=False),
                                whose wrapper passes an all-ones attention_mask, as
                                transformers 5 needs there
    test_data_set_0/input_0.pb  token ids, int64 [2, 16]
    test_data_set_0/output_0.pb PyTorch's logits, float32 [2, 16, 128]
    train/                      for the fixtures in TRAINED: the references of 10 AdamW
                                steps (make_parity_fixtures.py), parameters mapped to
                                initializers by the dynamo metadata (export_hf26_fixtures.py)

The models are built from configs (no model hub): 2 layers, hidden 32, 4 heads, vocab 128,
no cache, eager attention unless the name ends in _sdpa (transformers' default: below
opset 23 torch decomposes it, with an IsNaN guard; at 23 it emits ONNX's Attention). The
weights are redrawn from a seeded generator (export_hf_fixtures.redraw) so every norm scale
and bias shows in the logits. What each fixture covers is in FIXTURES. To keep the files
small, the node metadata the importer does not read (stack traces, class hierarchies, name
scopes, namespaces: over half of each file) is dropped; each node's pkg.torch.onnx.fx_node
and the graph's value_info metadata (parameter, buffer or constant) are kept as exported.

The venv (today's toolchain; the CUDA wheels work on a CPU, about 6 GB):
    python3 -m venv /work/venv26/env
    /work/venv26/env/bin/pip install torch==2.15.0 transformers==5.25.0 onnx onnxscript
Regenerate (deterministic, one thread; rewrites the named fixtures, or all):
    /work/venv26/env/bin/python tools/export_opset_fixtures.py [NAME...]
"""
import contextlib
import io
import os
import shutil
import sys
import warnings
from collections import Counter

import onnx
import torch
import transformers as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export_gpt_fixtures as fx  # noqa: E402  (saving tensors)
import export_hf_fixtures as hf  # noqa: E402  (weight redraw)
import export_hf26_fixtures as hf26  # noqa: E402  (the logits wrapper, parameters of a dynamo export)
import make_parity_fixtures as parity  # noqa: E402  (training references)

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "opsets")
B, T, VOCAB = 2, 16, 128
LLAMA_LIKE = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, max_position_embeddings=64)
ARCHS = {  # name -> (config class, config arguments)
    # Conv1D heads (Gemm), gelu_new decomposed, tied head, Split num_outputs
    "gpt2": (tf.GPT2Config, dict(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64)),
    # fused QKV sliced, fused gate/up split, grouped K/V
    "phi3": (tf.Phi3Config, dict(LLAMA_LIKE, num_key_value_heads=2, pad_token_id=0)),
    # llama3 rope scaling, grouped K/V
    "llama3": (tf.LlamaConfig, dict(LLAMA_LIKE, num_key_value_heads=2,
                                    rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                                      high_freq_factor=4.0,
                                                      original_max_position_embeddings=16))),
    # soft-capping (attention and logits), window 8 < T, (1 + w) norms, multi-query, tanh GELU
    "gemma2": (tf.Gemma2Config, dict(LLAMA_LIKE, num_key_value_heads=1, head_dim=8, sliding_window=8)),
    # partial rotary (25%), parallel residual, erf GELU, LayerNorm
    "gpt_neox": (tf.GPTNeoXConfig, dict(LLAMA_LIKE)),
    # per-head q/k RMSNorm, head_dim given
    "qwen3": (tf.Qwen3Config, dict(LLAMA_LIKE, num_key_value_heads=2, head_dim=8)),
    "tiny_sdpa": None,  # TinySdpa below: no Hugging Face model emits these forms
}


class TinySdpa(torch.nn.Module):
    """Two pre-norm attention blocks written with torch's own modules: nn.RMSNorm
    (RMSNormalization at opset 23) and F.scaled_dot_product_attention(is_causal=True,
    enable_gqa=True) (Attention {is_causal = 1} on 4 query and 2 K/V heads). Called as
    LogitsOnly calls a Hugging Face model."""

    def __init__(self, vocab=VOCAB, hidden=32, heads=4, kv_heads=2, layers=2):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, hidden // heads
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.blocks = torch.nn.ModuleList(torch.nn.ModuleDict(dict(
            norm=torch.nn.RMSNorm(hidden, eps=1e-5), q=torch.nn.Linear(hidden, hidden),
            kv=torch.nn.Linear(hidden, 2 * kv_heads * self.head_dim), o=torch.nn.Linear(hidden, hidden)))
            for _ in range(layers))
        self.norm = torch.nn.RMSNorm(hidden, eps=1e-5)
        self.head = torch.nn.Linear(hidden, vocab)

    def forward(self, input_ids, attention_mask=None, use_cache=False, return_dict=False):
        x = self.embed(input_ids)
        b, t, c = x.shape
        for block in self.blocks:
            h = block["norm"](x)
            q = block["q"](h).view(b, t, self.heads, self.head_dim).transpose(1, 2)
            kv = block["kv"](h).view(b, t, 2, self.kv_heads, self.head_dim)
            k, v = (z.transpose(1, 2) for z in kv.unbind(2))
            y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            x = x + block["o"](y.transpose(1, 2).reshape(b, t, c))
        return (self.head(self.norm(x)),)


# name -> (architecture, opset, attention implementation, exporter: dynamo, dynamo-noopt
# (optimize=False) or torchscript). New ones go last: a fixture's seed is its place here.
FIXTURES = {
    "o18_gpt2": ("gpt2", 18, "eager", "dynamo"),
    "o18_llama3_noopt": ("llama3", 18, "eager", "dynamo-noopt"),
    "o19_phi3": ("phi3", 19, "eager", "dynamo"),
    "o20_llama3": ("llama3", 20, "eager", "dynamo"),  # the exporter's default opset
    "o21_gemma2": ("gemma2", 21, "eager", "dynamo"),
    "o22_gpt_neox": ("gpt_neox", 22, "eager", "dynamo"),
    "o23_qwen3": ("qwen3", 23, "eager", "dynamo"),  # RMSNormalization (also on per-head q/k)
    "o23_gemma2": ("gemma2", 23, "eager", "dynamo"),  # RMSNormalization of a (1 + w) scale, Gelu
    "o23_llama3_sdpa": ("llama3", 23, "sdpa", "dynamo"),  # ONNX Attention, grouped K/V
    "o23_llama3_noopt": ("llama3", 23, "eager", "dynamo-noopt"),
    "o20_llama3_sdpa": ("llama3", 20, "sdpa", "dynamo"),  # a user's defaults: IsNaN-guarded softmax
    "o18_llama3_ts": ("llama3", 18, "eager", "torchscript"),
    "o23_gpt2_ts": ("gpt2", 23, "eager", "torchscript"),
    "o21_phi3_noopt": ("phi3", 21, "eager", "dynamo-noopt"),  # SplitToSequence, SequenceAt
    "o23_tiny_sdpa": ("tiny_sdpa", 23, "sdpa", "dynamo"),  # Attention {is_causal = 1}, GQA
}
# Trained too (parity/opsets/<name>): ONNX's RMSNormalization and Attention imported directly.
TRAINED = {"o23_qwen3", "o23_llama3_sdpa", "o23_tiny_sdpa"}

DROPPED_METADATA = {"pkg.torch.onnx.stack_trace", "pkg.torch.onnx.class_hierarchy", "pkg.torch.onnx.name_scopes",
                    "namespace"}


def make_model(arch, attn, with_mask, seed):
    torch.manual_seed(seed)
    if arch == "tiny_sdpa":
        model = TinySdpa()
    else:
        cls, kw = ARCHS[arch]
        config = cls(**kw)
        config.use_cache = False
        model = tf.AutoModelForCausalLM.from_config(config, attn_implementation=attn)
    hf.redraw(model, seed)
    return hf26.LogitsOnly(model, with_mask).eval()


def main():
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    names = sys.argv[1:] or list(FIXTURES)
    unknown = sorted(set(names) - set(FIXTURES))
    if unknown:
        sys.exit(f"export_opset_fixtures.py: unknown fixture {unknown[0]} (known: {' '.join(FIXTURES)})")
    for seed, name in enumerate(FIXTURES):
        if name not in names:
            continue
        arch, opset, attn, exporter = FIXTURES[name]
        dir = os.path.join(ROOT, name)
        shutil.rmtree(dir, ignore_errors=True)
        os.makedirs(os.path.join(dir, "test_data_set_0"))
        model = make_model(arch, attn, exporter == "torchscript", seed)
        path = os.path.join(dir, "model.onnx")
        dummy = (torch.zeros(B, T, dtype=torch.long),)
        with torch.no_grad(), contextlib.redirect_stdout(io.StringIO()):
            if exporter == "torchscript":
                torch.onnx.export(model, dummy, path, dynamo=False, opset_version=opset,
                                  input_names=["input_ids"], output_names=["logits"])
            else:
                torch.onnx.export(model, dummy, path, dynamo=True, opset_version=opset,
                                  optimize=exporter == "dynamo", external_data=False,
                                  input_names=["input_ids"], output_names=["logits"])
        proto = onnx.load(path)
        for node in proto.graph.node:
            keep = [p for p in node.metadata_props if p.key not in DROPPED_METADATA]
            del node.metadata_props[:]
            node.metadata_props.extend(keep)
        onnx.checker.check_model(proto)
        onnx.save_model(proto, path)
        gen = torch.Generator().manual_seed(1000 + seed)
        idx = torch.randint(0, VOCAB, (B, T), generator=gen)
        with torch.no_grad():
            logits = model(idx)
        data = os.path.join(dir, "test_data_set_0")
        fx.save_tensor(idx.numpy(), os.path.join(data, "input_0.pb"), "input_ids")
        fx.save_tensor(logits.numpy(), os.path.join(data, "output_0.pb"), "logits")
        ops = Counter(n.op_type for n in proto.graph.node)
        print(f"{name}: opset {proto.opset_import[0].version}, {len(proto.graph.node)} nodes, "
              f"{os.path.getsize(path)} bytes, |logits|max={logits.abs().max().item():.3g}")
        print("  " + " ".join(f"{op}:{n}" for op, n in sorted(ops.items())))
        if name in TRAINED:
            build = lambda: make_model(arch, attn, exporter == "torchscript", seed)  # noqa: E731
            parity.write_references(dir, name, build, proto, B, T, VOCAB, seed, parity.ADAMW, [],
                                    forms=hf26.dynamo_params(proto, model))


if __name__ == "__main__":
    main()
