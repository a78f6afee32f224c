#!/usr/bin/env bash
# One device call's share of an A/B trial that spans several calls (docs/ab.md#trials): bench/ab_trial.py on the
# synthetic 7B plain case under a time limit, its finished rounds kept in .ab/ab-runs, all of it packed into
# OUT/ab_call.tgz. Unpack that tarball's ab-runs/ into .ab/ before the next call (carry .ab), and the same command
# continues where this one stopped, on this machine or a fresh one (which writes the synthetic 7B again first).
#
#   bash bench/ab_calls.sh OUT PLAN [SECONDS]
#   bash bench/ab_calls.sh $OUT unchanged,unchanged,unchanged,0.05@10 580
set -u
out=$1
plan=$2
seconds=${3:-580}
runs=.ab/ab-runs
mkdir -p "$out/trial" "$runs"
export SPECBENCH_DATA_DIR=${SPECBENCH_DATA_DIR:-$PWD/.ab/data}
timeout -k 5 "$seconds" python3 bench/ab_trial.py "$out/trial" --synth-dir /tmp/specbench-synth-7b --plan "$plan" \
    --case speed/synth-7b-plain --rounds 6 --budget-s 100000 --num-prompts 2 --max-new-tokens 64 \
    --runs-root "$runs" > "$out/trial/ab_trial_stdout.txt" 2>&1
code=$?
nvidia-smi --query-gpu=name,serial --format=csv,noheader > "$out/trial/machine.txt" 2>/dev/null || true
cp -r "$runs" "$out/trial/ab-runs"
grep -v '^round' "$out/trial/ab_trial.log" 2>/dev/null | tail -30
tar czf "$out/ab_call.tgz" -C "$out" trial && rm -rf "$out/trial"
echo "ab_trial exit $code (124: the time limit cut it; rounds kept in $runs); $out/ab_call.tgz"
