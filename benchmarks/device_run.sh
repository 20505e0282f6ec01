#!/usr/bin/env bash
# One call on the GPU machine: environment facts, the full test suite (GPU tests included), then
# the benchmarks named in $BENCH (a list of `gemmlab bench` argument strings separated by '|', e.g.
# BENCH='--ladder hopper --steps h10 --sizes 4096 --configs BN=128;BN=192 --suite-name sweep|--suite matmul-decode').
# Everything lands under $OUT (the device tool brings that folder back).
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 GEMMLAB_CACHE_DIR=${GEMMLAB_CACHE_DIR:-/tmp/gemmlab-cache}
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu --format=csv
  python3 -c "import sys, torch, cuda.core, cuda.bindings; print(sys.version.split()[0], torch.__version__, cuda.core.__version__, cuda.bindings.__version__)"
} 2>&1 | tee "$OUT/env.txt"
if [ "${TESTS:-1}" = 1 ]; then
  timeout "${TEST_TIMEOUT:-300}" python3 -m pytest -q -x ${PYTEST_ARGS:-tests/} 2>&1 | tee "$OUT/pytest.txt" | tail -40
fi
IFS='|' read -ra runs <<< "${BENCH:-}"
for r in "${runs[@]}"; do
  [ -n "$r" ] || continue
  # shellcheck disable=SC2086
  timeout "${BENCH_TIMEOUT:-300}" python3 -m gemmlab bench $r --no-plots --out "$OUT/bench.jsonl" 2>&1 | tee -a "$OUT/bench.txt" | grep -v "^[│┃┏┡└━]" | tail -30
done
for tool in ${SANITIZE:-}; do
  echo "== compute-sanitizer --tool $tool" | tee -a "$OUT/sanitizer.txt"
  timeout "${SAN_TIMEOUT:-240}" compute-sanitizer --tool "$tool" --report-api-errors no --print-limit 20 python3 benchmarks/sanitize.py ${SAN_ARGS:-} 2>&1 | tee -a "$OUT/sanitizer.txt" | tail -15
done
