#!/usr/bin/env bash
# The first call of a device session whose card is not known in advance (a call that names no kind may get an H100 or
# an H200): it reads the card and runs the first step of that card's list in the plan
# (bench/results/h100-2026-12-08/README.md, "Next device session"). Stores nothing.
#   H200: bench/tier_machine.sh OUT b, the speed cases and the batch curve against the committed H200 baselines on a
#         fresh machine, cut by SIGTERM at 568 s so that what finished is packed
#   H100: bench/plan_calls.sh l2 (the plain step's profile, the L2 prefetch grid, the GEMV backends), packed as
#         OUT/l2.tgz
# usage: bash bench/first_call.sh OUT      (from the repository root, with .ab carried; writes OUT/card.txt first)
set -u
out=${1:?usage: bash bench/first_call.sh OUT}
mkdir -p "$out"
export SPECBENCH_DATA_DIR=${SPECBENCH_DATA_DIR:-$PWD/.ab/data} HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,serial --format=csv,noheader > "$out/card.txt" 2>&1
cat "$out/card.txt"
if grep -q H200 "$out/card.txt"; then
    timeout -s TERM 568 bash bench/tier_machine.sh "$out" b > "$out/tier_b.log" 2>&1
    status=$?
    tail -25 "$out/tier_b.log"
else
    work=$(mktemp -d)
    bash bench/plan_calls.sh "$work/l2" l2
    status=$?
    tar -czf "$out/l2.tgz" -C "$work" l2
    grep -h -E "^(loop|ceiling|[0-9]+ replays|W=)" "$work"/l2/*.log
fi
exit "$status"
