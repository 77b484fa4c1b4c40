# lit configuration of tokpipec's FileCheck tests. Run through ctest (`ctest -R lit`) or
# directly: python3 /usr/lib/llvm-14/build/utils/lit/lit.py -sv BUILD/tests/lit
import os

import lit.formats

config.name = "tokpipe"
config.test_format = lit.formats.ShTest(execute_external=True)
config.suffixes = [".tir", ".test"]
config.excludes = ["Inputs"]
config.test_source_root = os.path.dirname(os.path.abspath(__file__))
config.test_exec_root = config.tokpipe_lit_exec_dir

# FileCheck, not and split-file from llvm-14-tools come first on PATH.
config.environment["PATH"] = os.pathsep.join([config.llvm_tools_dir, config.environment.get("PATH", "")])

config.substitutions.append(("%tokpipe-opt", os.path.join(config.tokpipe_bin_dir, "tokpipe-opt")))
config.substitutions.append(("%tokpipe-plan", os.path.join(config.tokpipe_bin_dir, "tokpipe-plan")))
config.substitutions.append(("%tokpipec", os.path.join(config.tokpipe_bin_dir, "tokpipec")))
config.substitutions.append(("%tokpipe-run", os.path.join(config.tokpipe_bin_dir, "tokpipe-run")))
config.substitutions.append(("%fixtures", os.path.join(config.tokpipe_source_dir, "tests", "fixtures")))
config.substitutions.append(("%padding", os.path.join(config.tokpipe_source_dir, "tests", "padding")))

# Under the sanitizers a report must abort (a signal), so that `not` and exit-code checks
# cannot mistake it for an ordinary error exit.
for var in ("ASAN_OPTIONS", "UBSAN_OPTIONS"):
    config.environment[var] = ":".join(filter(None, [os.environ.get(var), "abort_on_error=1"]))
