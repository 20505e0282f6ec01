"""compute-sanitizer's memcheck and racecheck over the engine's and the decode kernel's launches (issue 15;
``slow``: minutes). Skipped when ``compute-sanitizer`` is not on PATH.

Each tool runs one Python process that calls every route on small shapes, each result checked against
float64: h11 unsplit and split-K (a forced plan of clusters of 3), the aligned copies and direct stores of
unaligned operands and outputs; the engine kernel (``kernels/engine/gemm.cu``) through forced
``planner.Plan``s: data-parallel with 64- (a 16-wide tail piece), 128- and 256-row tiles, cluster split-K
with 64- and 128-row tiles, stream-K all streamed (64 and 128 rows) and hybrid (full data-parallel wave +
streamed tiles), global split-K (its bulk exchange, all split and hybrid, and a 256-row tile's thread
stores), copies + direct stores under each schedule, epilogues (bias + relu, silu, fp32 output
with beta * C), B multicast (64- and 128-row tiles, a padding tile), and calls the router itself sends to
the engine kernel (one with B multicast, two swapped over many token columns: SWAP_WIDE); the decode kernel
(forced) unsplit and split-K, aligned and reading unaligned rows in place, strided (the router's, and
split-K at each token-tile count). (Its unaligned loads read whole
16-byte windows that hold a byte the call needs, so past a tensor's last element by up to 15 bytes, inside
torch's allocations, which are whole 512-byte blocks; memcheck would report those bytes only for a tensor
allocated to an exact odd size outside torch's allocator.)
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.hopper, pytest.mark.slow]

DRIVER = r"""
import sys, torch
from gemmlab import decode, engine, planner
from gemmlab.bench import poison_, rel_error

ACT = {None: lambda x: x, "relu": torch.relu, "silu": lambda x: x * torch.sigmoid(x)}

def out_for(M, N, out_cols=None, dtype=torch.bfloat16):
    if out_cols:  # a view whose rows are not 16-byte aligned: direct stores
        return poison_(torch.empty(M, out_cols, device="cuda", dtype=dtype))[:, :N]
    return poison_(torch.empty(M, N, device="cuda", dtype=dtype))

def run(name, a, b, plan=None, out=None, **kw):
    out = out_for(a.shape[0], b.shape[1]) if out is None else out
    if callable(plan):
        plan = plan(a, b, out, **kw)
    engine.gemm(a, b, out, plan=plan, **kw)
    torch.cuda.synchronize()
    ref = kw.get("alpha", 1.0) * (a.double() @ b.double())
    if kw.get("c") is not None and kw.get("beta", 0.0) != 0.0:
        ref = ref + kw["beta"] * kw["c"].double()
    if kw.get("bias") is not None:
        ref = ref + kw["bias"].double()
    err = rel_error(out, ACT[kw.get("activation")](ref))
    print(f"{name}: {plan!r}: rel error {err:.2e}", flush=True)
    if not err <= 1e-2:
        sys.exit(3)

def r(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape, device="cuda", dtype=dtype)

sm = torch.cuda.get_device_properties(0).multi_processor_count
prof = engine.plan_profile(sm)

def engine_plan(schedule, bm=None, hybrid=False, mcast=1):
    # The best plan of the engine kernel with this schedule (and tile height, and B multicast) for the
    # call's tensors: the same dtypes, operand majors, output alignment and epilogue as Engine2Launch checks.
    def pick(a, b, out, bias=None, activation=None, c=None, beta=0.0, alpha=1.0):
        M, K = a.shape
        has_c = c is not None and beta != 0.0
        cands = planner.candidates(M, b.shape[1], K, dtype=engine._DT[a.dtype], out_dtype=engine._DT[out.dtype],
                                   bias_dtype=engine._DT[bias.dtype] if bias is not None else None,
                                   has_c=has_c, activation=activation, a_mn=engine._operand_mn(a, 1),
                                   b_mn=engine._operand_mn(b, 0), direct=not engine._tma_ok(out), profile=prof,
                                   schedules=planner.SCHEDULES, mcast=mcast > 1)
        ok = [p for p in cands if p.schedule == schedule and (bm is None or p.bm == bm) and p.mcast == mcast
              and (not hybrid or 0 < p.sk_tiles < p.tiles)]
        assert ok, f"no {schedule} plan with bm={bm} hybrid={hybrid} for {M}x{b.shape[1]}x{K}"
        return ok[0]
    return pick

w = r(256, 512)
run("h11", r(200, 512), w.t(), plan=(128, 1), bias=r(256), activation="relu")
run("h11 split-K 3", r(100, 1536), r(256, 1536).t(), plan=(64, 3))
run("h11 copies + direct store", r(67, 301)[:, :299], r(299, 131), plan=(64, 1), out=out_for(67, 131, 133))

run("engine DP 64-row, tail piece, bias + relu", r(100, 512), w.t(), plan=engine_plan("data_parallel", 64),
    bias=r(256), activation="relu")
run("engine DP 128-row", r(200, 512), r(384, 512).t(), plan=engine_plan("data_parallel", 128))
run("engine DP 256-row, silu", r(300, 512), r(384, 512).t(), plan=engine_plan("data_parallel", 256), activation="silu")
run("engine split-K 64-row", r(64, 4096), r(256, 4096).t(), plan=engine_plan("split_k", 64), bias=r(256))
run("engine split-K 128-row", r(100, 4096), r(384, 4096).t(), plan=engine_plan("split_k", 128))
run("engine stream-K 64-row", r(256, 2048), r(512, 2048).t(), plan=engine_plan("stream_k", 64))
run("engine stream-K 128-row, fp32 out + beta * C", r(256, 2048), r(512, 2048).t(),
    plan=engine_plan("stream_k", 128), out=out_for(256, 512, dtype=torch.float32),
    c=r(256, 512, dtype=torch.float32), beta=-0.5, alpha=2.0)
run("engine stream-K hybrid", r(640, 1024), r(2304, 1024).t(), plan=engine_plan("stream_k", hybrid=True))
# Global split-K (not offered; runnable): the bulk exchange through the workspace (GSK_BULK), all split and
# hybrid (a data-parallel wave first), bias; and a tile whose slices do not fit (thread stores and loads).
run("engine global split-K 128-row, bulk exchange", r(512, 2048), r(1024, 2048).t(),
    plan=engine_plan("split_k_global", 128), bias=r(1024))
run("engine global split-K hybrid", r(1000, 1024), r(3000, 1024).t(), plan=engine_plan("split_k_global", hybrid=True))
run("engine global split-K 256-row", r(700, 3000), r(1920, 3000).t(), plan=engine_plan("split_k_global", 256))
run("engine ping-pong 128-row", r(1100, 512), r(2048, 512).t(), plan=engine_plan("pingpong", 128), bias=r(2048))
run("engine ping-pong 64-row, silu", r(300, 512), r(4000, 512).t(), plan=engine_plan("pingpong", 64), activation="silu")
for sched in ("data_parallel", "split_k", "stream_k"):
    a, b = r(67, 1031)[:, :1027], r(1027, 131)  # A's and B's rows not 16-byte aligned: copies
    run(f"engine {sched} copies + direct store", a, b, plan=engine_plan(sched), out=out_for(67, 131, 133),
        bias=r(131))
# B multicast: pairs of CTAs share B's tile (rows of K = 1000: 16- but not 32-byte aligned, where it is offered)
run("engine B multicast 128-row, padding tile, bias", r(300, 1000), r(640, 1000).t(),
    plan=engine_plan("data_parallel", 128, mcast=2), bias=r(640))
run("engine B multicast 64-row", r(200, 1000), r(512, 1000).t(), plan=engine_plan("data_parallel", 64, mcast=2))
x, wx = r(512, 3000), r(1024, 3000)
route = engine.route(x, wx.t(), out_for(512, 1024), bias=None, activation=None, has_c=False, sm_count=sm)
assert route.kernel == "engine" and route.plan.mcast == 2, route
run("engine routed, B multicast", x, wx.t())
x, wx = r(256, 2048), r(512, 2048)
route = engine.route(x, wx.t(), out_for(256, 512), bias=None, activation=None, has_c=False, sm_count=sm)
assert route.kernel == "engine", route
run("engine routed", x, wx.t())

# SWAP_WIDE: past 512 tokens the router's swapped plans over many token columns (the last one short)
for (M, N, K), sched in (((2050, 1152, 256), "data_parallel"), ((3000, 1024, 256), "pingpong")):
    x, wx = r(M, K), r(N, K)
    route = engine.route(x, wx.t(), out_for(M, N), bias=None, activation=None, has_c=False, sm_count=sm)
    assert route.kernel == "engine" and route.plan.swap_ab and route.plan.schedule == sched, route
    run(f"engine routed, swapped {sched}", x, wx.t())

x = r(7, 256)
assert engine.use_decode(x, r(14, 256).t())
run("decode 7x14x256", x, r(14, 256).t(), plan="decode", bias=r(14))
M, N, K = 16, 256, 8192
assert decode.plan(M, N, K, sm).splits > 1
run("decode split-K", r(M, K), r(N, K).t(), plan="decode", activation="relu")
# The unaligned variants: rows at any address (K odd, bases a few elements into their buffers), read in place
a, w = r(5, 1031)[:, 3:1030], r(300, 1030)[:, 1:1028]
assert engine.use_decode(a, w.t()) and not decode.aligned(a, w.t())
run("decode unaligned", a, w.t(), plan="decode", bias=r(300))
M, N, K = 16, 256, 8191
assert decode.plan(M, N, K, sm, decode.default_variant(decode.token_tiles(M), False)).splits > 1
run("decode unaligned split-K", r(M, K), r(N, K).t(), plan="decode", activation="silu")
# The strided variants (weights from decode.STRIDED_MIN_BYTES): the router's own (34 MB, bases off by a few
# elements, two iterations deep), and a forced split-K plan of each NT's
a, w = r(3, 4100)[:, 1:4100], r(4101, 4102)[:, 2:4101]
assert decode.variant_for(a, w.t()).strided and not decode.aligned(a, w.t())
run("decode strided", a, w.t(), plan="decode", bias=r(4101))
for M, v in ((8, decode.STRIDED_VARIANTS[1]), (16, decode.STRIDED_VARIANTS[2]), (32, decode.STRIDED_VARIANTS[4])):
    assert decode.plan(M, 256, 8191, sm, v).splits > 1
    x, w = r(M, 8192)[:, 1:], r(256, 8193)[:, 2:]
    out = out_for(M, 256)
    decode.run_variant(x, w.t(), out, v)
    torch.cuda.synchronize()
    err = rel_error(out, x.double() @ w.t().double())
    print(f"decode strided split-K {v}: rel error {err:.2e}", flush=True)
    if not err <= 1e-2:
        sys.exit(3)
print("all routes ran")
"""


def _sanitize(tool: str, extra: list[str]) -> subprocess.CompletedProcess:
    exe = shutil.which("compute-sanitizer")
    if exe is None:
        pytest.skip("compute-sanitizer is not on PATH")
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)}
    return subprocess.run([exe, "--tool", tool, "--error-exitcode", "99", *extra, sys.executable, "-c", DRIVER],
                          capture_output=True, text=True, env=env, timeout=1800)


def _report(run: subprocess.CompletedProcess) -> str:
    """The head of the log (where the first errors are) and its tail."""
    return f"exit {run.returncode}\n{run.stdout[:6000]}\n...\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"


def test_memcheck_engine_and_decode():
    # API errors are not reported: cuda-bindings looks up the driver's entry points with cuGetProcAddress
    # when cuda-core first opens the device, and the lookups of functions this driver lacks fail
    # (34 CUDA_ERROR_INVALID_VALUE on the H200's driver 580, none from gemmlab's own calls). Our own
    # driver calls raise in Python when they fail, which ends the script before "all routes ran".
    run = _sanitize("memcheck", ["--leak-check", "no", "--report-api-errors", "no"])
    assert run.returncode == 0 and "all routes ran" in run.stdout, _report(run)
    assert "ERROR SUMMARY: 0 errors" in run.stdout + run.stderr, _report(run)


def test_racecheck_engine_and_decode():
    run = _sanitize("racecheck", [])
    assert run.returncode == 0 and "all routes ran" in run.stdout, _report(run)
    out = run.stdout + run.stderr
    assert "RACECHECK SUMMARY: 0 hazards" in out or "0 errors" in out, _report(run)
