"""The fitted grouped kernel (kernels/engine/gemm_grouped_fit.cu), a draft the planner does not offer, without a
GPU: the probe's variants (token tiles up to 128 wide in steps of 16, up to 256 in steps of 32; ping-pong
consumers of 64 weight rows) compile for sm_90a without spills or local memory, with one k-loop per width:
that width's HGMMA, four k16 steps each, one wgmma fence and the two waits a loop (nothing serialized). Its GPU check and timings are the probe's
(benchmarks/probes/probe_grouped_fit.py: float32 references on NaN-poisoned outputs; docs/worklog.md,
session 30)."""

import re
from collections import Counter

import pytest

from gemmlab import sass
from gemmlab.jit.compiler import compile_kernel

TRAITS = ("GemmTraits<__nv_bfloat16, __nv_bfloat16, __nv_bfloat16, {bm}, {wmax}, {stages}, false, false, false, "
          "false, 0, true, {sched}, true>")


@pytest.mark.parametrize("bm, wmax, stages, q, max_g, sched", [(128, 128, 5, 16, 128, 0), (128, 256, 4, 32, 64, 0),
                                                               (64, 256, 4, 32, 128, 3)])
def test_fitted_grouped_draft_compiles_one_loop_per_width(bm, wmax, stages, q, max_g, sched):
    traits = TRAITS.format(bm=bm, wmax=wmax, stages=stages, sched=sched)
    ck = compile_kernel("engine/gemm_grouped_fit.cu", f"engine_gemm_grouped_fit<{traits}, {max_g}, {q}>",
                        arch="sm_90a")
    assert not ck.resources.spills and ck.resources.stack_frame == 0, ck.resources
    for needle in ("serialized", "C7510", "C7519"):
        assert needle not in ck.log, ck.log
    text = sass.disassemble(ck.cubin)
    widths = list(range(q, wmax + 1, q))
    assert Counter(re.findall(r"HGMMA\.64x(\d+)x16", text)) == {str(w): 4 for w in widths}
    assert not re.search(r"\b(LDL|STL)\b", text)  # no local memory
    syncs = Counter(re.findall(r"WARPGROUP\.(ARRIVE|DEPBAR)", text))
    assert syncs == {"ARRIVE": len(widths), "DEPBAR": 2 * len(widths)}, syncs
