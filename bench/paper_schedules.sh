#!/bin/sh
# Schedules on the TeraPipe paper's settings (its table of GPT-3 settings with reported
# times: 1, 5, 6, 8, 9, 10; bench/plan_paper.sh has the layouts): the paper's layout
# (pipeline S x tensor N x data D, its batch) and TeraPipe's slicing (tokpipe-plan's Eq. 5
# optimum; one hardware profile, tools/profiles/p3.16xlarge.json), each event-simulated
# under every schedule of --schedules (default gpipe, 1f1b, zb, interleaved:2: interleaved
# with --chunks 2, where the layers allow 2 chunks per rank), beside the paper's reported
# iteration time with TeraPipe (gpipe). The simulated time of each schedule is printed with
# its ratio to 1f1b's; gpipe's is the paper's own schedule. The slicing is the same for all
# (solved under gpipe's Eq. 5): what changes is only the order of the per-rank lists (and
# the memory a schedule keeps: a plan over the V100's 16 GiB on some rank is marked).
# usage: bench/paper_schedules.sh [BUILD_DIR] [--settings 1,5,..] [--schedules gpipe,1f1b,zb,interleaved:V]
#                                 [-- extra tokpipe-plan options]
build=build settings=1,5,6,8,9,10 schedules=gpipe,1f1b,zb,interleaved:2
case $1 in -*|'') ;; *) build=$1; shift ;; esac
while [ $# -gt 0 ]; do
  case $1 in
  --settings) settings=$2; shift 2 ;;
  --schedules) schedules=$2; shift 2 ;;
  --) shift; break ;;
  *) echo "paper_schedules.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done
extra="$*"
plan=$build/bin/tokpipe-plan
[ -x "$plan" ] || { echo "paper_schedules.sh: $plan not built" >&2; exit 2; }

# setting N: "model batch data pipe tensor reported_with_terapipe" (sequence 2048)
setting() {
  case $1 in
  1) echo gpt3-1b 128 8 24 1 1.254 ;;
  5) echo layers=40,hidden=5120,heads=40,seq=2048,vocab=50257 32 1 40 8 1.328 ;;
  6) echo gpt3-44b 8 4 96 1 7.103 ;;
  8) echo gpt3-44b 8 1 48 8 1.111 ;;
  9) echo gpt3-175b 2 1 96 4 1.481 ;;
  10) echo gpt3-175b 2 1 48 8 1.160 ;;
  *) echo "paper_schedules.sh: no setting '$1' with reported times (1, 5, 6, 8, 9, 10)" >&2; exit 2 ;;
  esac
}
for s in $(echo "$settings" | tr , ' '); do setting "$s" >/dev/null || exit 2; done
field() { sed -n "s/^  \"$1\": \([-0-9.e+]*\),\{0,1\}$/\1/p"; }

echo "Simulated iteration time (s) of TeraPipe's slicing on the paper's layouts, per schedule"
echo "(p3.16xlarge profile); x 1f1b = the schedule's time / 1f1b's; ! = over 16 GiB on some rank"
printf '%-7s %-9s %5s %-9s %8s' setting model batch SxNxD paper
for k in $(echo "$schedules" | tr , ' '); do printf ' | %-8s %7s' "$k" "x 1f1b"; done
echo
for s in $(echo "$settings" | tr , ' '); do
  # shellcheck disable=SC2046 # words
  set -- $(setting "$s")
  model=$1 batch=$2 data=$3 pipe=$4 tensor=$5 reported=$6
  times=
  for k in $(echo "$schedules" | tr , ' '); do
    # shellcheck disable=SC2086 # words
    kind=${k%%:*} chunks=
    [ "$kind" != "$k" ] && chunks="--chunks ${k#*:}" # interleaved:V
    out=$($plan --model "$model" --hardware p3.16xlarge --gpus $((data * pipe * tensor)) --pipeline "$pipe" \
          --tensor "$tensor" --data "$data" --batch "$batch" --schedule "$kind" $chunks --no-joint --json $extra 2>&1) || {
      echo "setting $s, $k: $out" >&2; times="$times -"; continue; }
    fit=$(echo "$out" | sed -n 's/^  "fits_memory": \([a-z]*\)$/\1/p')
    times="$times $(echo "$out" | field iteration_time_s)$([ "$fit" = true ] || echo '!')"
  done
  name=$(echo "$model" | sed 's/^layers=40,.*/gpt3-13b/')
  # shellcheck disable=SC2086 # words
  echo "$s $name $batch ${pipe}x${tensor}x${data} $reported $schedules $times" | awk '{
    printf "%-7s %-9s %5d %-9s %8.3f", $1, $2, $3, $4, $5
    n = split($6, names, ","); for (i = 1; i <= n; i++) { t[i] = $(6 + i); if (names[i] == "1f1b") ref = t[i] }
    for (i = 1; i <= n; i++) {
      if (t[i] == "-") printf " | %-8s %7s", "-", "-"
      else printf " | %-8s %6.3fx", sprintf("%.4g%s", t[i] + 0, t[i] ~ /!$/ ? "!" : ""), (ref > 0 ? t[i] / ref : 0)
    }
    printf "\n" }'
done
