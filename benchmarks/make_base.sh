#!/usr/bin/env bash
# `bash benchmarks/make_base.sh REV` from the project root: the tree of REV in .base (kept out of git by
# .git/info/exclude), with its commit in .base/COMMIT, for gpu_run.sh's SUITE@base stages.
set -eu
rev=$(git rev-parse --short "$1")
rm -rf .base && mkdir .base
git archive "$rev" | tar -x -C .base
echo "$rev" >.base/COMMIT
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qsx "/.base/" "$exclude" || echo "/.base/" >>"$exclude"
echo ".base: $rev"
