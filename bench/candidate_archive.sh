#!/usr/bin/env bash
# A candidate tree for an A/B of archived trees (bench/ab_archives.py): HEAD's archive with one switch flipped by a
# sed expression in one file, so what the A/B measures is exactly that line (the diff is printed). The base is
# HEAD's own archive, made the same way with no change.
#
#   bash bench/candidate_archive.sh HEAD                     # .ab/HEAD.tar.gz
#   bash bench/candidate_archive.sh eager-draft specbench/eagle/captured.py 's/^COMPILE_DRAFT = True$/COMPILE_DRAFT = False/'
#
# Exit status 2 when the expression changes nothing.
set -eu
name=${1:?usage: bash bench/candidate_archive.sh NAME [FILE SED_EXPRESSION]}
tree=$(mktemp -d)
trap 'rm -rf "$tree"' EXIT
git archive --format=tar HEAD -- . ':!specbench/zoo/artifacts' ':!bench/results' | tar -x -C "$tree"
if [[ $# -ge 3 ]]; then
    file=$2 expression=$3
    sed -i "$expression" "$tree/$file"
    if git show "HEAD:$file" | cmp -s - "$tree/$file"; then
        echo "candidate_archive.sh: '$expression' changes nothing in $file" >&2
        exit 2
    fi
    git show "HEAD:$file" | diff - "$tree/$file" || true
fi
mkdir -p .ab
tar -czf ".ab/$name.tar.gz.tmp" -C "$tree" . && mv ".ab/$name.tar.gz.tmp" ".ab/$name.tar.gz"
echo "candidate_archive.sh: .ab/$name.tar.gz from $(git rev-parse --short HEAD)"
