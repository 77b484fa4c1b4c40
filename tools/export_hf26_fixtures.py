#!/work/venv26/env/bin/python
"""Export tiny random-weight Hugging Face causal LMs with today's toolchain, as users do in
late 2026, with PyTorch references; the sibling of export_hf_fixtures.py (torch 1.13).

Each (architecture, exporter) becomes tests/fixtures/hf26_<arch>_<d|t>/ in the layout of
the other fixtures (model.onnx, test_data_set_0/{input_0,output_0}.pb, train/):
    _d  torch.onnx.export(model, (input_ids,), path, dynamo=True): the default exporter of
        torch >= 2.9: opset 20, IR 10, weights in model.onnx.data (external data, the
        default), onnxscript's constant folding, metadata telling parameters apart. No
        --freeze: tokpipec trains exactly the parameters from that metadata.
    _t  dynamo=False (TorchScript), opset 17, with the all-ones attention_mask transformers
        5 needs there; float initializers that are no parameter are frozen by name
        (--freeze), as for the 2022 fixtures.
hf26_qwen2_fresh_d keeps transformers' own initialisation (zero biases, all-ones norms),
which the exporter merges into shared initializers: tokpipec must train them apart.

Models: 2 layers, hidden 32, 4 heads, vocab 128, eager attention (transformers' default,
sdpa, for the dynamo exports of SDPA below), no cache, B 2, T 16;
weights redrawn as in export_hf_fixtures.py so no two initializers are equal.

The venv (PyPI; about 6 GB, whose CUDA wheels run on a CPU):
    python3 -m venv /work/venv26/env
    /work/venv26/env/bin/pip install torch==2.15.0 transformers==5.25.0 onnx==1.23.2 \\
        onnxscript==0.7.2 onnxruntime
Regenerate (deterministic, one thread; rewrites the named fixtures, default all):
    /work/venv26/env/bin/python tools/export_hf26_fixtures.py [NAME...]   # e.g. llama3_d
"""
import contextlib
import io
import os
import re
import shutil
import sys
import warnings

import numpy as np
import onnx
import torch
import transformers as tf
from onnx import numpy_helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export_gpt_fixtures as fx  # noqa: E402  (saving tensors, op histograms, ROOT)
import export_hf_fixtures as hf  # noqa: E402  (weight redraw, freeze regex)
import make_parity_fixtures as parity  # noqa: E402  (training references)

B, T, VOCAB = 2, 16, 128
LLAMA_LIKE = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
ARCHS = {   # name -> (config class, config arguments, exporters)
    "llama3": (tf.LlamaConfig, dict(LLAMA_LIKE, rope_scaling=dict(
        rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=16)), "dt"),
    # tied head, Q/K/V biases
    "qwen2": (tf.Qwen2Config, dict(LLAMA_LIKE, tie_word_embeddings=True), "dt"),
    # per-head Q/K RMSNorm
    "qwen3": (tf.Qwen3Config, dict(LLAMA_LIKE, head_dim=8), "dt"),
    # attention soft-capping, final logit soft-capping, sliding window 8 < T, (1 + w) norms
    "gemma2": (tf.Gemma2Config, dict(LLAMA_LIKE, num_key_value_heads=1, head_dim=8,
                                     sliding_window=8), "dt"),
    "gemma3": (tf.Gemma3TextConfig, dict(LLAMA_LIKE, num_key_value_heads=1, head_dim=8,
                                         sliding_window=8), "dt"),
    # fused Q|K|V and gate|up products
    "phi3": (tf.Phi3Config, dict(LLAMA_LIKE, pad_token_id=0, eos_token_id=1, bos_token_id=1), "dt"),
    # norms after attention and MLP, Q/K norms over all heads
    "olmo2": (tf.Olmo2Config, dict(LLAMA_LIKE, pad_token_id=0, eos_token_id=1), "dt"),
    "mistral": (tf.MistralConfig, dict(LLAMA_LIKE, sliding_window=8), "dt"),
    # embedding, residual, attention and logit multipliers
    "granite": (tf.GraniteConfig, dict(LLAMA_LIKE, embedding_multiplier=2.0, residual_multiplier=0.5,
                                       attention_multiplier=0.3, logits_scaling=4.0), "dt"),
    # parallel attention and MLP, LayerNorm without bias; TorchScript fails on its Expand
    "cohere": (tf.CohereConfig, dict(LLAMA_LIKE, pad_token_id=0, bos_token_id=1, eos_token_id=2), "d"),
    # LayerNorm, partial rotary
    "stablelm": (tf.StableLmConfig, dict(LLAMA_LIKE), "dt"),
    # Conv1D, learned positions, tied head
    "gpt2": (tf.GPT2Config, dict(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64), "dt"),
    "gpt_neox": (tf.GPTNeoXConfig, dict(LLAMA_LIKE), "dt"),
    # mixtures of experts: softmax router, top-2 of 4 experts (Mixtral renormalises the two
    # weights, Qwen2-MoE adds a sigmoid-gated shared expert). transformers' default experts
    # (grouped_mm) fail in torch.export, its "eager" ones have data-dependent shapes there and
    # NonZero in TorchScript; "batched_mm" (MOE_EXPERTS) exports as TopK, a gather of each
    # token's expert weights (GatherND in dynamo, Gather and Tile in TorchScript) and
    # batched products
    "mixtral": (tf.MixtralConfig, dict(LLAMA_LIKE, num_local_experts=4, num_experts_per_tok=2), "dt"),
    "qwen2_moe": (tf.Qwen2MoeConfig, dict(LLAMA_LIKE, num_experts=4, num_experts_per_tok=2,
                                          moe_intermediate_size=32, shared_expert_intermediate_size=48), "dt"),
}
MOE_EXPERTS = {"mixtral": "batched_mm", "qwen2_moe": "batched_mm"}   # experts_implementation
FRESH = "qwen2_fresh"   # qwen2 with transformers' own init, dynamo only
# transformers' default attention (torch's scaled_dot_product_attention, decomposed by the
# dynamo exporter with its NaN guard and Q and K each scaled by sqrt(scale)) for these
# dynamo exports; the rest use eager attention
SDPA = {"llama3", "mistral", "gpt2"}
ROUTING_MARGINS = []    # per router call: its smallest gap between a token's k-th and (k+1)-th probability


def watch_routing(model):
    """Records in ROUTING_MARGINS how close each router call came to a tie: tokpipec breaks
    ties by lower index (ONNX's rule), torch's CPU topk otherwise, so the references must
    route no token on a tie (the redrawn weights make one unlikely; this proves there is none)."""
    for module in model.modules():
        if type(module).__name__.endswith("TopKRouter"):
            def margin(module, args, out):
                p = torch.softmax(out[0].detach().double(), -1).sort(-1, descending=True).values
                ROUTING_MARGINS.append((p[:, module.top_k - 1] - p[:, module.top_k]).min().item())
            module.register_forward_hook(margin)


class LogitsOnly(torch.nn.Module):
    """What a user exports: the logits of input_ids; with_mask passes the all-ones
    attention_mask the TorchScript exporter needs with transformers 5."""

    def __init__(self, model, with_mask):
        super().__init__()
        self.m = model
        self.with_mask = with_mask

    def forward(self, input_ids):
        mask = torch.ones_like(input_ids) if self.with_mask else None
        return self.m(input_ids=input_ids, attention_mask=mask, use_cache=False, return_dict=False)[0]


def make_model(arch, seed, with_mask, redraw=True, attention="eager"):
    cls, kw, _ = ARCHS[arch]
    config = cls(**kw)
    config.use_cache = False
    torch.manual_seed(seed)
    experts = {"experts_implementation": MOE_EXPERTS[arch]} if arch in MOE_EXPERTS else {}
    model = tf.AutoModelForCausalLM.from_config(config, attn_implementation=attention, **experts)
    if experts:
        watch_routing(model)
    if redraw:
        hf.redraw(model, seed)
    return LogitsOnly(model, with_mask).eval()


def export(model, path, dynamo):
    x = torch.zeros(B, T, dtype=torch.long)
    with contextlib.redirect_stdout(io.StringIO()):
        if dynamo:   # the defaults: opset 20, external data, optimized
            torch.onnx.export(model, (x,), path, dynamo=True, input_names=["input_ids"],
                              output_names=["logits"])
        else:
            torch.onnx.export(model, (x,), path, dynamo=False, opset_version=17,
                              input_names=["input_ids"], output_names=["logits"])
    proto = onnx.load(path)   # with its external data
    onnx.checker.check_model(path)
    return proto


def folded_source(proto):
    """initializer name -> the one dotted name it was folded from (dynamo metadata)."""
    out = {}
    for vi in proto.graph.value_info:
        for m in vi.metadata_props:
            if m.key == "pkg.onnxscript.optimizer.folded_from":
                dotted = [n for n in re.findall(r"'([^']*)'", m.value) if "." in n]
                if len(dotted) == 1:
                    out[vi.name] = dotted[0]
    return out


def dynamo_params(proto, model):
    """ONNX initializer name -> (torch parameter, form) for a dynamo export: a parameter's
    own name; a folded stand-in of one ('copy', 'T', '1+', or ('rows', n, shape): the first
    n rows, e.g. the positions table's rows for T, by its data); a parameter the
    exporter merged into another initializer is keyed by its own name, as tokpipec names
    the PARAM it gives it back."""
    inits = {i.name: numpy_helper.to_array(i) for i in proto.graph.initializer
             if i.data_type == onnx.TensorProto.FLOAT}
    tensors = dict(model.named_parameters(remove_duplicate=False))
    params = {k: p.detach().numpy() for k, p in tensors.items()}
    source = folded_source(proto)
    forms = {}
    for name, value in inits.items():
        if name in params:
            forms[name] = (name, "copy")
        elif source.get(name) in params:
            p = params[source[name]]
            rows = value.reshape(-1, p.shape[-1]) if p.ndim == 2 and value.size % p.shape[-1] == 0 else None
            form = ("copy" if p.shape == value.shape and np.array_equal(p, value) else
                    "T" if p.ndim == 2 and p.T.shape == value.shape and np.array_equal(p.T, value) else
                    "1+" if p.shape == value.shape and np.array_equal(p + np.float32(1), value) else
                    ("rows", rows.shape[0], value.shape)
                    if rows is not None and rows.shape[0] <= p.shape[0] and np.array_equal(p[:rows.shape[0]], rows)
                    else None)
            assert form, f"{name}: folded from {source[name]} in no known form"
            forms[name] = (source[name], form)
    # merged into another initializer: tokpipec's own PARAM again (a tied parameter's
    # other name is no parameter of its own)
    covered = {id(tensors[p]) for p, _ in forms.values()}
    for pname in params:
        if id(tensors[pname]) not in covered:
            forms[pname] = (pname, "copy")
            covered.add(id(tensors[pname]))
    return forms


def main():
    torch.set_num_threads(1)   # fixed summation order: byte-identical outputs across runs
    warnings.filterwarnings("ignore")
    jobs = [(a, e) for a in ARCHS for e in ARCHS[a][2]] + [(FRESH, "d")]
    names = [f"{a}_{e}" for a, e in jobs]
    wanted = sys.argv[1:] or names
    unknown = sorted(set(wanted) - set(names))
    if unknown:
        sys.exit(f"export_hf26_fixtures.py: unknown fixture {unknown[0]} (known: {' '.join(names)})")
    for (arch, exporter), name in zip(jobs, names):
        if name not in wanted:
            continue
        fresh = arch == FRESH
        base = "qwen2" if fresh else arch
        seed = 100 + list(ARCHS).index(base)
        dynamo = exporter == "d"
        attention = "sdpa" if dynamo and arch in SDPA else "eager"
        build = lambda: make_model(base, seed, not dynamo, redraw=not fresh, attention=attention)  # noqa: E731
        dir = os.path.join(fx.ROOT, f"hf26_{name}")
        shutil.rmtree(dir, ignore_errors=True)
        os.makedirs(os.path.join(dir, "test_data_set_0"))
        model = build()
        with torch.no_grad():
            proto = export(model, os.path.join(dir, "model.onnx"), dynamo)
            gen = torch.Generator().manual_seed(1000 + seed)
            idx = torch.randint(0, VOCAB, (B, T), generator=gen)
            logits = model(idx)
        data = os.path.join(dir, "test_data_set_0")
        fx.save_tensor(idx.numpy(), os.path.join(data, "input_0.pb"), "input_ids")
        fx.save_tensor(logits.numpy(), os.path.join(data, "output_0.pb"), "logits")
        print(f"hf26_{name}: {len(proto.graph.node)} nodes, |logits|max={logits.abs().max().item():.3g}")
        print(f"  {fx.histogram(proto)}")
        if dynamo:
            forms, flags = dynamo_params(proto, model), []
        else:   # no metadata: freeze the non-parameters and name the padding rows
            forms = parity.onnx_params(proto, model)
            freeze = hf.freeze_regex(proto, forms)
            flags = ["--freeze", freeze] if freeze else []
            for mname, mod in model.named_modules():
                if isinstance(mod, torch.nn.Embedding) and mod.padding_idx is not None:
                    table = [o for o, (p, f) in forms.items() if p == f"{mname}.weight" and f == "copy"]
                    flags += ["--padding-idx", f"{table[0]}={mod.padding_idx}"]
        ROUTING_MARGINS.clear()
        parity.write_references(dir, f"hf26_{name}", build, proto, B, T, VOCAB, seed, parity.ADAMW,
                                flags, forms=forms)
        if base in MOE_EXPERTS:   # every forward of the 10 training steps, float32 and float64
            margin = min(ROUTING_MARGINS)
            print(f"  routing: the closest call to a tie over {len(ROUTING_MARGINS)} router calls: {margin:.3g}")
            assert margin > 1e-4, f"hf26_{name}: a token's k-th and (k+1)-th router scores are {margin:.3g} apart"


if __name__ == "__main__":
    main()
