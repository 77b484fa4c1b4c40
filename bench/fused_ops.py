#!/usr/bin/python3
"""Export the Llama-shaped model of bench/fused_ops.sh: Hugging Face's LlamaConfig (random
init, 4 layers, hidden 256, 8 heads, SwiGLU 688, vocab 256), exported as a user exports a
causal LM (torch.onnx.export, opset 17, fixed [B, T] input_ids, logits out).
Needs transformers (e.g. /work/hfvenv/bin/python):  fused_ops.py OUT.onnx B T"""
import sys
import warnings

import torch
import transformers as tf

warnings.filterwarnings("ignore")
out, B, T = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.manual_seed(0)
cfg = tf.LlamaConfig(vocab_size=256, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                     num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=T)
cfg.use_cache = False
model = tf.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()


class Logits(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, ids):
        return self.m(input_ids=ids, use_cache=False, return_dict=False)[0]


torch.onnx.export(Logits(model), (torch.randint(0, 256, (B, T)),), out, input_names=["input_ids"],
                  output_names=["logits"], opset_version=17)
