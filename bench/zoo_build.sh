#!/usr/bin/env bash
# Build specbench's GSM8K reference models (target, Medusa heads, trees, draft) at full size on a
# CUDA GPU, log everything to OUT_DIR/zoo_build.log, then print the headline numbers.
#   usage: bash bench/zoo_build.sh OUT_DIR [DATA_DIR]      (run from the repository root)
# DATA_DIR holds gsm8k/train.jsonl and gsm8k/test.jsonl (default: $SPECBENCH_DATA_DIR). Needs torch,
# transformers, tokenizers, safetensors and tqdm; not `datasets`, no network, no pip install.
# Install a passing build into the package afterwards with:
#   PYTHONPATH=. python -m specbench.zoo.cli install OUT_DIR
set -euo pipefail

if [[ $# -lt 1 || $# -gt 2 ]]; then
    echo "usage: bash bench/zoo_build.sh OUT_DIR [DATA_DIR]" >&2
    exit 2
fi
out_dir=$1
data_dir=${2:-${SPECBENCH_DATA_DIR:-}}
if [[ -z "$data_dir" ]]; then
    echo "zoo_build.sh: no data directory: pass DATA_DIR or set SPECBENCH_DATA_DIR" >&2
    exit 2
fi
if [[ ! -f specbench/zoo/build.py ]]; then
    echo "zoo_build.sh: run me from the specbench repository root (specbench/zoo/build.py not found in $PWD)" >&2
    exit 2
fi
python=${PYTHON:-python3}
mkdir -p "$out_dir"
log="$out_dir/zoo_build.log"

export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
{
    echo "== zoo build $(date -u +%Y-%m-%dT%H:%M:%SZ) in $PWD, commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    "$python" -c 'import torch, transformers, tokenizers; print("torch", torch.__version__, "transformers", transformers.__version__, "tokenizers", tokenizers.__version__, "cuda", torch.cuda.is_available() and torch.cuda.get_device_name(0))'
} 2>&1 | tee "$log"

status=0
"$python" -m specbench.zoo.cli build "$out_dir" --data-dir "$data_dir" --device cuda --scale full --overwrite 2>&1 \
    | tee -a "$log" || status=$?

if [[ -f "$out_dir/gsm8k-tiny/build_record.json" ]]; then
    echo
    echo "== headline (from $out_dir/gsm8k-tiny/build_record.json)"
    "$python" -m specbench.zoo.cli summary "$out_dir"
    du -sh "$out_dir/gsm8k-tiny"/* | sed 's/^/   /'
fi
echo "log: $log"
exit "$status"
