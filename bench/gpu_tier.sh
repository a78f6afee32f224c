#!/usr/bin/env bash
# The GPU tier in one device call: the large_gpu suites (reference models on CUDA in fp32/bf16, the
# upstream Vicuna case, the 7B-shaped synthetic checkpoint), H200 speed baselines, and the 7B speed
# benchmark. Writes logs, results and the benchmark JSON under OUT_DIR.
#   usage: bash bench/gpu_tier.sh OUT_DIR [SYNTH_DIR]      (from the repository root)
# Needs torch, transformers, pytest, pytest-benchmark, pandas and, for prompt sets, `datasets`
# (carry it as wheels in .whl/ where it is missing: see the README's GPU tier section).
set -euo pipefail
out_dir=${1:?usage: bash bench/gpu_tier.sh OUT_DIR [SYNTH_DIR]}
synth_dir=${2:-/tmp/specbench-synth-7b}
mkdir -p "$out_dir"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
export SPECBENCH_DATA_DIR=${SPECBENCH_DATA_DIR:-$PWD/.data} SPECBENCH_SYNTH_DIR="$synth_dir"
python=${PYTHON:-python3}

if [[ ! -f "$synth_dir/synth_record.json" ]]; then
    "$python" -m specbench.cli zoo synth "$synth_dir" --device cuda 2>&1 | tee "$out_dir/synth.log"
fi
status=0
# the repository's conftest.py loads the plugin when specbench is not pip-installed
"$python" -m pytest suites -m large_gpu -rs -v \
    --specbench-results "$out_dir/results.jsonl" --junitxml "$out_dir/junit.xml" 2>&1 | tee "$out_dir/large_gpu.log" || status=$?
"$python" bench/speed_7b.py "$synth_dir" "$out_dir" 2>&1 | tee "$out_dir/speed_7b.log" || status=$?
exit "$status"
