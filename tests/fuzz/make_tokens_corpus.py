#!/usr/bin/python3
"""Writes the token-file fuzzer's seed corpus (committed, tests/fuzz/corpus_tokens): small
token files in llm.c's format, good and bad. Header words 3..6 (0 in real files) set the
fuzz target's id limit, batch shape, position and truncation (see fuzz_tokens.c).
Regenerate: /usr/bin/python3 tests/fuzz/make_tokens_corpus.py"""
import os
import struct

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus_tokens")


def token_file(tokens, magic=20240520, version=1, count=None, extra=(0, 0, 0, 0)):
    header = [magic, version, len(tokens) if count is None else count, *extra]
    header += [0] * (256 - len(header))
    return struct.pack("<256i", *header) + struct.pack("<%dH" % len(tokens), *tokens)


text = [ord(c) for c in "the quick brown fox jumps over the lazy dog"]
seeds = {
    "good": token_file(text),
    "good_limit_batch": token_file(text, extra=(255, 0x0301, 7, 1030)),
    "too_few": token_file(text[:9], extra=(200, 0x0f03, 5, 0)),
    "out_of_range": token_file(text, extra=(100, 0x0100, 3, 2000)),
    "wrong_magic": token_file(text, magic=1234),
    "wrong_version": token_file(text, version=2),
    "count_too_big": token_file(text, count=100),
    "negative_count": token_file(text, count=-1),
    "odd_size": token_file(text) + b"\x01",
    "header_only": token_file([]),
    "short_header": token_file(text)[:100],
    "empty": b"",
}
os.makedirs(HERE, exist_ok=True)
for name, data in seeds.items():
    with open(os.path.join(HERE, name + ".bin"), "wb") as f:
        f.write(data)
