#!/usr/bin/python3
"""Writes the textual IR fuzzer's seed corpus (corpus_tir/, committed): the IR of the lit
tests (each split-file part on its own, comments dropped), and a small trained GPT's IR
(raised, loss, gradients; and staged, sliced, split over tensor ranks, and all three, as
tokpipec prints them) with its weights made inline constants, since the fuzzer takes no
blob files, and a small residual network cut into stages (boundary, tied and re-tie
placement). Regenerate: /usr/bin/python3 tests/fuzz/make_corpus_tir.py BUILD_DIR"""
import glob
import os
import re
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def main():
    out = os.path.join(HERE, "corpus_tir")
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    lit = os.path.join(ROOT, "tests", "lit")
    for f in sorted(glob.glob(os.path.join(lit, "*.tir"))) + [os.path.join(lit, "Inputs", "relu.tir")]:
        text = open(f).read()
        base = os.path.basename(f)[:-4]
        parts = re.split(r"^//--- (\S+)\n", text, flags=re.M)
        if len(parts) > 1:
            for name, body in zip(parts[1::2], parts[2::2]):
                if name.endswith(".tir"):
                    open(os.path.join(out, f"{base}-{name}"), "w").write(body)
        else:
            open(os.path.join(out, base + ".tir"), "w").write(
                "".join(l for l in text.splitlines(True) if not l.startswith("//")))
    # the GPT's IR as tokpipec prints it at each stage of its pipeline: trained, then staged,
    # sliced, split over tensor ranks, and all three
    # (the 4-layer GPT of tests/stages for those with stages)
    deep = [os.path.join(ROOT, "tests", "stages", "deep_gpt.onnx"), "--batch", "2", "--seq", "4"]
    tiny = [os.path.join(HERE, "corpus", "gpt_tiny_o17.onnx"), "--batch", "2", "--seq", "3"]
    for name, options in [("tiny_trained", tiny), ("tiny_sliced", tiny + ["--slices", "2"]),
                          ("tiny_sharded", tiny + ["--tensor", "2"]), ("deep_staged", deep + ["--stages", "2"]),
                          ("deep_sharded_staged_sliced", deep + ["--tensor", "2", "--stages", "2", "--slices", "2"])]:
        tir = subprocess.run([os.path.join(sys.argv[1], "bin", "tokpipec")] + options,
                             check=True, capture_output=True, text=True).stdout
        tir = re.sub(r"= blob \d+ offset \d+ size \d+", "= dense<0.5>", tir)
        open(os.path.join(out, f"gpt_{name}.tir"), "w").write(re.sub(r"^blob .*\n", "", tir, flags=re.M))
    staged = subprocess.run([os.path.join(sys.argv[1], "bin", "tokpipe-opt"), os.path.join(out, "stages-assign-res.tir"),
                             "--passes=retie-params,add-loss,assign-stages,autodiff,finish-stages,dce", "--stages", "2"],
                            check=True, capture_output=True, text=True).stdout
    open(os.path.join(out, "stages-assign-res-staged.tir"), "w").write(staged)


if __name__ == "__main__":
    main()
