#!/usr/bin/env bash
# One device call of the speed-gate trial (issue 13) on one synthetic-7B speed case: writes the synthetic 7B
# (SPECBENCH_SYNTH_DIR, skipped when present), then bench/speed_gate_trial.py on CASE, its log beside the JSON.
# usage: bash bench/trial_7b.sh OUT_DIR CASE [speed_gate_trial.py options...]
#   e.g. bash bench/trial_7b.sh $OUT speed/synth-7b-chain-k3 --runs 20 --no-graphs-off --max-seconds 500
# OUT_DIR gets speed_gate_trial.json and trial.log (and synth.log when it wrote the weights).
set -euo pipefail
out_dir=${1:?usage: bash bench/trial_7b.sh OUT_DIR CASE [options]}
case_id=${2:?usage: bash bench/trial_7b.sh OUT_DIR CASE [options]}
shift 2
mkdir -p "$out_dir"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
export SPECBENCH_SYNTH_DIR=${SPECBENCH_SYNTH_DIR:-/tmp/specbench-synth-7b}
python=${PYTHON:-python3}
start=$(date +%s)
if [[ ! -f "$SPECBENCH_SYNTH_DIR/synth_record.json" ]]; then
    "$python" -m specbench.cli zoo synth "$SPECBENCH_SYNTH_DIR" --device cuda 2>&1 | tee "$out_dir/synth.log"
fi
echo "synthetic 7B ready after $(( $(date +%s) - start )) s; commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')" \
    | tee "$out_dir/trial.log"
"$python" bench/speed_gate_trial.py "$out_dir" --cases "$case_id" "$@" 2>&1 | tee -a "$out_dir/trial.log"
