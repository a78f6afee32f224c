#!/usr/bin/env bash
# The measuring calls of the device plan (bench/results/h100-2026-12-07/README.md, "Next device session"), each one
# command under one device call's 10 minutes: every step under its own `timeout`, so a slow one cannot take the rest,
# its output under OUT. The A/B and tier calls of the plan are bench/ab_archives_call.sh and bench/tier_machine.sh.
#
#   bash bench/plan_calls.sh OUT headroom   # fresh machine, ~590 s: plain decoding's candidates for 0.80 (#29),
#                                           # the CUDA tests, the GEMV backends and the cache write
#   bash bench/plan_calls.sh OUT profiles   # ~300 s: the plain step's and EAGLE-2's draft graph replayed under the
#                                           # profiler, the draft eager and compiled (COMPILE_DRAFT's candidate), and
#                                           # the synthetic 1B's plain step (the draft model's)
#   bash bench/plan_calls.sh OUT l2         # ~500 s: the plain step's profile, plain decoding with the next weights
#                                           # prefetched into L2 between matmuls (bench/_l2_prefetch.py; L2_SPECS
#                                           # overrides the sizes) after its CUDA tests, one of them profiled
#                                           # (L2_PROFILE, default 32:0), and the GEMV backends at one row
#   bash bench/plan_calls.sh OUT draft      # ~300 s: EAGLE-2's compiled draft graph replayed under the profiler with
#                                           # torch.topk over the vocabulary, then with the chunked top-k candidate
#                                           # (specbench/eagle/top_k.py's CHUNK) at chunks of 128 and 1024 scores
#
# Exports SPECBENCH_DATA_DIR (default .ab/data), HF_HUB_OFFLINE=1, SPECBENCH_SYNTH_DIR and SPECBENCH_SYNTH_1B_DIR
# (default /tmp/specbench-synth-7b and -1b); writes the synthetic 7B first when it is missing.
set -u
out=${1:?usage: bash bench/plan_calls.sh OUT headroom|profiles|l2|draft}
call=${2:?usage: bash bench/plan_calls.sh OUT headroom|profiles|l2|draft}
if [[ $call != headroom && $call != profiles && $call != l2 && $call != draft ]]; then
    echo "plan_calls.sh: unknown call '$call' (headroom, profiles, l2 or draft)" >&2
    exit 2
fi
export SPECBENCH_DATA_DIR=${SPECBENCH_DATA_DIR:-$PWD/.ab/data} HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
export SPECBENCH_SYNTH_DIR=${SPECBENCH_SYNTH_DIR:-/tmp/specbench-synth-7b}
export SPECBENCH_SYNTH_1B_DIR=${SPECBENCH_SYNTH_1B_DIR:-/tmp/specbench-synth-1b}
synth=$SPECBENCH_SYNTH_DIR
mkdir -p "$out"
nvidia-smi --query-gpu=name,serial --format=csv,noheader > "$out/machine_$call.txt" 2>&1
if [[ ! -f $synth/synth_record.json ]]; then
    timeout 120 python3 -m specbench.cli zoo synth "$synth" --device cuda > "$out/synth_$call.log" 2>&1
fi
step() {  # step SECONDS LOG COMMAND...: one measured command, its exit status noted in its log
    local seconds=$1 log=$2
    shift 2
    timeout -k 5 "$seconds" "$@" > "$out/$log" 2>&1
    echo "exit $? after at most ${seconds} s: $*" | tee -a "$out/$log"
}
case $call in
    headroom)
        step 240 plain_headroom.log python3 bench/plain_headroom.py "$out/ph" --synth-dir "$synth" --rounds 2 \
            --steps "" --triton-attention --fused-gemv --fused-inductor --layer-compile \
            --modes loop,loop-fused,loop-fused-inductor,loop-layers,loop-triton,loop-fused-triton
        step 200 cuda_tests.log bash bench/gpu_tier.sh /tmp/ct cuda-tests
        step 90 gemv.log python3 bench/gemv_backends.py "$out/gemv" --widths 1
        step 30 cache_write.log python3 bench/cache_write.py "$out/cw" ;;
    profiles)
        step 60 replay_plain.log python3 bench/replay_profile.py "$out/rp" --synth-dir "$synth"
        step 90 replay_eagle.log python3 bench/replay_profile.py "$out/rpe" --synth-dir "$synth" --step eagle-draft
        step 120 replay_eagle_compiled.log python3 bench/replay_profile.py "$out/rpc" --synth-dir "$synth" \
            --step eagle-draft --compile-draft
        # the 1B's plain step: the draft model's own (its drafting costs 0.76 of a 7B step, three 1B steps at ~0.48
        # of their copy ceiling)
        if [[ ! -f $SPECBENCH_SYNTH_1B_DIR/synth_record.json ]]; then
            timeout 90 python3 -m specbench.cli zoo synth "$SPECBENCH_SYNTH_1B_DIR" --shape 1b --device cuda \
                > "$out/synth_1b.log" 2>&1
        fi
        step 60 replay_1b.log python3 bench/replay_profile.py "$out/rp1b" --synth-dir "$SPECBENCH_SYNTH_1B_DIR" ;;
    l2)
        # megabytes prefetched in the attention window : in each other window (about 8 us and 2-3 us of HBM time
        # on an H100's 7B step, bench/results/h100-2026-12-07/replay_plain.log), joined at the next matmul or not
        specs=${L2_SPECS:-16:0,32:0,16:4,32:8,16:4:nojoin,32:8:nojoin}
        modes=loop$(printf ',loop-l2-%s' ${specs//,/ })
        step 60 replay_plain.log python3 bench/replay_profile.py "$out/rp" --synth-dir "$synth"
        step 60 l2_cuda_tests.log python3 -m pytest tests/test_l2_prefetch_bench.py -m large_gpu -rs -q \
            -p no:cacheprovider
        step 180 l2_prefetch.log python3 bench/plain_headroom.py "$out/l2" --synth-dir "$synth" --rounds 3 --steps "" \
            --l2-prefetch "$specs" --modes "$modes"
        # one variant's step under the profiler: do its matmuls get shorter, and do its prefetches overlap the rest?
        step 60 replay_l2.log python3 bench/replay_profile.py "$out/rpl2" --synth-dir "$synth" \
            --l2-prefetch "${L2_PROFILE:-32:0}"
        step 150 gemv.log python3 bench/gemv_backends.py "$out/gemv" --widths 1 ;;
    draft)
        # top-k's kernels were 268 of the compiled draft's 2,153 us on an H100 (docs/eagle.md#a-compiled-draft-step)
        step 120 replay_eagle_compiled.log python3 bench/replay_profile.py "$out/rpc" --synth-dir "$synth" \
            --step eagle-draft --compile-draft
        for chunk in 128 1024; do
            step 120 "replay_eagle_chunked_$chunk.log" python3 bench/replay_profile.py "$out/rpk$chunk" \
                --synth-dir "$synth" --step eagle-draft --compile-draft --chunked-topk "$chunk"
        done ;;
esac
grep -h "^exit " "$out"/*.log
