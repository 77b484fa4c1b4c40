"""Writes tests/slicing/encoder.onnx: a one-layer bidirectional (non-causal) self-attention
encoder with an LM-style head, [batch, seq] token ids -> [batch, seq, vocab] logits. It
trains whole, and tokpipec must refuse to slice it (tests/lit/slicing-cli.test).
Run with Debian's /usr/bin/python3 (torch, onnx): python3 tests/slicing/make_encoder.py"""
import os

import torch

torch.manual_seed(0)


class Encoder(torch.nn.Module):
    def __init__(self, vocab=11, hidden=8, seq=6):
        super().__init__()
        self.wte = torch.nn.Embedding(vocab, hidden)
        self.wpe = torch.nn.Parameter(torch.randn(seq, hidden) * 0.1)
        self.ln = torch.nn.LayerNorm(hidden)
        self.qkv = torch.nn.Linear(hidden, 3 * hidden)
        self.head = torch.nn.Linear(hidden, vocab)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe
        q, k, v = self.qkv(self.ln(x)).split(x.shape[-1], dim=2)
        att = torch.softmax(q @ k.transpose(1, 2) / q.shape[-1] ** 0.5, dim=-1)  # every token sees every token
        return self.head(x + att @ v)


out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "encoder.onnx")
torch.onnx.export(Encoder(), (torch.zeros(2, 6, dtype=torch.long),), out, input_names=["idx"],
                  output_names=["logits"], opset_version=17)
print("wrote", out)
