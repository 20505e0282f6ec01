"""The L2 eviction hints of the operand loads (common/tma.cuh ``L2_HINT``; a probe's setting, 0 in the
library) without a GPU: a build without them issues plain TMA loads (the engine's plans here built without
``Plan.evict_weight``, the one hint the library sets, tested in test_engine2.py); each hinted build compiles for sm_90a
without spills or local memory and attaches a cache policy (SASS: ``UTMALDG ..., desc[UR]``) to the loads
the setting names: both operands' (1: weight evict-first, activations evict-last; 3: both evict-last) or the
weight's only (2), where the weight is B, or A in a swapped plan (``swap_ab``) and in the fitted grouped
kernel. Timed by benchmarks/probes/probe_variants.py (``--variants base,hint1,hint2,hint3``)."""

import dataclasses
import re

import pytest

from gemmlab import grouped, planner, sass
from gemmlab.jit.compiler import compile_kernel


def _plans():
    """(id, source, name expression, weight operand) of a plain, a swapped, a split-K and an FP8 plan, and
    the tiled and fitted grouped plans."""
    out = []
    for M, N, K in ((4096, 4096, 4096), (32, 14336, 4096), (64, 5120, 5120)):
        p = dataclasses.replace(planner.plan(M, N, K), evict_weight=False)  # the plan's own setting: test_engine2
        out.append((f"engine {M}x{N}x{K}", planner.SOURCE, p.name_expression, "A" if p.swap_ab else "B"))
    assert {w for *_, w in out} == {"A", "B"} and planner.plan(64, 5120, 5120).schedule == "split_k"
    f = planner.plan_fp8(4096, 4096, 4096)
    out.append(("fp8 4096^3", planner.FP8_SOURCE, f.name_expression, "B"))
    for T, G in ((4096, 64), (256, 64)):
        g = grouped.plan("contiguous", G, T, 2816, 2048)
        out.append((f"grouped {'fit' if g.fit else 'tiled'} T={T} G={G}",
                    grouped.FIT_SOURCE if g.fit else grouped.SOURCE, g.name_expression, "A" if g.fit else "B"))
    assert {i.split()[1] for i, *_ in out if i.startswith("grouped")} == {"fit", "tiled"}
    return out


PLANS = _plans()


def _loads(source: str, expr: str, hint: int):
    ck = compile_kernel(source, expr, arch="sm_90a", defines={"L2_HINT": str(hint)} if hint else None)
    assert not ck.resources.spills and ck.resources.stack_frame == 0, ck.resources
    text = sass.disassemble(ck.cubin)
    assert not re.search(r"\b(LDL|STL)\b", text)
    return [line.split("*/", 1)[1].strip() for line in text.splitlines() if "UTMALDG" in line]


@pytest.mark.parametrize("case", PLANS, ids=lambda c: c[0])
def test_hinted_loads_carry_a_policy_where_the_setting_says(case):
    _, source, expr, weight = case
    plain = _loads(source, expr, 0)
    assert plain and not any("desc[" in ins for ins in plain)  # the library's build: no hint
    for hint in (1, 2, 3):
        loads = _loads(source, expr, hint)
        hinted = [ins for ins in loads if "desc[" in ins]
        assert len(loads) == len(plain), (hint, loads)
        if hint in (1, 3):
            assert len(hinted) == len(loads), (hint, loads)  # every operand load (no scale boxes here)
        else:
            assert 0 < len(hinted) < len(loads), (hint, loads)  # the weight's only


@pytest.mark.parametrize("case", [c for c in PLANS if "fit" not in c[0]], ids=lambda c: c[0])
def test_hinted_stores_carry_a_policy(case):
    _, source, expr, _ = case
    for hint in (0, 1):
        ck = compile_kernel(source, expr, arch="sm_90a", defines={"L2_STORE_HINT": "1"} if hint else None)
        assert not ck.resources.spills and ck.resources.stack_frame == 0, ck.resources
        stores = [line for line in sass.disassemble(ck.cubin).splitlines() if "UTMASTG" in line]
        if not stores:  # a plan that stores with threads (direct rows): nothing to hint
            continue
        assert all(("desc[" in line) == bool(hint) for line in stores), (hint, stores)


@pytest.mark.parametrize("nt", [1, 2, 4, 8])
def test_decode_weight_loads_take_the_probe_hint(nt):
    """engine/decode.cu DECODE_LOAD_HINT 1: every weight load (the .L1::no_allocate ones) fetches 256 bytes
    into the L2 (SASS LTC256B), without spills; 0 is the library's plain load."""
    from gemmlab import decode

    expr = decode.kernel_expr("__nv_bfloat16", "__nv_bfloat16", "__nv_bfloat16", nt, 0, False)
    for hint in (0, 1):
        ck = compile_kernel(decode.SOURCE, expr, arch="sm_90a", defines={"DECODE_LOAD_HINT": "1"} if hint else None)
        assert not ck.resources.spills and ck.resources.stack_frame == 0, ck.resources
        weight = [line for line in sass.disassemble(ck.cubin).splitlines() if "LDG.E.NA" in line]
        assert weight and all(("LTC256B" in line) == bool(hint) for line in weight), (hint, weight[:2])
