#!/usr/bin/env bash
# The session's closing H200 run: the Hopper benchmarks, the GPU tests for what changed last, then the
# other benchmarks the README tables are generated from (most important first: a cut run keeps them).
# Usage (device tool): GEMMLAB_GIT_SHA=<sha> PART=1 bash benchmarks/h200_run.sh, then PART=2 in the next
# call: the whole run needs ~10 minutes, more than one device call may take (PART unset runs both).
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 GEMMLAB_CACHE_DIR=${GEMMLAB_CACHE_DIR:-/tmp/gemmlab-cache}
log="$OUT/log.txt"
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu --format=csv
  python3 -c "import sys, torch, cuda.core; print(sys.version.split()[0], torch.__version__, cuda.core.__version__)"
} 2>&1 | tee "$OUT/env.txt"
PART=${PART:-all}
step() {  # step SECONDS COMMAND...: run with a time limit, keep the output
  local limit=$1; shift
  echo "== $*" | tee -a "$log"
  timeout "$limit" "$@" 2>&1 | tee -a "$log" | grep -v "^[│┃┏┡└━]" | tail -"${TAIL:-12}"
}
# `gemmlab bench` (the one benchmark front-end): --suite-name is the records' 'suite' field, --no-plots keeps
# the time limits for the timings; benchmarks/readme_tables.py reads the four files below.
if [ "$PART" != 2 ]; then
step 90 python3 -m gemmlab bench --suite ladder --ladder hopper --sizes 4096,8192 --rounds 10 --no-plots --out "$OUT/hopper_ladder.jsonl"
step 60 python3 -m gemmlab bench --ladder hopper --steps h10,h12 --sizes 2048,3072,4096,6144,8192,12288,16384 --rounds 10 --suite-name sweep --no-plots --out "$OUT/hopper_sweep.jsonl"
TAIL=25 step 150 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_gpu.py tests/test_engine_gpu.py \
  tests/test_cli.py tests/test_decode_gpu.py -k "sgemm or h10 or h11 or h12 or layouts or unaligned or epilogue or on_gpu or decode"
grep -E "passed|failed" "$log" | tail -1 > "$OUT/pytest.txt"
fi
if [ "$PART" != 1 ]; then
step 60 python3 -m gemmlab bench --suite ladder --ladder sgemm --sizes 4096 --rounds 5 --no-plots --out "$OUT/sgemm_ladder.jsonl"
step 50 python3 -m gemmlab bench --suite ladder --ladder sgemm --steps k04,k05,k06,k07,k08,k09,k10 --sizes 8192 --rounds 5 --no-plots --out "$OUT/sgemm_ladder.jsonl"
step 60 python3 -m gemmlab bench --suite matmul-unaligned --rounds 10 --out "$OUT/matmul.jsonl"
step 60 python3 -m gemmlab bench --suite matmul-square --rounds 10 --out "$OUT/matmul.jsonl"
step 60 python3 -m gemmlab bench --suite matmul-epilogue --rounds 10 --out "$OUT/matmul.jsonl"
TAIL=6 step 150 python3 -m gemmlab bench --suite matmul-llm --rounds 5 --out "$OUT/matmul.jsonl"
fi
