"""The fitted grouped kernel (kernels/engine/gemm_grouped_fit.cu; ``grouped_mm`` takes it at few rows a group)
without a GPU: the probe's variants (token tiles up to 128 wide in steps of 16, up to 256 in steps of 32; 128 or
256 weight rows a tile; ping-pong consumers of 64 or 128 weight rows; one epilogue a width or one for all)
compile for sm_90a without spills or local memory, with one k-loop per width: that width's HGMMA, four k16
steps each, one wgmma fence and the two waits a loop (nothing serialized). As a grouped plan
(``GroupedPlan.fit``): where ``candidates`` lists it, that ``plan`` takes it there (with ``FIT_OFFERED``), the
plan's own checks, its launch arguments against the kernel's PTX parameters, its SASS claims. On the GPU:
tests/test_grouped_gpu.py (``test_fitted_*``) and the probe's timings (benchmarks/probes/probe_grouped_fit.py;
docs/worklog.md, sessions 30-31)."""

import dataclasses
import re
from collections import Counter

import pytest
import torch

from gemmlab import grouped, sass
from gemmlab.jit.compiler import compile_kernel

from fakes import launch_arg_types, ptx_param_types, unsigned

TRAITS = ("GemmTraits<__nv_bfloat16, __nv_bfloat16, __nv_bfloat16, {bm}, {wmax}, {stages}, false, false, false, "
          "false, 0, true, {sched}, true>")


@pytest.mark.parametrize("bm, wmax, stages, q, max_g, sched, shared",
                         [(128, 128, 5, 16, 128, 0, False), (128, 256, 4, 32, 64, 0, False),
                          (64, 256, 4, 32, 128, 3, False), (256, 128, 4, 16, 64, 0, False),
                          (128, 128, 5, 16, 128, 3, False), (128, 128, 5, 16, 128, 0, True),
                          (256, 128, 4, 16, 64, 0, True), (128, 128, 5, 16, 128, 3, True)])
def test_fitted_grouped_draft_compiles_one_loop_per_width(bm, wmax, stages, q, max_g, sched, shared):
    traits = TRAITS.format(bm=bm, wmax=wmax, stages=stages, sched=sched)
    ck = compile_kernel("engine/gemm_grouped_fit.cu",
                        f"engine_gemm_grouped_fit<{traits}, {max_g}, {q}{', true' if shared else ''}>", arch="sm_90a")
    assert not ck.resources.spills and ck.resources.stack_frame == 0, ck.resources
    for needle in ("serialized", "C7510", "C7519"):
        assert needle not in ck.log, ck.log
    text = sass.disassemble(ck.cubin)
    widths = list(range(q, wmax + 1, q))
    blocks = bm // 64 if sched == 3 else bm // 128  # a consumer's 64-row blocks: one wgmma each a k16 step
    assert Counter(re.findall(r"HGMMA\.64x(\d+)x16", text)) == {str(w): 4 * blocks for w in widths}
    assert not re.search(r"\b(LDL|STL)\b", text)  # no local memory
    syncs = Counter(re.findall(r"WARPGROUP\.(ARRIVE|DEPBAR)", text))
    assert syncs == {"ARRIVE": len(widths), "DEPBAR": 2 * len(widths)}, syncs
    # The epilogue's stmatrix x4 (16 columns of a 64-row block each): one epilogue at WMAX (SHARED_STORE), or
    # one a width.
    stsm = len(re.findall(r"\bSTSM\b", text))
    assert stsm == blocks * (wmax // 16 if shared else sum(-(-w // 16) for w in widths)), stsm


# The fitted form as a grouped plan (GroupedPlan.fit) ---------------------------------------------------------

def _fitted(groups=64, rows=512, N=5120, K=3584, **kw):
    return next(c for c in grouped.candidates("contiguous", groups, rows, N, K, **kw) if c.fit)


def test_fitted_form_is_listed_only_where_it_was_measured_ahead():
    p = _fitted()
    assert (p.bm, p.bn, p.stages, p.direct, p.schedule) == (128, 128, 5, True, "data_parallel")
    assert p.name_expression.startswith(grouped.FIT_KERNEL + "<GemmTraits<__nv_bfloat16, __nv_bfloat16")
    assert "token tiles fitted per group" in repr(p) and p.smem_bytes == 1024 + 5 * 256 * 128 + 4 * 8192
    for kw in ({"out_dtype": "fp32"}, {"dtype": "e4m3"}, {"b_mn": True}):
        assert not any(c.fit for c in grouped.candidates("contiguous", 64, 512, 5120, 3584, **kw)), kw
    assert not any(c.fit for c in grouped.candidates("masked", 64, 8, 5120, 3584))
    assert not any(c.fit for c in grouped.candidates("contiguous", 64, 64 * 17, 5120, 3584))  # 17 rows a group
    assert not any(c.fit for c in grouped.candidates("contiguous", 129, 129, 5120, 3584))  # 129 groups
    assert _fitted(groups=128, rows=128 * 16).table == 128 and _fitted(dtype="fp16", out_dtype="fp16")


def test_fitted_form_is_picked_where_listed_and_offered(monkeypatch):
    assert grouped.plan("contiguous", 64, 512, 5120, 3584).fit
    assert not grouped.plan("contiguous", 64, 4096, 5120, 3584).fit  # not listed at 64 rows a group
    monkeypatch.setattr(grouped, "FIT_OFFERED", False)
    assert not grouped.plan("contiguous", 64, 512, 5120, 3584).fit


@pytest.mark.parametrize("change", [{"layout": "masked"}, {"bm": 64}, {"direct": False}, {"out_dtype": "fp32"},
                                    {"b_mn": True}, {"stages": 4}, {"rows": grouped.FIT_MAX_TILE_ROWS + 1}])
def test_fitted_plan_refuses_what_its_kernel_does_not_do(change):
    with pytest.raises(ValueError, match="fitted form"):
        dataclasses.replace(_fitted(), **change)


@pytest.mark.parametrize("shared", [False, True])
def test_fitted_launch_arguments_match_the_kernel(shared, monkeypatch):
    monkeypatch.setattr(grouped, "FIT_SHARED_STORE", shared)
    p = _fitted(groups=4, rows=64, N=48, K=64)
    a, b = torch.randn(64, 64).bfloat16(), torch.randn(4, 48, 64).bfloat16()
    offs = torch.tensor([0, 5, 5, 40, 64], dtype=torch.int32)
    captured = {}
    monkeypatch.setattr(grouped, "compile_plan", lambda p: "compiled")
    monkeypatch.setattr(grouped, "_tensor_map", lambda t, box: ("tmap", tuple(t.shape), tuple(box)))
    monkeypatch.setattr(grouped, "_launch_fn", lambda: lambda compiled, **kw: captured.update(kw))
    grouped.launch(p, a, b, offs, 1, torch.empty(64, 48, dtype=torch.bfloat16))
    args = captured["args"]
    assert captured["grid"] == p.grid and captured["block"] == 384 and captured["smem"] == p.smem_bytes
    assert launch_arg_types(args) == unsigned(ptx_param_types(grouped.FIT_SOURCE, p.name_expression))
    assert len(grouped.FIT_PARAMS) == len(args)
    assert args[0] == ("tmap", (4 * 48, 64), (128, 64))  # the weights' rows
    assert args[1:9] == tuple(("tmap", (64, 64), (w, 64)) for w in range(16, 129, 16))  # a box of each width
    assert args[9] is offs and [int(x) for x in args[10:15]] == [1, 4, 64, 48, 64] and int(args[16]) == 48


@pytest.mark.parametrize("shared", [False, True])
def test_fitted_plan_compiles_clean(shared, monkeypatch):
    monkeypatch.setattr(grouped, "FIT_SHARED_STORE", shared)
    p = _fitted()
    assert p.name_expression.endswith(", 128, 16, true>" if shared else ", 128, 16>")
    ck = grouped.compile_plan(p)
    assert sass.check(grouped.sass_expect(p), sass.kernel_summary(ck), ck.resources) == []
    assert ("shared store" in p.compiled_name) == shared
