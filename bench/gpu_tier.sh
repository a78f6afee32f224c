#!/usr/bin/env bash
# The GPU tier on one CUDA machine, in stages that each fit one device call. Every suite stage gates its cases
# against the committed baselines (pytest's gates) and the script exits non-zero when any stage regressed; no
# stage but `store` writes baselines/, and `store` only when told why:
#   reference  the large_gpu suites of the reference models (CUDA fp32 gated on the CPU quality baselines,
#              bf16 lossless report, n-gram) and the upstream Vicuna case (skips offline, with its reason)
#   models     `specbench zoo synth` of the synthetic 7B alone, where SPECBENCH_SYNTH_DIR lacks it (no suite)
#   synth      `specbench zoo synth` (Vicuna-7B shape, random bf16 weights, 5 heads in the upstream layout)
#              and its large_gpu cases (lossless chain and 63-node tree, latency)
#   speed      bench/speed_7b.py on the synthetic 7B weights (writes SYNTH_DIR first when absent), with the
#              synthetic 1B as the draft model of its draft-model row
#   static     only the static-engine cases (reference and synthetic)
#   speed-cases  the GPU-bound speed suite (synthetic 7B and 1B on the static engine, repeats, 5% speed
#              tolerances; `specbench zoo synth --shape 1b` into SPECBENCH_SYNTH_1B_DIR first)
#   eagle      the EAGLE and draft-model suites' CUDA twins (reference target and its shipped heads)
#   batch      the batch suite's synthetic-7B curve (B = 1..32, static engine, 3 repeats per point)
#   batch-curve  bench/batch_curve.py on the synthetic 7B: B = 1..32, plain, oracle and the Medusa-7B profile,
#              3 repeats per point (BATCH_CURVE_ARGS replaces those options)
#   cuda-tests the CUDA tests of tests/ (marked large_gpu: static target, its compiled stages, prefill, batched, Medusa and EAGLE
#              graphs, the bench-only fused GEMVs)
#   all        reference, synth, speed and speed-cases in turn (gated; never stores)
#   store      re-base: `specbench baselines regenerate --from-results` over the results_*.jsonl that earlier stages
#              wrote to OUT_DIR (this call's or an earlier one's), with SPECBENCH_REGENERATE_REASON as its --reason
#              (recorded in each entry's provenance); exit status 2 when that is unset (before any stage runs) or
#              when OUT_DIR holds no results. A stage's regression still fails the script after a store.
#              E.g. SPECBENCH_REGENERATE_REASON="fused prefill" bash bench/gpu_tier.sh out/ reference store
# usage: bash bench/gpu_tier.sh OUT_DIR [STAGE...]     (from the repository root; default stage: all)
# Logs, results (.jsonl), junit XML, speed_7b.json and (store) the baselines/*.json it changed land in OUT_DIR.
# Env: SPECBENCH_DATA_DIR (default ./.data: gsm8k/, medusa_trees/), SPECBENCH_SYNTH_DIR (default
# /tmp/specbench-synth-7b), SPECBENCH_REGENERATE_REASON (store only), PYTHON. Needs torch, transformers, pytest,
# pytest-benchmark, pandas; not `datasets`.
set -euo pipefail
out_dir=${1:?usage: bash bench/gpu_tier.sh OUT_DIR [reference|models|synth|speed|static|eagle|speed-cases|batch|batch-curve|cuda-tests|all|store ...]}
shift
stages=()
for stage in "${@:-all}"; do  # `all` in place, so `all store` gates all four stages, then stores
    if [[ $stage == all ]]; then stages+=(reference synth speed speed-cases); else stages+=("$stage"); fi
done
reason=${SPECBENCH_REGENERATE_REASON:-}  # the store stage's --reason
if [[ " ${stages[*]} " == *" store "* && -z "${reason//[[:space:]]/}" ]]; then
    echo "gpu_tier.sh: the store stage re-bases baselines/*.json and needs a reason: set" \
         "SPECBENCH_REGENERATE_REASON=\"why these baselines change\" (recorded in each entry's provenance); the" \
         "other stages gate against the committed baselines and store nothing" >&2
    exit 2
fi
mkdir -p "$out_dir"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
export SPECBENCH_DATA_DIR=${SPECBENCH_DATA_DIR:-$PWD/.data}
export SPECBENCH_SYNTH_DIR=${SPECBENCH_SYNTH_DIR:-/tmp/specbench-synth-7b}
export SPECBENCH_SYNTH_1B_DIR=${SPECBENCH_SYNTH_1B_DIR:-/tmp/specbench-synth-1b}
python=${PYTHON:-python3}
status=0

synthesize() {  # again where an older synth wrote no profile EAGLE heads or draft model (docs/zoo.md#proposer-profiles)
    [[ -f "$SPECBENCH_SYNTH_DIR/synth_record.json" && -d "$SPECBENCH_SYNTH_DIR/draft-profile" ]] && return 0
    "$python" -m specbench.cli zoo synth "$SPECBENCH_SYNTH_DIR" --device cuda 2>&1 | tee "$out_dir/synth.log" ||
        synthesis_failed $? "$out_dir/synth.log"
}

synthesize_1b() {
    [[ -f "$SPECBENCH_SYNTH_1B_DIR/synth_record.json" ]] && return 0
    "$python" -m specbench.cli zoo synth "$SPECBENCH_SYNTH_1B_DIR" --shape 1b --device cuda 2>&1 | tee "$out_dir/synth_1b.log" ||
        synthesis_failed $? "$out_dir/synth_1b.log"
}

synthesis_failed() {  # a stage whose models could not be written fails the script (its suites do not run)
    status=$1
    echo "gpu_tier.sh: stage $stage: \`specbench zoo synth\` failed (exit status $1); its output is in $2" >&2
    return 1
}

# run the large_gpu suites selected by -k, gated against the committed baselines (a regression fails the stage);
# their results go to results_NAME.jsonl, for a later `store`
suites() {
    local name=$1 selection=$2
    # the repository's conftest.py loads the plugin when specbench is not pip-installed
    "$python" -m pytest "${suite_files[@]:-suites}" -m large_gpu -k "$selection" -rs -v -p no:cacheprovider \
        --specbench-results "$out_dir/results_$name.jsonl" --junitxml "$out_dir/junit_$name.xml" \
        2>&1 | tee "$out_dir/large_gpu_$name.log" || status=$?
}

# the one stage that writes baselines/: the results earlier stages recorded in OUT_DIR, with the reason given
store() {
    local results=() file before
    for file in "$out_dir"/results_*.jsonl; do
        if [[ -s "$file" ]]; then results+=("$file"); fi
    done
    if (( ${#results[@]} == 0 )); then
        echo "gpu_tier.sh: store: no results_*.jsonl in $out_dir to store; run the stages whose results to store" \
             "first, into the same OUT_DIR (e.g. bash bench/gpu_tier.sh $out_dir reference store)" >&2
        exit 2
    fi
    before=$(mktemp -d)
    cp baselines/*.json "$before/"
    "$python" -m specbench.cli baselines regenerate --from-results "${results[@]}" \
        --reason "$reason" 2>&1 | tee "$out_dir/store.log" || status=$?
    for file in baselines/*.json; do  # only what changed (a device call brings back few files)
        cmp -s "$file" "$before/$(basename "$file")" || cp "$file" "$out_dir/"
    done
}

for stage in "${stages[@]}"; do
    echo "== stage $stage $(date -u +%H:%M:%S)"
    suite_files=(suites/test_medusa.py suites/test_ngram.py suites/test_latency.py)
    case $stage in
        reference) suites reference "not synth" ;;
        synth) synthesize && suites synth "synth" ;;
        models) synthesize ;;
        static) synthesize && suite_files=(suites/test_medusa.py suites/test_ngram.py) && suites static "static" ;;
        eagle) suite_files=(suites/test_eagle_suite.py suites/test_draft.py) && suites eagle "cuda" ;;
        batch) synthesize && suite_files=(suites/test_batch.py) && suites batch "synth" ;;
        batch-curve) synthesize && { "$python" bench/batch_curve.py "$out_dir" --synth-dir "$SPECBENCH_SYNTH_DIR" \
                   ${BATCH_CURVE_ARGS:---repeats 3} 2>&1 | tee "$out_dir/batch_curve.log" || status=$?; } ;;
        cuda-tests) "$python" -m pytest tests/test_static_target_cuda.py tests/test_static_ops.py tests/test_static_prefill_graphs.py tests/test_batched_graphs.py tests/test_eagle_graphs.py tests/test_medusa_graphs.py tests/test_fused_gemv_bench.py tests/test_l2_prefetch_bench.py \
                   -m large_gpu -rs -v -p no:cacheprovider 2>&1 | tee "$out_dir/cuda_tests.log" || status=$? ;;
        speed-cases) synthesize && synthesize_1b && suite_files=(suites/test_speed.py) && suites speed_cases "synth" ;;
        speed) synthesize && synthesize_1b && { "$python" bench/speed_7b.py "$SPECBENCH_SYNTH_DIR" "$out_dir" \
                   --draft-dir "$SPECBENCH_SYNTH_1B_DIR" 2>&1 | tee "$out_dir/speed_7b.log" || status=$?; } ;;
        store) store ;;
        *) echo "gpu_tier.sh: unknown stage '$stage' (reference, models, synth, speed, static, eagle, speed-cases, batch, batch-curve, cuda-tests, all, store)" >&2; exit 2 ;;
    esac
done
exit "$status"
