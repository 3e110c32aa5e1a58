#!/usr/bin/env bash
# One GPU-machine call: `bash benchmarks/gpu_run.sh COMMIT STAGE...` from the project root, after
# `source .gpu/preamble.sh`. Stages: tests (pytest -m gpu over POSY_GPU_TESTS, default tests), profile
# (benchmarks.profile with POSY_PROFILE_ARGS), and any suite of `python -m benchmarks` (engine, qwen3,
# all, ...) with the flags in POSY_<SUITE>_ARGS (upper case, "_" for "-"; for example
# POSY_FAMILIES_ARGS="--shapes mpnet-base,qwen2-1.5b"). Each stage is time-boxed by POSY_STAGE_TIMEOUT
# (seconds, default 300) so that one hung stage cannot take the call's results with it. Logs and the
# appended result records are written under $OUT (results.tgz holds benchmarks/results).
# SUITE@base runs the suite on the baseline tree in .base (made here by `bash benchmarks/make_base.sh REV`
# and carried: `carry: [".gpu", ".base"]`), its records appended to this tree's, so that a before and after
# come back in one results.tgz: for example `... COMMIT tests engine@base engine online@base online`.
# .gpu/ is the shared payload script's, with the extras litestar msgspec uvicorn pyzmq httptools orjson
# pybase64 colbert-ai FlagEmbedding (the token heads' GPU tests check against colbert-ai and FlagEmbedding:
# without them 13 of them error), and .gpu/seed-tokenizers from `python -m benchmarks.seed_tokenizers`.
set -u
commit=$1
shift
export POSY_COMMIT=$commit PYTHONUNBUFFERED=1
out=${OUT:-/tmp/out}
mkdir -p "$out"
limit=${POSY_STAGE_TIMEOUT:-300}
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv >"$out/gpu.txt" 2>&1
for stage in "$@"; do
  started=$(date +%s)
  case $stage in
    # the GPU machine lacks the test extra's schemathesis; compat_tests hold no GPU test
    tests) timeout "$limit" python -m pytest -m gpu ${POSY_GPU_TESTS:-tests} -q -rfEs -p no:cacheprovider \
      --ignore=tests/api/test_openapi.py --timeout 180 2>&1 | tee "$out/pytest.log" ;;
    profile) timeout "$limit" python -m benchmarks.profile ${POSY_PROFILE_ARGS:-} 2>&1 | tee "$out/profile.txt" ;;
    *@base) suite=${stage%@base} root=$PWD
      args=POSY_$(echo "$suite" | tr a-z- A-Z_)_ARGS
      records=.base/benchmarks/results/$suite.jsonl
      before=$(cat "$records" 2>/dev/null | wc -l)
      (cd .base && POSY_COMMIT=$(cat COMMIT) PYTHONPATH=/tmp/site:$root/.gpu/shim:$root/.base \
        timeout "$limit" python -m benchmarks "$suite" ${!args:-} 2>&1 | tee "$out/bench-$stage.log")
      if [ -f "$records" ]; then tail -n +$((before + 1)) "$records" >>"benchmarks/results/$suite.jsonl"; fi ;;
    *) args=POSY_$(echo "$stage" | tr a-z- A-Z_)_ARGS
      timeout "$limit" python -m benchmarks "$stage" ${!args:-} 2>&1 | tee "$out/bench-$stage.log" ;;
  esac
  echo "== stage $stage: rc ${PIPESTATUS[0]}, $(($(date +%s) - started)) s" | tee -a "$out/stages.txt"
  tar czf "$out/results.tgz" benchmarks/results benchmarks/RESULTS.md
done
