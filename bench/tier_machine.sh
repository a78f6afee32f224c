#!/usr/bin/env bash
# One fresh GPU machine's share of the cross-machine check (docs/ab.md, README "Baselines and gates"): every gated
# GPU suite against the committed baselines, with per-test durations and the machine's facts, packed into one
# archive per part so that a device call brings it back (a call returns at most 8 files). Stores nothing.
#   a     reference and synth (writes the synthetic 7B and its proposers) stages of bench/gpu_tier.sh: 274 s on a
#         warm H100 whose synthetic 7B was written (2026-12-07c: 138 s and 136 s)
#   e     the eagle stage (the EAGLE and draft-model suites' CUDA twins): its own part since the compiled draft step
#         (docs/eagle.md#a-compiled-draft-step) made its static cases compile; 94 s on an H200 before that, and
#         280 s for its 6 cases on an H100 after (2026-12-08; 66-87 s per static EAGLE case)
#   b     the speed-cases and batch stages and the proposer table of the speed cases (bench/proposer_table.py): about
#         500-600 s on an H100 (2026-12-07: 303 s and 194 s; 2026-12-07c: 405 s with the synthesis, and the batch
#         stage's 6 points did not fit the rest of a 600 s call), on top of the machine's start
#   c     one fresh speed/synth-7b-plain process timed in phases (where its setup time goes), writing the synthetic
#         7B first when this machine lacks it
#   all   a, e, b then c (longer than one 10-minute device call)
# usage: bash bench/tier_machine.sh OUT_DIR [a|e|b|c|all]     (from the repository root)
# Writes OUT_DIR/tier_<part>.tar.gz (the stage logs, results_*.jsonl, junit XML, machine.txt, process_phases.txt,
# process_profile.txt: the 45 calls of most cumulative time in that process, under cProfile) and
# OUT_DIR/tier_<part>.txt (the summary lines), also when the device call's limit stops the script (SIGTERM): what
# finished comes back. Exit status: gpu_tier.sh's (non-zero when any case regressed).
set -uo pipefail
out_dir=${1:?usage: bash bench/tier_machine.sh OUT_DIR [a|e|b|c|all]}
part=${2:-all}
case $part in
    a) stages=(reference synth) ;;
    e) stages=(eagle) ;;
    b) stages=(speed-cases batch) ;;
    c) stages=() ;;
    all) stages=(reference synth eagle speed-cases batch) ;;
    *) echo "tier_machine.sh: unknown part '$part' (a, e, b, c or all)" >&2; exit 2 ;;
esac
work=$(mktemp -d)/tier_$part
mkdir -p "$work" "$out_dir"
python=${PYTHON:-python3}
{
    date -u +%FT%TZ
    echo "commit $(git rev-parse HEAD 2>/dev/null) dirty: $(git status --porcelain 2>/dev/null | grep -vc '^??')"
    nvidia-smi --query-gpu=name,serial,uuid,driver_version,clocks.max.sm,clocks.max.mem,power.limit --format=csv
    grep -m1 "model name" /proc/cpuinfo
} >"$work/machine.txt" 2>&1
cat "$work/machine.txt"
# the summary lines and the archive of whatever finished: after every stage, at the end and on the call limit's
# SIGTERM. Each file is written beside its name and renamed, because the device kills the command soon after
# SIGTERM (2026-12-07: a pack begun at the limit left a truncated archive); a pack cut short leaves the last whole one
pack() {
    grep -h -E "^(speed|medusa|ngram|latency|eagle|draft|batch)/|passed|failed|regress" "$work"/large_gpu_*.log \
        >"$out_dir/tier_$part.txt.tmp" 2>/dev/null
    mv "$out_dir/tier_$part.txt.tmp" "$out_dir/tier_$part.txt"
    tar -czf "$out_dir/tier_$part.tar.gz.tmp" -C "$(dirname "$work")" "tier_$part" &&
        mv "$out_dir/tier_$part.tar.gz.tmp" "$out_dir/tier_$part.tar.gz"
}
trap 'pack; echo "tier_machine.sh: stopped by SIGTERM, packed what finished: $out_dir/tier_$part.tar.gz"; exit 124' TERM
status=0
for stage in "${stages[@]}"; do  # one stage at a time, packed after each
    PYTEST_ADDOPTS="--durations=0 ${PYTEST_ADDOPTS:-}" bash bench/gpu_tier.sh "$work" "$stage" &
    wait $! || status=$?  # in the background, so that SIGTERM reaches the trap at once
    pack
done
if [[ -s "$work/results_speed_cases.jsonl" ]]; then  # #29's proposer table from the speed cases this call ran
    PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" "$python" bench/proposer_table.py "$work/results_speed_cases.jsonl" --out "$work/speed_7b_proposers.md" || true
fi
if [[ $part == c || $part == all ]]; then  # where a fresh 7B process's half minute goes (A/B rounds pay it per process)
    export SPECBENCH_SYNTH_DIR=${SPECBENCH_SYNTH_DIR:-/tmp/specbench-synth-7b}
    bash bench/gpu_tier.sh "$work" models >/dev/null || status=$?  # the synthetic 7B, where this machine lacks it
    run_plain=(-m specbench.cli run speed/synth-7b-plain --no-gate --no-history -q --num-prompts 2 --max-new-tokens 64)
    {
        start=$(date +%s.%N)
        "$python" -c "import torch, transformers, specbench.cli.run_command; torch.zeros(1, device='cuda')"
        imported=$(date +%s.%N)
        "$python" "${run_plain[@]}" --output "$work/profiled_run.json"
        done=$(date +%s.%N)
        "$python" -c "import sys; a, b, c = map(float, sys.argv[1:]); print(f'imports and CUDA init: {b - a:.1f} s; whole run process: {c - b:.1f} s')" "$start" "$imported" "$done"
        "$python" -c "import json,sys; e=json.load(open(sys.argv[1]))['details']['engine']; print('capture and compile inside it:', round(e['capture_seconds'], 1), 's')" "$work/profiled_run.json"
    } >"$work/process_phases.txt" 2>&1
    cat "$work/process_phases.txt"
    # the same process again under cProfile (slower by its overhead): which calls hold the rest of the half minute
    "$python" -m cProfile -o "$work/process.prof" "${run_plain[@]}" >/dev/null 2>&1 &&
        "$python" -c "import pstats, sys; pstats.Stats(sys.argv[1]).sort_stats('cumulative').print_stats(45)" \
        "$work/process.prof" >"$work/process_profile.txt" 2>&1
fi
trap - TERM
pack
echo "tier_machine.sh: part $part exit status $status; $out_dir/tier_$part.tar.gz"
exit "$status"
