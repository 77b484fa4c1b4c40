#!/bin/sh
# search_fields.sh PLAN WORK [tokpipe-plan options]: the layout search on one of the
# paper's settings (bench/plan_paper.sh's), checked field by field: the chosen layout is
# one of those listed, fits, multiplies to --gpus and divides the model; and its tokpipec
# command line parses back to the same plan (batch, stages and cuts, tensor, dp,
# microbatches, slices summing to the sequence, schedule).
plan=$1 work=$2
shift 2
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 2
"$plan" "$@" --json >out.json 2>err.txt || { echo "FAIL: tokpipe-plan: $(cat err.txt)"; exit 1; }
"$plan" "$@" >out.txt 2>err.txt || { echo "FAIL: tokpipe-plan (text): $(cat err.txt)"; exit 1; }
/usr/bin/python3 - "$@" <<'EOF'
import json, shlex, sys
args = sys.argv[1:]
gpus = int(args[args.index("--gpus") + 1])
d = json.load(open("out.json"))
m, j, s = d["model"], d["joint"], d["search"]
def fail(what):
    sys.exit("FAIL: " + what)
S, N, D = d["pipeline"], d["tensor"], d["data"]
chosen = [l for l in s["layouts"] if l["chosen"]]
if s["gpus"] != gpus or len(chosen) != 1: fail("search: gpus %s, %d chosen" % (s["gpus"], len(chosen)))
c = chosen[0]
if (c["pipeline"], c["tensor"], c["data"]) != (S, N, D): fail("the chosen layout %s is not the plan's %s" % (c, (S, N, D)))
if S * N * D != gpus or m["layers"] % S or m["heads"] % N or d["batch"] % D: fail("layout %d x %d x %d" % (S, N, D))
if not c["fits"] or c["iteration_time_s"] != j["iteration_time_s"]: fail("chosen layout %s, joint plan %s" % (c, j))
fastest = min(l["iteration_time_s"] for l in s["layouts"] if l["fits"])
if c["iteration_time_s"] != fastest: fail("chose %g s, the fastest layout takes %g s" % (c["iteration_time_s"], fastest))
# the command line, parsed back
words = shlex.split(j["tokpipec"])
if words[0] != "tokpipec" or words[-2:] != ["-o", "plan.c"]: fail("command: %s" % j["tokpipec"])
flags = dict(zip(words[2:-2:2], words[3:-2:2]))
want = {"--batch": d["batch"], "--stages": S, "--tensor": N, "--dp": D, "--microbatches": j["microbatches"],
        "--schedule": j["schedule"]}
for f, v in want.items():
    if flags.get(f) != str(v): fail("%s is %s in the command, %s in the plan" % (f, flags.get(f), v))
if j["microbatches"] * j["microbatch_size"] * D != d["batch"]: fail("microbatches x size x dp is not the batch")
lengths = j["slices"][0]["lengths"]
if any(mb["lengths"] != lengths or mb["size"] != j["microbatch_size"] for mb in j["slices"]): fail("microbatches differ")
got = [m["seq"]] if flags["--slices"] == "1" else [int(x) for x in flags["--slices"].split(",")]  # 1: one whole slice
if got != lengths or sum(lengths) != m["seq"]:
    fail("--slices %s, the plan's %s" % (flags["--slices"], lengths))
cuts = [int(x) for x in flags.get("--stage-cuts", "").split(",") if x]
if [0] + cuts != j["stage_cuts"] or len(cuts) != S - 1: fail("--stage-cuts %s, the plan's %s" % (cuts, j["stage_cuts"]))
text = open("out.txt").read()
if "compile it with: " + j["tokpipec"] not in text: fail("the text output lacks the command line")
print("ok: %d layouts, chose %d x %d x %d (%.4g s): %s" % (len(s["layouts"]), S, N, D, j["iteration_time_s"], j["tokpipec"]))
EOF
