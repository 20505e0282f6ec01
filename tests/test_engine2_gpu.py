"""The engine kernel (kernels/engine/gemm.cu through gemmlab.engine2) on a Hopper GPU: every schedule, tile
height and epilogue against a float64 reference on fresh randn inputs, outputs poisoned with NaN (inside
and around the written region), and every schedule bitwise deterministic over repeated runs."""

import dataclasses
import pytest
import torch

from gemmlab import engine2
from gemmlab import planner
from gemmlab.bench import rel_error

from fakes import frame_cols, reference

pytestmark = pytest.mark.hopper

_TYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _pick(M, N, K, bm, bn, schedule, **kw) -> planner.Plan:
    """The candidate of that tile and schedule (the best-scored one if several), or skip. Ping-pong where
    the planner does not offer it (direct stores, rows of K not 32-byte aligned: slower, but the kernel
    runs them) is the data-parallel plan of the tile with ping-pong consumers."""
    prof = dataclasses.replace(engine2._profile(torch.device("cuda")), stream_k_offered=True)  # the kernel, not the planner's choice
    kw = dict(kw)
    mcast = 2 if kw.pop("mcast", False) else 1
    prefetch = kw.pop("prefetch", 0)  # Plan.prefetch: not offered by the planner, set on its plan
    col_split = kw.pop("col_split", False)  # Plan.col_split: set on the planner's one-consumer plan
    cands = planner.candidates(M, N, K, profile=prof, schedules=planner.SCHEDULES, mcast=mcast > 1, **kw)
    for c in cands:
        if (c.bm, c.bn, c.schedule, c.mcast) == (bm, bn, schedule, mcast) and not c.swap_ab:
            if col_split:
                return dataclasses.replace(c, col_split=True, stages=planner.stages_for(bm, bn, schedule, c.dtype, True))
            return dataclasses.replace(c, prefetch=prefetch) if prefetch else c
    if schedule == "pingpong":
        for c in cands:
            if (c.bm, c.bn, c.schedule) == (bm, bn, "data_parallel") and c.tiles > prof.sm_count:
                return dataclasses.replace(c, schedule="pingpong", grid=prof.sm_count,
                                           stages=planner.stages_for(bm, bn, "pingpong", c.dtype))
    pytest.skip(f"no {bm}x{bn} {schedule} plan for {M}x{N}x{K}")


def _run_case(p: planner.Plan, *, alpha=1.0, beta=0.0, seed=0):
    """Inputs, a poisoned output inside a poisoned frame, one launch; returns (out, frame, reference)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    dt, odt = _TYPES[p.dtype], _TYPES[p.out_dtype]
    M, N, K = p.M, p.N, p.K
    a = torch.randn(M, K, device="cuda", generator=g).to(dt)
    if p.a_mn:
        a = torch.randn(K, M, device="cuda", generator=g).to(dt).t()
    w = torch.randn(N, K, device="cuda", generator=g).to(dt)
    b = torch.randn(K, N, device="cuda", generator=g).to(dt) if p.b_mn else w.t()
    # The output sits inside a larger NaN frame: a store past the tile or the tensor shows up as a
    # non-NaN value outside it. Rows of N + 8 elements stay 16-byte aligned (TMA stores), N + 1 do not.
    frame = torch.full((M + 8, frame_cols(N, odt.itemsize, p.direct)), float("nan"), device="cuda", dtype=odt)
    out = frame[:M, :N]
    c = torch.randn(M, N, device="cuda", generator=g).to(odt) if p.has_c else None
    bias = torch.randn(N, device="cuda", generator=g).to(_TYPES[p.bias_dtype]) if p.bias_dtype else None
    engine2.launch(p, a, b, out, alpha=alpha, beta=beta, c=c, bias=bias)
    torch.cuda.synchronize()
    return out, frame, reference(a, b, bias=bias, activation=p.activation, alpha=alpha, beta=beta, c=c)


CASES = [
    # (M, N, K), tile, schedule, variant
    ((1000, 3000, 1000), 128, 256, "data_parallel", {}),
    ((1000, 3000, 1000), 128, 208, "data_parallel", {}),  # tail piece of 16 columns
    ((777, 1000, 2000), 128, 96, "data_parallel", {}),  # tail 32, ragged M and N
    ((300, 2000, 777), 256, 128, "data_parallel", {}),  # two m64 wgmmas per consumer, short A box
    ((2000, 704, 1500), 256, 176, "data_parallel", {}),
    ((40, 3000, 2000), 64, 112, "data_parallel", {}),  # one consumer, tail 48
    ((16, 4096, 4096), 64, 128, "split_k", {}),
    ((200, 1000, 4096), 128, 80, "split_k", {}),
    ((300, 1000, 8192), 256, 128, "split_k", {}),
    ((3, 1024, 2560), 128, 80, "split_k", {}),  # 3 rows of 128 over 8 ranks: some ranks reduce none
    ((16, 14336, 4096), 64, 16, "data_parallel", {"prefetch": 8}),  # L2 prefetch of the weight stream
    ((1000, 3000, 1000), 128, 256, "data_parallel", {"prefetch": 4}),  # the last 4 k-steps prefetch none
    ((300, 1000, 8192), 128, 96, "split_k", {"prefetch": 16}),  # within each split's k-range
    ((1500, 3000, 2000), 128, 256, "stream_k", {"prefetch": 8}),
    ((16, 1024, 2560), 128, 80, "split_k", {"has_c": True, "bias_dtype": "fp32"}),  # 2 rows a rank
    ((1500, 3000, 2000), 128, 256, "stream_k", {}),  # data-parallel wave + streamed tail
    ((128, 4096, 4096), 64, 112, "stream_k", {}),  # all streamed, owners with several contributors
    ((700, 1920, 3000), 256, 144, "stream_k", {}),
    ((1000, 3000, 1000), 128, 192, "data_parallel", {"out_dtype": "fp32", "bias_dtype": "fp32", "activation": "gelu"}),
    ((1000, 3001, 1000), 128, 128, "data_parallel", {"direct": True}),  # output rows not 16-byte aligned
    ((1000, 3001, 1000), 128, 144, "stream_k", {"direct": True, "out_dtype": "fp32", "has_c": True}),
    ((1000, 2000, 1000), 128, 128, "data_parallel", {"a_mn": True, "b_mn": True, "activation": "silu"}),
    ((500, 2048, 3000), 128, 192, "split_k", {"b_mn": True, "bias_dtype": "bf16", "has_c": True}),
    ((1000, 2000, 1000), 128, 160, "stream_k", {"dtype": "fp16", "out_dtype": "fp16", "activation": "relu"}),
    ((64, 2000, 1000), 64, 64, "data_parallel", {"dtype": "fp16", "a_mn": True}),
    # ping-pong consumers: whole tiles in turn (more tiles than SMs), ragged edges, both operand majors
    ((1000, 3000, 1000), 128, 128, "pingpong", {}),
    ((1100, 3001, 777), 128, 192, "pingpong", {}),  # tail piece, ragged K, short A box
    ((300, 4000, 1000), 64, 96, "pingpong", {"dtype": "fp16", "out_dtype": "fp16", "activation": "relu"}),
    ((777, 3001, 1000), 64, 144, "pingpong", {"direct": True, "out_dtype": "fp32", "has_c": True}),
    ((1500, 2000, 1000), 128, 128, "pingpong", {"a_mn": True, "b_mn": True, "bias_dtype": "bf16"}),
    ((1000, 3000, 2000), 128, 96, "pingpong", {"out_dtype": "fp32", "bias_dtype": "fp32", "activation": "gelu"}),
    # global split-K: aligned k-ranges, every rank of a tile sums and stores a slice of its columns
    ((512, 1024, 4096), 128, 128, "split_k_global", {}),
    ((300, 1000, 8192), 128, 96, "split_k_global", {}),  # ragged M and N, blocks past M skipped
    ((100, 1000, 4096), 64, 80, "split_k_global", {}),  # one consumer, tail piece width
    ((700, 1920, 3000), 256, 112, "split_k_global", {}),  # two m64 blocks per consumer, uneven k-ranges
    ((1000, 3000, 4000), 128, 144, "split_k_global", {}),  # a data-parallel wave, then the split tail
    ((1000, 3001, 3000), 128, 144, "split_k_global", {"direct": True, "out_dtype": "fp32", "has_c": True}),
    ((1000, 2000, 3000), 128, 96, "split_k_global", {"dtype": "fp16", "out_dtype": "fp16", "activation": "relu",
                                                      "bias_dtype": "fp16"}),
    ((512, 1024, 4096), 128, 128, "split_k_global", {"a_mn": True, "b_mn": True}),
    # column split: a 64-row tile's two consumers take half its columns each (tails of 48 / 32 a consumer)
    ((1000, 3000, 1000), 64, 128, "data_parallel", {"col_split": True}),
    ((777, 1000, 2000), 64, 96, "data_parallel", {"col_split": True}),  # ragged M, N, short B box
    ((1000, 3001, 1000), 64, 192, "data_parallel", {"col_split": True, "direct": True, "out_dtype": "fp32",
                                                    "has_c": True, "bias_dtype": "fp32", "activation": "gelu"}),
    ((40, 3000, 2000), 64, 224, "data_parallel", {"col_split": True, "dtype": "fp16", "out_dtype": "fp16",
                                                  "activation": "relu", "a_mn": True}),
    ((300, 2000, 777), 64, 64, "data_parallel", {"col_split": True, "bias_dtype": "bf16", "has_c": True}),
    # B multicast: pairs of CTAs on vertically adjacent tiles share B's tile (each loads half)
    ((3000, 3000, 3000), 128, 144, "data_parallel", {"mcast": True}),  # rows of K 16- not 32-byte aligned
    ((2050, 3000, 1000), 128, 224, "data_parallel", {"mcast": True}),  # 17 rows of tiles: a padding tile
    ((300, 2000, 777), 256, 128, "data_parallel", {"mcast": True}),  # short A box, ragged K
    ((777, 3001, 1000), 128, 128, "data_parallel", {"mcast": True, "direct": True, "out_dtype": "fp32",
                                                     "has_c": True}),  # padding tile with direct stores and C
    ((1000, 2000, 1000), 64, 128, "data_parallel", {"mcast": True, "dtype": "fp16", "out_dtype": "fp16",
                                                     "activation": "relu", "bias_dtype": "fp16"}),
    ((1000, 2000, 1000), 128, 192, "data_parallel", {"mcast": True, "a_mn": True}),
    ((4000, 1000, 2000), 128, 96, "data_parallel", {"mcast": True, "out_dtype": "fp32", "bias_dtype": "fp32",
                                                     "activation": "gelu"}),  # more tiles than SMs
]


@pytest.mark.parametrize("shape, bm, bn, schedule, kw", CASES,
                         ids=[f"{'x'.join(map(str, c[0]))}-{c[1]}x{c[2]}-{c[3]}-{'-'.join(c[4])}" for c in CASES])
def test_plan_matches_float64_reference(shape, bm, bn, schedule, kw):
    p = _pick(*shape, bm, bn, schedule, **kw)
    beta = 0.5 if p.has_c else 0.0
    out, frame, ref = _run_case(p, alpha=0.75, beta=beta)
    err = rel_error(out, ref)
    assert err <= 1e-2, f"{p}: relative error {err:.3e}"
    outside = frame.clone()
    outside[: p.M, : p.N] = float("nan")
    assert torch.isnan(outside).all(), f"{p}: wrote outside the output"


@pytest.mark.parametrize("shape, bm, bn, schedule", [
    ((1500, 3000, 2000), 128, 256, "stream_k"), ((128, 4096, 4096), 64, 112, "stream_k"),
    ((16, 4096, 4096), 64, 128, "split_k"), ((16, 1024, 2560), 128, 80, "split_k"),
    ((2000, 704, 1500), 256, 176, "data_parallel"),
    ((1000, 3000, 1000), 128, 128, "pingpong"), ((512, 1024, 4096), 128, 128, "split_k_global"),
    ((700, 1920, 3000), 256, 112, "split_k_global"), ((2050, 3000, 1000), 128, 224, "mcast"),
    ((777, 1000, 2000), 64, 96, "col_split")])
def test_every_schedule_is_bitwise_deterministic(shape, bm, bn, schedule):
    variant = {"mcast": {"mcast": True}, "col_split": {"col_split": True}}.get(schedule)
    p = _pick(*shape, bm, bn, "data_parallel", **variant) if variant else _pick(*shape, bm, bn, schedule)
    first, _, _ = _run_case(p, seed=3)
    first = first.clone()
    for _ in range(4):
        again, _, _ = _run_case(p, seed=3)
        assert torch.equal(again.view(torch.int16), first.view(torch.int16)), p


@pytest.mark.parametrize("shape, bm, bn, schedule", [((1500, 3000, 2000), 128, 256, "stream_k"),
                                                     ((512, 1024, 4096), 128, 128, "split_k_global")])
def test_streamed_schedules_leave_their_flags_cleared(shape, bm, bn, schedule):
    p = _pick(*shape, bm, bn, schedule)
    for _ in range(2):
        out, _, ref = _run_case(p, seed=5)
        assert rel_error(out, ref) <= 1e-2
    _, flags = engine2.workspace(p, torch.device("cuda"))
    assert int(flags.abs().sum()) == 0


@pytest.mark.parametrize("shape", [(1, 576, 5120), (16, 14336, 4096), (64, 4096, 3584), (77, 2560, 10240),
                                   (8, 32768, 5120), (200, 7168, 2048)])
def test_evict_first_weight_loads_change_no_bit(shape):
    # Plan.evict_weight (the planner's, where the tokens are one tile) against the same plan without the
    # hint: the same bits, and both against float64 with the frame left NaN.
    p = planner.plan(*shape, profile=engine2._profile(torch.device("cuda")))
    assert p.evict_weight, p
    out, frame, ref = _run_case(p, seed=5)
    plain, _, _ = _run_case(dataclasses.replace(p, evict_weight=False), seed=5)
    assert torch.equal(out, plain)
    assert rel_error(out, ref) <= 1e-2 and not torch.isnan(out).any()
    assert torch.isnan(frame[p.M:]).all() and torch.isnan(frame[:, p.N:]).all()


@pytest.mark.parametrize("shape, bn, kw", [
    ((128, 4096, 4096), 64, {}), ((128, 5120, 5120), 80, {}), ((160, 2048, 4096), 48, {}),
    ((77, 5120, 5120), 96, {}),  # ragged M: 10 stages of the 64 x 96 tile
    ((100, 3001, 4096), 64, {"out_dtype": "fp32", "has_c": True, "bias_dtype": "fp32", "activation": "gelu"}),
    ((150, 2048, 4096), 64, {"dtype": "fp16", "a_mn": True, "b_mn": True}),
], ids=lambda v: "x".join(map(str, v)) if isinstance(v, tuple) else None)
def test_deep_rings_match_the_shallow_ring_bit_for_bit(shape, bn, kw):
    # planner.ring_stages: a 64-row data-parallel plan of one wave over few rows of tiles runs a deeper ring
    # (up to DEEP_RING_STAGES). The same plan at stages_for's depth gives the same bits (the k-steps are
    # accumulated in the same order), and both match float64 with the frame left NaN.
    p = _pick(*shape, 64, bn, "data_parallel", **kw)
    shallow = planner.stages_for(64, bn, "data_parallel", p.dtype)
    assert p.stages > shallow and p.smem_bytes <= planner.SMEM_LIMIT, p
    beta = 0.5 if p.has_c else 0.0
    out, frame, ref = _run_case(p, alpha=0.75, beta=beta, seed=7)
    base, _, _ = _run_case(dataclasses.replace(p, stages=shallow), alpha=0.75, beta=beta, seed=7)
    assert torch.equal(out, base)
    assert rel_error(out, ref) <= 1e-2 and not torch.isnan(out).any()
    assert torch.isnan(frame[p.M:]).all() and torch.isnan(frame[:, p.N:]).all()


def test_model_plan_runs_through_gemm():
    a = torch.randn(2040, 3584, device="cuda").bfloat16()
    w = torch.randn(3584, 3584, device="cuda").bfloat16()
    out = torch.empty(2040, 3584, device="cuda", dtype=torch.bfloat16).fill_(float("nan"))
    p = engine2.gemm(a, w.t(), out)
    torch.cuda.synchronize()
    assert p == engine2.plan_for(a, w.t(), out)
    assert rel_error(out, a.double() @ w.double().t()) <= 1e-2


@pytest.mark.gpu
@pytest.mark.hopper
def test_graphs_of_streamed_plans_replay_after_the_workspace_grew():
    """A graph captured with a small stream-K plan keeps working after a bigger plan grew the workspace on
    the same stream (the broad benchmark's illegal address, sha cf5b7d1), replayed in either order."""
    import torch

    from gemmlab import engine2, planner

    cases = [(256, 512, 2048, "stream_k"), (1024, 5120, 12288, "stream_k"), (512, 1024, 4096, "split_k_global")]
    graphs, outs, wants = [], [], []
    for M, N, K, sched in cases:
        p = next(c for c in planner.candidates(M, N, K, schedules=planner.SCHEDULES) if c.schedule == sched)
        a = torch.randn(M, K, device="cuda").bfloat16()
        b = torch.randn(N, K, device="cuda").bfloat16().t()
        out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            engine2.launch(p, a, b, out)  # warm: compile, descriptors
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            engine2.launch(p, a, b, out)
        graphs.append(g)
        outs.append(out)
        wants.append(a.double() @ b.double())
    for order in ((1, 0, 2), (2, 0, 1)):
        for i in order:
            outs[i].fill_(float("nan"))
            graphs[i].replay()
        torch.cuda.synchronize()
        for out, want in zip(outs, wants):
            err = float((out.double() - want).norm() / want.norm())
            assert err <= 1e-2, err


# gemmlab.matmul's route to the engine kernel (engine.route -> engine.Engine2Launch) ---------------------

ROUTED = [
    # (M, N, K), operand dtype, out dtype, B row-major (N-contiguous), bias dtype, activation, beta * C
    ((2040, 3584, 3584), torch.bfloat16, None, False, None, None, False),  # data-parallel, 128 x 224
    ((100, 1000, 3000), torch.bfloat16, None, False, torch.bfloat16, "silu", False),  # split-K
    ((1, 1024, 14336), torch.bfloat16, None, False, None, None, False),  # a decode M past the decode kernel's K
    ((640, 3001, 2047), torch.float16, torch.float32, True, torch.float32, "gelu", True),  # copies, direct
    ((777, 555, 333), torch.bfloat16, torch.float32, False, None, "gelu_tanh", True),
    ((333, 520, 264), torch.float16, None, True, torch.float16, "relu", False),
    ((5000, 5120, 14336), torch.bfloat16, None, False, None, None, False),  # swapped ping-pong (SWAP_WIDE)
    ((12608, 768, 3072), torch.float16, None, False, torch.float16, "silu", False),  # swapped, 99 token columns
    ((8192, 9216, 8192), torch.bfloat16, None, False, None, None, False),  # stream-K
    ((512, 1024, 8192), torch.bfloat16, None, False, None, None, False),  # global split-K (gsk_few_tiles)
    ((384, 1000, 8192), torch.float16, torch.float32, False, torch.float16, "silu", True),  # the same, heavy
]


def _routed_case(shape, dt, odt, b_row, bias_dt, act, with_c, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    M, N, K = shape
    a = torch.randn(M, K, device="cuda", generator=g).to(dt)
    b = torch.randn(K, N, device="cuda", generator=g).to(dt) if b_row else \
        torch.randn(N, K, device="cuda", generator=g).to(dt).t()
    bias = torch.randn(N, device="cuda", generator=g).to(bias_dt) if bias_dt else None
    c = torch.randn(M, N, device="cuda", generator=g).to(odt or dt) if with_c else None
    return a, b, bias, c


@pytest.mark.parametrize("case", ROUTED, ids=lambda c: "x".join(map(str, c[0])))
def test_matmul_routes_to_the_engine_kernel_and_matches_float64(case):
    import gemmlab
    from gemmlab import engine

    shape, dt, odt, b_row, bias_dt, act, with_c = case
    a, b, bias, c = _routed_case(*case)
    alpha, beta = (0.5, -1.25) if with_c else (1.0, 0.0)
    out = torch.full(shape[:1] + shape[1:2], float("nan"), device="cuda", dtype=odt or dt)
    launch = engine.prepare(a, b, out, bias=bias, activation=act, has_c=with_c, c=c)
    assert isinstance(launch, engine.Engine2Launch), launch
    for _ in range(2):  # the prepared call, twice (the second reuses the prepared launch)
        out.fill_(float("nan"))
        y = gemmlab.matmul(a, b, bias=bias, activation=act, alpha=alpha, beta=beta, c=c, out_dtype=odt, out=out)
        assert y.data_ptr() == out.data_ptr()
        torch.cuda.synchronize()
        ref = reference(a, b, bias=bias, activation=act, alpha=alpha, beta=beta, c=c)
        assert not torch.isnan(y).any()
        assert rel_error(y, ref) <= 1e-2, (shape, rel_error(y, ref))


def _captured_matmul(a, b, out):
    """gemmlab.matmul(a, b, out=out) captured in a CUDA graph, after one call on the capture stream (which
    prepares the launch and grows the workspace)."""
    import gemmlab

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        gemmlab.matmul(a, b, out=out)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        gemmlab.matmul(a, b, out=out)
    return g


def test_routed_stream_k_is_bitwise_deterministic_and_replays_in_a_graph():
    """The router's stream-K plan (8192x9216x8192; 5000x5120x14336's until SWAP_WIDE) through gemmlab.matmul:
    the same bits run after run,
    and captured in a CUDA graph (after an eager call prepared it and grew the workspace) it replays
    with the same bits."""
    import gemmlab
    from gemmlab import devices, engine

    if not devices.stream_k_offered(engine._memory_peak(torch.device("cuda"))):
        pytest.skip("the planner offers no stream-K on this GPU's slower memory (devices.stream_k_offered)")
    assert gemmlab.plan(8192, 9216, 8192).plan.schedule == "stream_k"
    a, b, _, _ = _routed_case((8192, 9216, 8192), torch.bfloat16, None, False, None, None, False, seed=7)
    first = gemmlab.matmul(a, b)
    for _ in range(3):
        again = gemmlab.matmul(a, b)
        assert torch.equal(again.view(torch.int16), first.view(torch.int16))
    out = torch.full_like(first, float("nan"))
    g = _captured_matmul(a, b, out)
    for _ in range(2):
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out.view(torch.int16), first.view(torch.int16))


@pytest.mark.parametrize("shape", [(512, 1024, 8192), (384, 1024, 8192), (512, 768, 14336)],
                         ids=lambda s: "x".join(map(str, s)))
def test_routed_global_split_k_is_bitwise_deterministic_and_replays_in_a_graph(shape):
    """The router's global split-K plans (planner.gsk_few_tiles) through gemmlab.matmul: float64's answer, the
    same bits call after call, and replayed in a CUDA graph with new inputs copied into the captured ones."""
    import gemmlab

    assert gemmlab.plan(*shape).plan.schedule == "split_k_global"
    a, b, _, _ = _routed_case(shape, torch.bfloat16, None, False, None, None, False, seed=11)
    first = gemmlab.matmul(a, b)
    torch.cuda.synchronize()
    assert not torch.isnan(first).any() and rel_error(first, reference(a, b)) <= 1e-2
    for _ in range(3):
        again = gemmlab.matmul(a, b)
        assert torch.equal(again.view(torch.int16), first.view(torch.int16))
    out = torch.full_like(first, float("nan"))
    g = _captured_matmul(a, b, out)
    a2, b2, _, _ = _routed_case(shape, torch.bfloat16, None, False, None, None, False, seed=12)
    a.copy_(a2)
    b.copy_(b2)
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    assert rel_error(out, reference(a2, b2)) <= 1e-2
    assert torch.equal(out.view(torch.int16), gemmlab.matmul(a2, b2).view(torch.int16))
