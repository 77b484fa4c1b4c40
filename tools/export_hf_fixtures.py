#!/work/hfvenv/bin/python
"""Export tiny random-weight Hugging Face causal LMs the way a user does, with references.

Each architecture becomes tests/fixtures/hf_<arch>/ in the layout of the GPT fixtures
(export_gpt_fixtures.py, make_parity_fixtures.py, whose helpers this script imports):
    model.onnx                  torch.onnx.export of a wrapper returning the logits: one dummy
                                input_ids [2, 16], opset 17, fixed shapes, constant folding
    test_data_set_0/input_0.pb  token ids, int64 [2, 16]
    test_data_set_0/output_0.pb PyTorch's logits, float32 [2, 16, 128]
    train/                      train.bin, grads.safetensors, losses.jsonl, args: the
                                references of 10 AdamW steps (see make_parity_fixtures.py)

The models are built from configs (no model hub): 3 layers, hidden 32, 4 heads, vocab 128,
eager attention, no cache; each keeps its architecture's defaults for biases, tied heads,
norms and rotary fractions. Weights are redrawn from a seeded generator (matrices N(0,
1/fan), biases N(0, 0.1), norm scales N(1, 0.2)) so every bias and norm is seen in the
logits and no two initializers are equal. Float buffers the exporter writes as
initializers (rotary inv_freq, masks, ALiBi slopes, folded tables) are not parameters: the
train/args tokpipec line freezes them by name (--freeze) so exactly PyTorch's parameters
train.

The venv (Debian 12's python3-torch 1.13 and python3-onnx, transformers from PyPI;
huggingface-hub must be pinned, transformers 4.40.2 does not work with newer ones):
    python3 -m venv --system-site-packages /work/hfvenv
    /work/hfvenv/bin/pip install transformers==4.40.2 huggingface-hub==0.23.4 tokenizers==0.19.1
Regenerate (deterministic, one thread; rewrites every tests/fixtures/hf_*):
    /work/hfvenv/bin/python tools/export_hf_fixtures.py [ARCH...]
"""
import io
import math
import os
import re
import shutil
import sys
import warnings

import onnx
import torch
import transformers as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export_gpt_fixtures as fx  # noqa: E402  (saving tensors, op histograms, ROOT)
import make_parity_fixtures as parity  # noqa: E402  (training references)

B, T, VOCAB, OPSET = 2, 16, 128, 17
# 3 layers (3 pipeline stages), hidden 32, 4 heads; a positions table longer than T
LLAMA_LIKE = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                  num_attention_heads=4, max_position_embeddings=64)
ARCHS = {   # name -> (config class, config arguments)
    "gpt2": (tf.GPT2Config, dict(vocab_size=VOCAB, n_embd=32, n_layer=3, n_head=4,
                                 n_positions=64)),
    # layers 0 and 2 global, layer 1 local with a window of 8 < T
    "gpt_neo": (tf.GPTNeoConfig, dict(vocab_size=VOCAB, hidden_size=32, num_layers=3,
                                      num_heads=4,
                                      attention_types=[[["global", "local"], 1], [["global"], 1]],
                                      window_size=8, max_position_embeddings=64)),
    # rotary on 25% of each head (rotary_pct default), parallel residual, untied head
    "gpt_neox": (tf.GPTNeoXConfig, dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=3,
                                        num_attention_heads=4, intermediate_size=64,
                                        max_position_embeddings=64)),
    # learned positions offset by 2 from a CumSum of the attention mask
    "opt": (tf.OPTConfig, dict(vocab_size=VOCAB, hidden_size=32, ffn_dim=64, num_hidden_layers=3,
                               num_attention_heads=4, max_position_embeddings=64,
                               word_embed_proj_dim=32)),
    # ALiBi, embedding LayerNorm
    "bloom": (tf.BloomConfig, dict(vocab_size=VOCAB, hidden_size=32, n_layer=3, n_head=4)),
    # interleaved rotary on 4 of 8 head dims, parallel attention and MLP, head with bias
    "gptj": (tf.GPTJConfig, dict(vocab_size=VOCAB, n_embd=32, n_layer=3, n_head=4, rotary_dim=4,
                                 n_positions=64)),
    # grouped K/V: 4 query heads, 2 K/V heads
    "llama": (tf.LlamaConfig, dict(LLAMA_LIKE, num_key_value_heads=2)),
    # grouped K/V and a sliding window of 8 < T
    "mistral": (tf.MistralConfig, dict(LLAMA_LIKE, num_key_value_heads=2, sliding_window=8)),
    # grouped K/V, Q/K/V biases
    "qwen2": (tf.Qwen2Config, dict(LLAMA_LIKE, num_key_value_heads=2)),
    # rotary on half of each head (partial_rotary_factor default), biases, head with bias
    "phi": (tf.PhiConfig, dict(LLAMA_LIKE)),
    # multi-query: one K/V head fused into the QKV projection; rotary
    "falcon": (tf.FalconConfig, dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=3,
                                     num_attention_heads=4, multi_query=True,
                                     new_decoder_architecture=False, alibi=False)),
    # multi-query, head_dim given, GELU-gated MLP, (1 + w) RMSNorm, scaled embeddings
    "gemma": (tf.GemmaConfig, dict(LLAMA_LIKE, num_key_value_heads=1, head_dim=8,
                                   hidden_activation="gelu_pytorch_tanh")),
    # ALiBi, no biases
    "mpt": (tf.MptConfig, dict(vocab_size=VOCAB, d_model=32, n_heads=4, n_layers=3,
                               expansion_ratio=2, max_seq_len=64)),
}


class LogitsOnly(torch.nn.Module):
    """What a user exports: the model called on input_ids alone, its logits returned."""

    def __init__(self, model):
        super().__init__()
        self.m = model

    def forward(self, input_ids):
        return self.m(input_ids=input_ids, use_cache=False, return_dict=False)[0]


def make_model(arch, seed):
    """The fixture's model: the same weights on every call (eval: no dropout)."""
    cls, kw = ARCHS[arch]
    config = cls(**kw)
    config.use_cache = False
    torch.manual_seed(seed)
    model = tf.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    redraw(model, seed)
    return LogitsOnly(model).eval()


def redraw(model, seed):
    """Weights from a seeded generator: matrices N(0, 1/fan), biases N(0, 0.1), norm scales
    N(1, 0.2), so every bias and norm shows in the logits and no two initializers are equal."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[-1]))
            elif name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
            else:
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=gen))


def export(model, path):
    """The user's call: torch.onnx.export with the defaults (fixed shapes, constant folding)."""
    buf = io.BytesIO()
    torch.onnx.export(model, (torch.zeros(B, T, dtype=torch.long),), buf, opset_version=OPSET,
                      input_names=["input_ids"], output_names=["logits"])
    proto = onnx.load_from_string(buf.getvalue())
    onnx.checker.check_model(proto)
    onnx.save_model(proto, path)
    return proto


def freeze_regex(proto, forms):
    """A POSIX ERE matching exactly the float initializers that are no torch parameter
    (None when there is none). No spaces: parity.sh splits the args line on them."""
    names = sorted(i.name for i in proto.graph.initializer
                   if i.data_type == onnx.TensorProto.FLOAT and i.name not in forms)
    if not names:
        return None
    escaped = [re.sub(r"([.^$*+?()\[\]{}|\\])", r"\\\1", n) for n in names]
    assert not any(" " in n for n in escaped), names
    return "^(" + "|".join(escaped) + ")$"


def main():
    torch.set_num_threads(1)   # fixed summation order: byte-identical outputs across runs
    warnings.filterwarnings("ignore")   # tracer warnings: the shapes are static here
    archs = sys.argv[1:] or list(ARCHS)
    unknown = sorted(set(archs) - set(ARCHS))
    if unknown:
        sys.exit(f"export_hf_fixtures.py: unknown architecture {unknown[0]} (known: {' '.join(ARCHS)})")
    for seed, arch in enumerate(ARCHS):   # the seed: the architecture's place in ARCHS
        if arch not in archs:
            continue
        name = f"hf_{arch}"
        dir = os.path.join(fx.ROOT, name)
        shutil.rmtree(dir, ignore_errors=True)
        os.makedirs(os.path.join(dir, "test_data_set_0"))
        model = make_model(arch, seed)
        with torch.no_grad():
            proto = export(model, os.path.join(dir, "model.onnx"))
            gen = torch.Generator().manual_seed(1000 + seed)
            idx = torch.randint(0, VOCAB, (B, T), generator=gen)
            logits = model(idx)
            # float32 rounding spread: how far float32 lands from a float64 evaluation
            with parity.default_dtype(torch.float64):
                spread = (model.double()(idx).double() - logits.double()).abs().max().item()
            model.float()
        data = os.path.join(dir, "test_data_set_0")
        fx.save_tensor(idx.numpy(), os.path.join(data, "input_0.pb"), "input_ids")
        fx.save_tensor(logits.numpy(), os.path.join(data, "output_0.pb"), "logits")
        print(f"{name}: {len(proto.graph.node)} nodes, |logits|max={logits.abs().max().item():.3g}"
              f", f32-vs-f64 {spread:.2g}")
        print(f"  {fx.histogram(proto)}")

        forms = parity.onnx_params(proto, model)
        freeze = freeze_regex(proto, forms)
        parity.write_references(dir, name, lambda: make_model(arch, seed), proto, B, T, VOCAB,
                                seed, parity.ADAMW, ["--freeze", freeze] if freeze else [])


if __name__ == "__main__":
    main()
