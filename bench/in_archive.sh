#!/usr/bin/env bash
# Run a command inside another commit's tree, carried as a `git archive` tarball: for a device machine, whose copy
# of the repository is this working tree, to run a branch that is not checked out here (its GPU tier, say). The
# archive is unpacked in a fresh temporary directory with this tree's reference models added (the archives leave
# them out, as for bench/ab_archives.py: check `git diff --stat HEAD BRANCH -- specbench/zoo/artifacts` is empty),
# and COMMAND runs there with that tree first on PYTHONPATH. Give COMMAND absolute output paths ($OUT is one).
#
#   git archive --format=tar BRANCH -- . ':!specbench/zoo/artifacts' ':!bench/results' | gzip > .ab/BRANCH.tar.gz
#   bash bench/in_archive.sh .ab/BRANCH.tar.gz bash bench/tier_machine.sh $OUT a
#
# SPECBENCH_DATA_DIR defaults to this tree's .ab/data (what a device call carries). Exit status: COMMAND's.
set -uo pipefail
archive=${1:?usage: bash bench/in_archive.sh ARCHIVE COMMAND [ARG...]}
shift
[[ $# -gt 0 ]] || { echo "in_archive.sh: no COMMAND to run in $archive" >&2; exit 2; }
[[ -f $archive ]] || { echo "in_archive.sh: no archive at $archive; make it with git archive (see the header)" >&2; exit 2; }
tree=$(mktemp -d)/tree
mkdir -p "$tree"
tar -xzf "$archive" -C "$tree" || { echo "in_archive.sh: cannot unpack $archive" >&2; exit 2; }
mkdir -p "$tree/specbench/zoo"
cp -r specbench/zoo/artifacts "$tree/specbench/zoo/"
export SPECBENCH_DATA_DIR=${SPECBENCH_DATA_DIR:-$PWD/.ab/data}
export PYTHONPATH="$tree${PYTHONPATH:+:$PYTHONPATH}"
echo "in_archive.sh: $archive unpacked in $tree"
cd "$tree" && "$@"
