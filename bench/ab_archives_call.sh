#!/usr/bin/env bash
# One device call's share of an A/B of two archived trees (bench/ab_archives.py), cut at a deadline without losing
# its rounds: the synthetic models a case needs are written first when missing, every finished round is kept in
# /tmp/ab-NAME (`specbench compare --runs-dir`), so the same command in the next warm call continues where this
# one stopped, and whatever finished comes back packed in OUT/NAME.tgz (the rounds' JSON, the log, the comparison's
# JSON once every round is in).
#
#   bash bench/ab_archives_call.sh OUT NAME SECONDS BASE_ARCHIVE HEAD_ARCHIVE CASE... [--rounds 2 ...]
#   bash bench/ab_archives_call.sh $OUT abcw 540 .ab/c62d24a.tar.gz .ab/HEAD.tar.gz speed/synth-7b-plain \
#       --rounds 2 --num-prompts 2 --max-new-tokens 64
#
# Exports SPECBENCH_DATA_DIR (default .ab/data), HF_HUB_OFFLINE=1, SPECBENCH_SYNTH_DIR and SPECBENCH_SYNTH_1B_DIR
# (default /tmp/specbench-synth-7b and -1b). Exit status: the comparison's (124: the deadline cut it).
set -u
out=${1:?usage: bash bench/ab_archives_call.sh OUT NAME SECONDS BASE_ARCHIVE HEAD_ARCHIVE CASE... [OPTIONS]}
name=${2:?NAME}
seconds=${3:?SECONDS}
shift 3
deadline=$(( $(date +%s) + seconds ))
export SPECBENCH_DATA_DIR=${SPECBENCH_DATA_DIR:-$PWD/.ab/data} HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
export SPECBENCH_SYNTH_DIR=${SPECBENCH_SYNTH_DIR:-/tmp/specbench-synth-7b}
export SPECBENCH_SYNTH_1B_DIR=${SPECBENCH_SYNTH_1B_DIR:-/tmp/specbench-synth-1b}
work=$out/$name
mkdir -p "$work"
nvidia-smi --query-gpu=name,serial --format=csv,noheader > "$work/machine.txt" 2>&1
if [[ " $* " == *" speed/synth-7b"* && ! -f $SPECBENCH_SYNTH_DIR/synth_record.json ]]; then
    python3 -m specbench.cli zoo synth "$SPECBENCH_SYNTH_DIR" --device cuda > "$work/synth_7b.log" 2>&1
fi
if [[ " $* " == *" speed/synth-1b"* && ! -f $SPECBENCH_SYNTH_1B_DIR/synth_record.json ]]; then
    python3 -m specbench.cli zoo synth "$SPECBENCH_SYNTH_1B_DIR" --shape 1b --device cuda > "$work/synth_1b.log" 2>&1
fi
left=$(( deadline - $(date +%s) ))
timeout -k 5 "$left" python3 bench/ab_archives.py "$work" "$@" --runs-dir "/tmp/ab-$name" > "$work/ab.log" 2>&1
code=$?
cp /tmp/ab-"$name"/*.json "$work/" 2>/dev/null
tail -n 12 "$work/ab.log"
tar czf "$out/$name.tgz" -C "$out" "$name" && rm -rf "$work"
echo "ab_archives_call.sh: $name exit $code (124: cut at the deadline; the rounds stay in /tmp/ab-$name); $out/$name.tgz"
exit "$code"
