#!/usr/bin/env bash
# One device call that runs the same benchmarks in two trees, alternating, on one machine: this tree (head) and a
# base commit carried as a `git archive` tarball (bench/in_archive.py). For engine changes whose speed the A/B of
# `specbench compare` cannot see alone: bench/speed_7b.py's static engine (plain tok/s, T(k)/T(1) for k = 1..8 and
# the 63-node tree, the oracle at K = 3, 5) on the synthetic 1B (base, head, base, head) and 7B (base, head), then
# bench/batch_curve.py at B = 1, 8, 32 (head, base). Each run is cut at the call's deadline; a run left out says so.
#
#   git archive --format=tar BASE -- . ':!specbench/zoo/artifacts' ':!bench/results' | gzip > .ab/BASE.tar.gz
#   bash bench/ab_engine_trees.sh $OUT .ab/BASE.tar.gz [SECONDS]      (carry .ab; default 560 s)
#   AB_RUNS="curve_base curve_head_2" bash bench/ab_engine_trees.sh ...  (only these runs, in this order)
#
# Writes OUT/<run>/ (each run's JSON) and OUT/<run>.log, then prints the comparison (bench/ab_engine_summary.py).
set -u
out=${1:?usage: bash bench/ab_engine_trees.sh OUT BASE_ARCHIVE [SECONDS]}
base=${2:?usage: bash bench/ab_engine_trees.sh OUT BASE_ARCHIVE [SECONDS]}
deadline=$(( $(date +%s) + ${3:-560} ))
export SPECBENCH_DATA_DIR=${SPECBENCH_DATA_DIR:-$PWD/.ab/data} HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
synth7=${SPECBENCH_SYNTH_DIR:-/tmp/specbench-synth-7b}
synth1=${SPECBENCH_SYNTH_1B_DIR:-/tmp/specbench-synth-1b}
mkdir -p "$out"
out=$(cd "$out" && pwd)  # absolute: the base's runs write it from inside their unpacked tree
nvidia-smi --query-gpu=name,serial --format=csv,noheader > "$out/machine.txt" 2>&1
[[ -f $synth7/synth_record.json ]] || PYTHONPATH=$PWD python3 -m specbench.cli zoo synth "$synth7" --device cuda > "$out/synth_7b.log" 2>&1
[[ -f $synth1/synth_record.json ]] || PYTHONPATH=$PWD python3 -m specbench.cli zoo synth "$synth1" --shape 1b --device cuda > "$out/synth_1b.log" 2>&1

run() {  # NAME base|head SCRIPT ARG...: SCRIPT (a bench/ path, the same in both trees) in that tree, output in OUT/NAME
    local name=$1 tree=$2 left=$(( deadline - $(date +%s) ))
    shift 2
    if (( left < 40 )); then echo "$name: left out, $left s to the deadline"; return; fi
    if [[ $tree == base ]]; then
        timeout -k 5 "$left" python3 bench/in_archive.py "$base" python3 "$@" "$out/$name" > "$out/$name.log" 2>&1
    else
        PYTHONPATH=$PWD timeout -k 5 "$left" python3 "$@" "$out/$name" > "$out/$name.log" 2>&1
    fi
    echo "$name: exit $? after $(( $(date +%s) - deadline + left )) s"
}

speed=(bench/speed_7b.py --engines static --skip-compile)
curve=(bench/batch_curve.py --batch-sizes 1,8,32 --rounds 1 --new-tokens 64 --repeats 3 --synth-dir "$synth7")
runs=${AB_RUNS:-speed_1b_base_1 speed_1b_head_1 speed_1b_base_2 speed_1b_head_2 speed_7b_base speed_7b_head curve_head curve_base}
for name in $runs; do  # NAME = speed_1b|speed_7b|curve, then _base or _head, then an optional _N
    tree=base; [[ $name == *_head* ]] && tree=head
    case $name in
        speed_1b_*) run "$name" $tree "${speed[@]}" "$synth1" ;;
        speed_7b_*) run "$name" $tree "${speed[@]}" "$synth7" ;;
        curve_*) run "$name" $tree "${curve[@]}" ;;
        *) echo "$name: not a run (speed_1b_..., speed_7b_... or curve_...)" ;;
    esac
done
python3 bench/ab_engine_summary.py "$out" | tee "$out/summary.txt"
