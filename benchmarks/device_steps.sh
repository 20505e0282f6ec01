#!/usr/bin/env bash
# Named steps for one call on the GPU machine: STEPS="gt et varx" runs those steps in order, each under its
# own timeout, everything under $OUT (the device tool brings that folder back). The records carry
# GEMMLAB_GIT_SHA (write `git rev-parse --short=12 HEAD` to .wt/sha before the call, or set it).
#
#   gt      grouped GPU tests (bf16; GT_K selects)                 et     GPU test files (ET_FILES)
#   gsan    compute-sanitizer memcheck + racecheck, grouped         eh     grouped eager host cost
#           (GSAN_ONLY cases, GSAN_ARGS: e.g. --fit-only)
#   ed      dense eager host cost (eager_host.py; ED_ARGS)      suite  gemmlab bench --suite matmul-NAME (SUITES)
#   varx    probe_variants.py per pick=variants (VARX)             fit    probe_grouped_fit.py (PROBE_* env)
#   gsuite  grouped_bench.py (GS_ARGS)                             broad  engine_broad.py (BR_ARGS; the broad set)
#   fuzz    the fuzz soak over every route for FUZZ_S seconds (tests/test_fuzz_gpu.py -k soak; record in fuzz.jsonl)
#   clprobe the clustered-launch probes (session 36): the cluster shape compiled in (cl1static, mcstatic), smaller
#           persistent clustered grids (PROBE_GRIDS) and the per-CTA timeline of the compiled cluster of one
#   skorder stream-K's streamed range after the data-parallel tiles (shipped, session 40) or before them
#           (probe_sk_order.py, SK_VARIANTS, SK_SHAPES): the H100's deep-K stream-K loss (session 38)
#   cpplans what the operand copies cost each plan (probe_copy_plans.py, CP_SHAPES): session 39
#   hostprof where an eager call's host time goes, copied operands against aligned (probe_host_profile.py)
#   twin    planner.SWAP_TWIN's held-out draw (changed_picks.py --swap-twin, TW_SEED / TW_COUNT): the twin against
#           the plain pick it replaces, TW_PASSES passes (engine_broad.py --lean --swap-twin), then its GPU test
#   evict   the evict-first cut's two draws (session 53: 16 weights of 0.13-1.05M elements, 20 of 1.18-2.06M; or
#           EV_SHAPES), EV_PASSES passes of engine_broad.py --lean: each pick beside the same plan with the hint
#           ("evict") or without it ("no evict"); records in evict_draws.jsonl
#   padany  planner.SWAP_PAD_ANY's held-out draws (session 54: seed 5410's 32 shapes, timed on an H100, and seed
#           5411's 40, not timed yet; PA_DRAW=1, 2 or both, or PA_SHAPES), PA_PASSES passes of engine_broad.py --lean: the pick beside
#           the plain plan it replaced ("plain"); records in pad_any_heldout.jsonl
#   span    planner.SWAP_PAD_SPAN's held-out draw (changed_picks.py --set SWAP_PAD_SPAN=none --fresh --m 129,4096,
#           SP_SEED / SP_COUNT): the pick beside the one without the rule ("alt"), SP_PASSES passes; span_heldout.jsonl
#   fresh   shapes never tuned on (fresh_draw.py --seed FR_SEED --count FR_COUNT: held-out model families, M
#           log-uniform 1..16384), engine_broad.py --lean --decode-beside; records in fresh.jsonl
#   place   what runs before a timed replay: one plan three times and its evict twin twice beside torch.mm, timed
#           following the previous candidate, after a lead-in of its own and after a flush (probe_place.py,
#           PLACE_SHAPES); records in place_probe.jsonl
#   waves   planner.SWAP_PREFER_WAVES_MARGIN's held-out draw (changed_picks.py --set SWAP_PREFER_WAVES_MARGIN=1.35
#           --m 1,32: seed 5713 on an H200, 5711 with --base stream_k_offered=0 on an H100 (5701, 5704: before the K cut; 5711 held the cut), or WV_SEED / WV_COUNT):
#           the pick beside the swapped one the wide margin ran ("alt"), WV_PASSES passes; waves_heldout.jsonl
#   rings   planner.ring_stages' held-out draw (changed_picks.py --set DEEP_RING_STAGES=9 --stages --m 1,192, RG_SEED
#           (5901) / RG_COUNT): the pick beside the 9-stage ring it replaced ("alt"), RG_PASSES passes; rings_heldout.jsonl;
#           then the deep rings' GPU test (test_engine2_gpu.py -k deep_rings)
#   l2f     tile64_l2_factor 1.25's held-out draw (changed_picks.py --set tile64_l2_factor=1.25 --m 65,3000, LF_SEED
#           (5801) / LF_COUNT): the pick beside the one at 1.25 ("alt"), LF_PASSES passes; l2f_heldout.jsonl
#
# The SM clock is read before and after (env.txt); every record also carries the clock it ran at.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 GEMMLAB_CACHE_DIR=${GEMMLAB_CACHE_DIR:-/tmp/gemmlab-cache}
export GEMMLAB_GIT_SHA=${GEMMLAB_GIT_SHA:-$(cat .wt/sha 2>/dev/null)}
# lean_passes PASSES TIMEOUT BUDGET RECORDS SHAPES [engine_broad.py options]: PASSES runs of engine_broad.py --lean
# over SHAPES, records appended to $OUT/RECORDS.
lean_passes() {
  local passes=$1 limit=$2 budget=$3 records=$4 shapes=$5
  shift 5
  for _ in $(seq "$passes"); do
    timeout "$limit" python3 benchmarks/engine_broad.py --lean "$@" --shapes "$shapes" --out "$OUT/$records" \
      --budget-s "$budget" 2>&1 | tail -6
  done
}
# heldout SEED COUNT PASSES LIMIT BUDGET RECORDS M CHANGE [changed_picks.py options]: the shapes of M's range whose
# pick the planner CHANGE (NAME=VALUE) moves, each pick timed beside the pick under CHANGE ("alt"), PASSES runs;
# an H100 plans without stream-K on both sides (engine.plan_profile).
heldout() {
  local seed=$1 count=$2 passes=$3 limit=$4 budget=$5 records=$6 m=$7 change=$8 base=""
  shift 8
  case $(nvidia-smi --query-gpu=name --format=csv,noheader) in *H100*) base="--base stream_k_offered=0" ;; esac
  # shellcheck disable=SC2086
  shapes=$(python3 benchmarks/changed_picks.py $base --set "$change" "$@" --m "$m" --count "$count" --seed "$seed" \
             | tail -1)
  lean_passes "$passes" "$limit" "$budget" "$records" "$shapes" --alt "$change"
}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu --format=csv | tee "$OUT/env.txt"
for s in ${STEPS:-}; do
  echo "== $s $(date +%T)"
  case $s in
    gt) timeout "${GT_T:-300}" python3 -m pytest -q -x tests/test_grouped_gpu.py -k "${GT_K:-not fp8 and not block}" 2>&1 \
          | tee "$OUT/pytest_grouped.txt" | tail -8 ;;
    # shellcheck disable=SC2086
    et) timeout "${ET_T:-300}" python3 -m pytest -q -x ${ET_FILES:-tests/test_engine2_gpu.py tests/test_decode_gpu.py tests/test_fp32.py} 2>&1 \
          | tee "$OUT/pytest_engine.txt" | tail -8 ;;
    gsan) for tool in ${GSAN_TOOLS:-memcheck racecheck}; do
            echo "== compute-sanitizer --tool $tool" | tee -a "$OUT/grouped_sanitizer.txt"
            # shellcheck disable=SC2046,SC2086
            timeout "${GSAN_T:-200}" compute-sanitizer --tool "$tool" --report-api-errors no \
              $([ "$tool" = memcheck ] && echo --leak-check no) --print-limit 20 \
              python3 benchmarks/grouped_sanitize.py --only "${GSAN_ONLY:-bf16}" ${GSAN_ARGS:-} 2>&1 | tee -a "$OUT/grouped_sanitizer.txt" | tail -6
          done ;;
    eh) timeout "${EH_T:-200}" python3 benchmarks/eager_host.py --grouped --no-calls --out "$OUT/eager.jsonl" 2>&1 \
          | tee "$OUT/eager_grouped.txt" | tail -40 ;;
    # shellcheck disable=SC2086
    ed) timeout "${ED_T:-150}" python3 benchmarks/eager_host.py ${ED_ARGS:-} --out "$OUT/eager.jsonl" 2>&1 \
          | tee "$OUT/eager_dense.txt" | tail -40 ;;
    suite) for name in ${SUITES:-prefill}; do
             timeout "${SUITE_T:-200}" python3 -m gemmlab bench --suite "matmul-$name" --no-plots --out "$OUT/matmul.jsonl" 2>&1 \
               | tee -a "$OUT/suites.txt" | tail -"${SUITE_TAIL:-12}"
           done ;;
    varx) for pv in ${VARX:-stream=base,hint1,hint2,hint3,store moe=base,hint1,hint2 decode=base,dhint}; do
            timeout "${VAR_T:-300}" python3 benchmarks/probes/probe_variants.py "$OUT/variants_probe.jsonl" --pick "${pv%%=*}" \
              --limit "${VAR_LIMIT:-24}" --variants "${pv#*=}" 2>&1 | grep -v "^ " | tail -"${VAR_TAIL:-30}"
          done ;;
    fit) timeout "${FIT_T:-400}" python3 benchmarks/probes/probe_grouped_fit.py "$OUT/grouped_fit_probe.jsonl" 2>&1 | tail -30 ;;
    # shellcheck disable=SC2086
    gsuite) timeout "${GS_T:-400}" python3 benchmarks/grouped_bench.py ${GS_ARGS:-} --budget-s "${GS_BUDGET:-300}" \
              --rounds "${GS_ROUNDS:-9}" --out "$OUT/grouped.jsonl" 2>&1 | tee -a "$OUT/grouped_suite.txt" | grep -v "^ " | tail -40 ;;
    # Plain JSON lines; the committed records are gzipped, a run added as one more member:
    #   gzip -c <OUT>/engine_broad.jsonl >> benchmarks/results/engine_broad.jsonl.gz
    # shellcheck disable=SC2086
    broad) timeout "${BR_T:-520}" python3 benchmarks/engine_broad.py --out "$OUT/engine_broad.jsonl" --budget-s "${BR_BUDGET:-330}" ${BR_ARGS:-} 2>&1 \
             | tail -7 ;;
    fuzz) GEMMLAB_FUZZ_SECONDS=${FUZZ_S:-120} GEMMLAB_FUZZ_RECORD="$OUT/fuzz.jsonl" timeout "${FUZZ_T:-300}" \
            python3 -m pytest -q -s -m slow tests/test_fuzz_gpu.py -k soak 2>&1 | tee "$OUT/fuzz.txt" | tail -8 ;;
    place) (export PYTHONPATH=$PWD/src:$PWD/benchmarks PROBE_SHAPES=${PLACE_SHAPES:-}
            timeout "${PLACE_T:-300}" python3 benchmarks/probes/probe_place.py "$OUT/place_probe.jsonl") 2>&1 \
          | tee "$OUT/place.txt" | tail -40 ;;
    clprobe) (export PYTHONPATH=$PWD/src:$PWD/benchmarks \
                PROBE_SHAPES=${CL_SHAPES:-"512,1024,8192;512,1024,4096;1024,768,3072"} PROBE_TILES=${CL_TILES:-"64,64;64,128"}
              for v in ${CL_VARIANTS:-asis cl1 cl1static}; do
                PROBE_VARIANT=$v timeout "${CL_T:-150}" python3 benchmarks/probes/probe_kstep_bound.py "$OUT/kstep_bound_probe.jsonl"
              done 2>&1 | tee "$OUT/clprobe.txt" | grep -v "^ " | tail -20
              for v in ${CL_MC_VARIANTS:-mc mcstatic}; do
                PROBE_MC_VARIANT=$v PROBE_GRIDS=${CL_GRIDS:-120,96} timeout "${CL_T:-150}" \
                  python3 benchmarks/probes/probe_mc_parts.py "$OUT/mc_parts_probe.jsonl"
              done 2>&1 | tee -a "$OUT/clprobe.txt" | grep -v "^ " | tail -20
              for st in 0 1; do
                PROBE_STATIC=$st timeout "${CL_T:-150}" python3 benchmarks/probes/probe_smid_map.py "$OUT/smid_map.jsonl"
              done 2>&1 | tee -a "$OUT/clprobe.txt" | tail -20) ;;
    skorder) for v in ${SK_VARIANTS:-shipped rangefirst}; do
               PYTHONPATH=$PWD/src:$PWD/benchmarks PROBE_VARIANT=$v PROBE_SHAPES=${SK_SHAPES:-} \
                 timeout "${SK_T:-200}" python3 benchmarks/probes/probe_sk_order.py "$OUT/sk_order_probe.jsonl"
             done 2>&1 | tee "$OUT/skorder.txt" | grep -v "^ " | tail -30 ;;
    cpplans) PYTHONPATH=$PWD/src:$PWD/benchmarks PROBE_SHAPES=${CP_SHAPES:-} timeout "${CP_T:-240}" \
               python3 benchmarks/probes/probe_copy_plans.py "$OUT/copy_plans_probe.jsonl" 2>&1 | tee "$OUT/cpplans.txt" | tail -40 ;;
    hostprof) timeout "${HP_T:-150}" python3 benchmarks/probes/probe_host_profile.py "$OUT/host_profile.txt" \
                "$OUT/host_profile.jsonl" 2>&1 | tail -12 ;;
    twin) shapes=$(python3 benchmarks/changed_picks.py --swap-twin --m 129,4096 --count "${TW_COUNT:-32}" \
                     --seed "${TW_SEED:-5252}" | tail -1)
          lean_passes "${TW_PASSES:-2}" "${TW_T:-150}" "${TW_BUDGET:-115}" swap_twin_heldout.jsonl "$shapes" --swap-twin
          timeout 120 python3 -m pytest -q tests/test_swap_gpu.py -k twin 2>&1 | tee "$OUT/pytest_twin.txt" | tail -4 ;;
    evict) small="60,384,512;33,640,640;42,576,1152;39,256,576;11,4096,256;35,512,256;38,384,1024;61,768,1024"
           small="$small;43,1536,640;45,2048,512;59,256,768;62,1024,640;45,1600,256;35,576,768;64,256,2304;38,896,640"
           band="58,384,5120;29,1408,1152;34,576,3584;40,384,3072;42,1408,1280;102,5120,256;54,1280,1536;61,3072,512"
           band="$band;38,1408,1152;11,384,3072;24,896,2304;36,768,1536;78,576,3584;64,3584,384;39,768,2304"
           band="$band;73,576,3072;45,1152,1152;44,1152,1600;37,384,4096;60,4096,384"
           lean_passes "${EV_PASSES:-2}" "${EV_T:-170}" "${EV_BUDGET:-150}" evict_draws.jsonl "${EV_SHAPES:-$small;$band}" ;;
    padany) d1="1665,32768,6144;3883,2304,2304;321,15360,5120;679,15360,5120;313,27392,5120;774,7168,6144;836,5120,13824;265,12800,4096"
           d1="$d1;2860,12288,4096;320,27392,4096;1439,5120,5120;667,5120,13824;2641,2304,5760;278,13824,5120;780,5120,13696;793,27392,4096"
           d1="$d1;410,27392,4096;901,100352,5120;612,5120,5120;536,5120,13696;529,4096,13696;551,4096,14336;684,12800,4096;2871,1024,4096"
           d1="$d1;462,151552,4096;2705,100352,5120;1340,5120,5120;3119,1024,7168;305,15360,5120;563,4096,12800;1070,4608,4096;2110,5120,13824"
           d2="683,13824,5120;323,13824,5120;910,6144,6144;554,4096,14336;556,7168,7168;668,12800,4096;703,5120,13824;850,5120,5120"
           d2="$d2;681,7168,20480;1174,1024,6144;389,92544,6144;313,27392,5120;537,151552,4096;260,27392,4096;1932,12800,4096;536,4096,12800"
           d2="$d2;2071,2304,2304;521,13824,5120;657,7168,6144;1163,6144,24576;2216,27392,5120;264,27392,5120;385,92544,6144;309,15360,5120"
           d2="$d2;566,24576,6144;772,12800,4096;2103,5120,5120;802,5120,5120;470,151552,4096;1415,92544,6144;794,6144,6144;717,6144,16384"
           d2="$d2;2441,5632,2048;2085,5120,13824;650,7168,20480;554,8192,6144;404,21504,6144;3625,8192,8192;1208,15360,5120;935,6144,10752"
           case ${PA_DRAW:-both} in 1) draws=$d1 ;; 2) draws=$d2 ;; *) draws="$d1;$d2" ;; esac
           lean_passes "${PA_PASSES:-2}" "${PA_T:-200}" "${PA_BUDGET:-180}" pad_any_heldout.jsonl "${PA_SHAPES:-$draws}" ;;
    span) shapes=$(python3 benchmarks/changed_picks.py --set SWAP_PAD_SPAN=none --fresh --m 129,4096 \
                     --count "${SP_COUNT:-40}" --seed "${SP_SEED:-5501}" | tail -1)
          lean_passes "${SP_PASSES:-2}" "${SP_T:-200}" "${SP_BUDGET:-170}" span_heldout.jsonl "$shapes" --alt SWAP_PAD_SPAN=none ;;
    waves) case $(nvidia-smi --query-gpu=name --format=csv,noheader) in *H100*) seed=5711 ;; *) seed=5713 ;; esac
           heldout "${WV_SEED:-$seed}" "${WV_COUNT:-40}" "${WV_PASSES:-2}" "${WV_T:-200}" "${WV_BUDGET:-170}" \
             waves_heldout.jsonl 1,32 SWAP_PREFER_WAVES_MARGIN=1.35 ;;
    fresh) shapes=$(python3 benchmarks/fresh_draw.py --seed "${FR_SEED:?set FR_SEED}" --count "${FR_COUNT:-48}" | tail -1)
           lean_passes 1 "${FR_T:-200}" "${FR_BUDGET:-170}" fresh.jsonl "$shapes" --decode-beside ;;
    rings) heldout "${RG_SEED:-5901}" "${RG_COUNT:-40}" "${RG_PASSES:-2}" "${RG_T:-200}" "${RG_BUDGET:-170}" \
             rings_heldout.jsonl 1,192 DEEP_RING_STAGES=9 --stages
           timeout "${RG_TEST_T:-200}" python3 -m pytest -q tests/test_engine2_gpu.py -k deep_rings 2>&1 \
             | tee "$OUT/pytest_rings.txt" | tail -4 ;;
    l2f) heldout "${LF_SEED:-5801}" "${LF_COUNT:-52}" "${LF_PASSES:-1}" "${LF_T:-250}" "${LF_BUDGET:-220}" \
           l2f_heldout.jsonl 65,3000 tile64_l2_factor=1.25 ;;
    *) echo "unknown step $s (known: gt et gsan eh ed suite varx fit gsuite broad fuzz clprobe skorder cpplans hostprof twin evict padany span waves fresh rings l2f)" ;;
  esac
done
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv | tee -a "$OUT/env.txt"
