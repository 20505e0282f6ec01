"""Swap-AB plans of the engine kernel on a Hopper GPU (``Plan.swap_ab``: out^T = W @ A^T, the transposed
store): forced plans of every schedule against a float64 reference on fresh randn inputs, the output inside
a NaN frame (rows and columns around it must stay NaN: the stale token rows of the B slots make only tile
columns past M, which nothing may store), bitwise determinism, and gemmlab.matmul's prepared call and
custom op routed to a swapped plan (planner.SWAP_AB set)."""

import dataclasses

import pytest
import torch

from gemmlab import engine2, planner
from gemmlab.bench import rel_error

from fakes import frame_cols, reference

pytestmark = pytest.mark.hopper

_TYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _pick(M, N, K, bm, bn, schedule, **kw) -> planner.Plan:
    # Every schedule offered, stream-K too where the GPU's planner would not (an H100: devices.stream_k_offered):
    # the kernel is under test here, not the planner's choice.
    prof = dataclasses.replace(engine2._profile(torch.device("cuda")), stream_k_offered=True)
    for c in planner.candidates(M, N, K, profile=prof, schedules=planner.SCHEDULES, swap_ab=True, **kw):
        if c.swap_ab and (c.bm, c.bn, c.schedule) == (bm, bn, schedule):
            return c
    raise AssertionError(f"no swapped {bm}x{bn} {schedule} plan for {M}x{N}x{K} {kw}")


def _run(p: planner.Plan, *, alpha=1.0, beta=0.0, seed=0, c_col_major=False):
    """Fresh inputs, the output poisoned inside a poisoned frame, one launch: (out, frame, reference)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    dt, odt = _TYPES[p.dtype], _TYPES[p.out_dtype]
    M, N, K = p.M, p.N, p.K
    a = torch.randn(M, K, device="cuda", generator=g).to(dt)
    w = torch.randn(N, K, device="cuda", generator=g).to(dt)
    frame = torch.full((M + 8, frame_cols(N, odt.itemsize, p.direct)), float("nan"), device="cuda", dtype=odt)
    out = frame[:M, :N]
    c = None
    if p.has_c:
        c = torch.randn(N, M, device="cuda", generator=g).to(odt).t() if c_col_major else \
            torch.randn(M, N, device="cuda", generator=g).to(odt)
    bias = torch.randn(N, device="cuda", generator=g).to(_TYPES[p.bias_dtype]) if p.bias_dtype else None
    engine2.launch(p, a, w.t(), out, alpha=alpha, beta=beta, c=c, bias=bias)
    torch.cuda.synchronize()
    return out, frame, reference(a, w.t(), bias=bias, activation=p.activation, alpha=alpha, beta=beta, c=c)


CASES = [
    # (M, N, K), tile, schedule, variant
    ((1, 4096, 4096), 64, 16, "data_parallel", {}),
    ((7, 1000, 1000), 64, 16, "data_parallel", {}),  # ragged N (last tile 40 weight rows: short A box), ragged K
    ((16, 14336, 4096), 64, 16, "data_parallel", {}),  # cuBLAS's tile at this shape
    ((16, 4104, 14336), 64, 16, "data_parallel", {"dtype": "fp16", "out_dtype": "fp16"}),  # deep K
    ((33, 4104, 1992), 64, 48, "data_parallel", {}),  # tail piece of 48 out rows, 15 past M
    ((33, 4104, 1992), 64, 32, "data_parallel", {}),  # two tiles of tokens, the second 1 row
    ((64, 4096, 4096), 64, 64, "data_parallel", {}),  # a full 64 x 64 piece
    ((64, 4096, 1000), 128, 64, "data_parallel", {}),  # two consumers
    ((64, 3000, 1000), 256, 64, "data_parallel", {"bias_dtype": "bf16"}),
    ((16, 14336, 4096), 64, 16, "pingpong", {}),
    ((64, 14336, 1024), 64, 64, "pingpong", {"activation": "relu"}),
    ((1, 4096, 4096), 64, 16, "split_k", {}),
    ((33, 1000, 8192), 64, 48, "split_k", {"bias_dtype": "fp32", "has_c": True}),
    ((16, 4104, 14336), 64, 16, "stream_k", {}),
    ((64, 1000, 8192), 64, 64, "stream_k", {"dtype": "fp16", "out_dtype": "fp16", "has_c": True}),
    ((16, 1000, 8192), 64, 16, "split_k_global", {}),
    ((33, 1000, 8192), 64, 48, "split_k_global", {"bias_dtype": "bf16", "activation": "silu"}),
    # epilogues and DIRECT (out rows not 16-byte aligned: threads store the transposed slab's rows)
    ((16, 4104, 1000), 64, 16, "data_parallel", {"bias_dtype": "bf16", "has_c": True, "activation": "gelu"}),
    ((33, 1001, 1000), 64, 48, "data_parallel", {"direct": True}),
    ((7, 4097, 2000), 64, 16, "data_parallel", {"direct": True, "has_c": True, "bias_dtype": "fp32",
                                                "dtype": "fp16", "out_dtype": "fp16"}),
    ((64, 1001, 4096), 64, 64, "split_k", {"direct": True}),
    ((16, 4097, 4096), 64, 16, "stream_k", {"direct": True, "activation": "gelu_tanh"}),
    # past SWAP_MAX_M: data-parallel tiles over up to SWAP_PAD_COLUMNS columns of tokens (SWAP_PAD_MAX_M's rule)
    ((200, 8192, 5376), 64, 208, "data_parallel", {}),  # the rule's pick; 8 token rows of padding
    ((77, 6144, 1000), 64, 80, "data_parallel", {"bias_dtype": "bf16", "activation": "gelu"}),
    ((150, 4104, 2000), 128, 160, "data_parallel", {"has_c": True, "dtype": "fp16", "out_dtype": "fp16"}),
    ((256, 3000, 1000), 128, 256, "data_parallel", {}),
    ((97, 4104, 1000), 256, 112, "data_parallel", {}),
    ((233, 1001, 1000), 64, 240, "data_parallel", {"direct": True, "bias_dtype": "fp32"}),
    # several token columns, the last one's token box short (mainloop.cuh's BEdge): 88, 8, 80, 138, 2 tokens
    ((200, 4096, 4096), 64, 112, "data_parallel", {}),
    ((200, 5376, 1000), 128, 96, "data_parallel", {"bias_dtype": "bf16", "activation": "silu"}),
    ((300, 4104, 2000), 128, 112, "data_parallel", {"has_c": True, "dtype": "fp16", "out_dtype": "fp16"}),
    ((490, 1001, 1000), 128, 176, "data_parallel", {"direct": True, "bias_dtype": "fp32"}),
    ((130, 4104, 777), 64, 64, "data_parallel", {}),
    # past SWAP_PAD_MAX_M (SWAP_WIDE): many token columns, data-parallel and ping-pong, ragged tokens
    ((5000, 896, 1024), 128, 144, "pingpong", {}),  # 35 token columns, the last 104 tokens
    ((3000, 1024, 2000), 128, 192, "data_parallel", {"bias_dtype": "bf16", "activation": "silu"}),
    ((2050, 3000, 1000), 256, 192, "data_parallel", {}),
    ((2050, 3000, 1000), 128, 192, "data_parallel", {"has_c": True, "dtype": "fp16", "out_dtype": "fp16"}),
    ((1300, 1280, 4096), 128, 240, "data_parallel", {"bias_dtype": "fp32"}),
    ((4777, 1008, 1024), 128, 96, "pingpong", {"activation": "gelu"}),
    ((777, 1001, 1000), 128, 176, "data_parallel", {"direct": True, "activation": "gelu"}),
    ((1023, 4097, 1025), 128, 256, "data_parallel", {"direct": True}),
    # NARROW_TALL: 128 / 256 weight rows over one column of few tokens (ragged rows and tokens too)
    ((16, 14336, 4096), 128, 16, "data_parallel", {}),
    ((32, 43008, 1024), 128, 32, "data_parallel", {"bias_dtype": "bf16", "activation": "silu"}),
    ((8, 28672, 1000), 256, 16, "data_parallel", {}),
    ((5, 28417, 2000), 256, 16, "data_parallel", {"direct": True, "has_c": True, "bias_dtype": "fp32"}),
    ((27, 14335, 1000), 128, 32, "data_parallel", {"direct": True, "dtype": "fp16", "out_dtype": "fp16"}),
]


@pytest.mark.parametrize("shape, bm, bn, schedule, kw", CASES,
                         ids=[f"{'x'.join(map(str, c[0]))}-{c[1]}x{c[2]}-{c[3]}-{'-'.join(c[4])}" for c in CASES])
def test_swapped_plan_matches_float64_reference(shape, bm, bn, schedule, kw):
    p = _pick(*shape, bm, bn, schedule, **kw)
    assert p.swap_ab
    beta = 0.5 if p.has_c else 0.0
    out, frame, ref = _run(p, alpha=0.75, beta=beta)
    assert not torch.isnan(out).any(), f"{p}: NaN left in the output"
    err = rel_error(out, ref)
    assert err <= 1e-2, f"{p}: relative error {err:.3e}"
    outside = frame.clone()
    outside[: p.M, : p.N] = float("nan")
    assert torch.isnan(outside).all(), f"{p}: wrote outside the output"


def test_beta_c_reads_a_column_major_c():
    p = _pick(16, 4104, 1000, 64, 16, "data_parallel", has_c=True)
    out, _, ref = _run(p, alpha=1.0, beta=-1.5, c_col_major=True)
    assert rel_error(out, ref) <= 1e-2


@pytest.mark.parametrize("shape, bm, bn, schedule", [
    ((16, 14336, 4096), 64, 16, "data_parallel"), ((1, 4096, 4096), 64, 16, "split_k"),
    ((16, 4104, 14336), 64, 16, "stream_k"), ((16, 1000, 8192), 64, 16, "split_k_global"),
    ((64, 14336, 1024), 64, 64, "pingpong"), ((200, 8192, 5376), 64, 208, "data_parallel"),
    ((8, 28672, 4096), 256, 16, "data_parallel"), ((32, 14336, 4096), 128, 32, "data_parallel"),
    ((300, 5120, 2048), 128, 112, "data_parallel"), ((5000, 896, 1024), 128, 144, "pingpong"),
    ((1300, 1280, 4096), 128, 240, "data_parallel")])
def test_swapped_plans_are_bitwise_deterministic(shape, bm, bn, schedule):
    p = _pick(*shape, bm, bn, schedule)
    first = _run(p, seed=3)[0].clone()
    for _ in range(2):
        again = _run(p, seed=3)[0]
        assert torch.equal(again.view(torch.int16), first.view(torch.int16)), p


@pytest.mark.parametrize("M, N, K", [(16, 8192, 1024), (200, 6144, 1024), (12608, 768, 3072)])
def test_matmul_runs_a_routed_swapped_plan_prepared_in_a_graph_and_as_the_custom_op(monkeypatch, M, N, K):
    """With planner.SWAP_AB set, 16x8192x1024 routes to a swapped plan (the model prices it ahead),
    200x6144x1024 to 128 x 112 swapped tiles over two token columns (SWAP_PAD_MAX_M's rule), and 12608x768x3072
    to ping-pong 128 x 144 swapped tiles over 88 token columns (SWAP_WIDE): gemmlab.matmul's
    prepared call (twice: the second reuses it), a CUDA graph of it, and the custom op all match float64
    and each other bit for bit."""
    import gemmlab
    from gemmlab import ops

    monkeypatch.setattr(planner, "SWAP_AB", True)
    ops.clear_prepared_calls()
    try:
        assert gemmlab.plan(M, N, K).plan.swap_ab
        g = torch.Generator(device="cuda").manual_seed(11)
        a = torch.randn(M, K, device="cuda", generator=g).bfloat16()
        w = torch.randn(N, K, device="cuda", generator=g).bfloat16()
        bias = torch.randn(N, device="cuda", generator=g).bfloat16()
        ref = reference(a, w.t(), bias=bias, activation="silu")
        first = gemmlab.matmul(a, w.t(), bias=bias, activation="silu")
        assert not torch.isnan(first).any() and rel_error(first, ref) <= 1e-2
        out = torch.full_like(first, float("nan"))
        gemmlab.matmul(a, w.t(), bias=bias, activation="silu", out=out)
        assert torch.equal(out.view(torch.int16), first.view(torch.int16))
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            gemmlab.matmul(a, w.t(), bias=bias, activation="silu", out=out)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            gemmlab.matmul(a, w.t(), bias=bias, activation="silu", out=out)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out.view(torch.int16), first.view(torch.int16))
        op = torch.ops.gemmlab.matmul(a, w.t(), bias, "silu", 1.0, 0.0, None, None)
        assert torch.equal(op.view(torch.int16), first.view(torch.int16))
    finally:
        ops.clear_prepared_calls()


# planner.SWAP_TWIN (off: a coin flip on two held-out H100 draws): past SWAP_PAD_MAX_M tokens the swapped twin is
# the one 64-row swapped plan the planner lists, over many token columns, the last one short; with every epilogue.
TWINS = [((813, 2048, 11008), {}), ((533, 2560, 4096), {"direct": True}),
         ((567, 2560, 4096), {"dtype": "fp16", "out_dtype": "fp16", "has_c": True}),
         ((931, 1536, 2000), {"bias_dtype": "bf16", "activation": "silu"}), ((807, 2048, 2000), {"bias_dtype": "fp32"})]


@pytest.mark.parametrize("shape, kw", TWINS, ids=[f"{'x'.join(map(str, s))}-{'-'.join(kw)}" for s, kw in TWINS])
def test_the_swapped_twin_past_512_tokens_matches_float64_reference(shape, kw):
    p = planner.candidates(*shape, swap_twin=True, **kw)[0]
    assert p.swap_ab and p.bm == 64 and p.schedule == "data_parallel" and p.M > planner.SWAP_PAD_MAX_M
    beta = 0.5 if p.has_c else 0.0
    out, frame, ref = _run(p, alpha=0.75, beta=beta)
    assert not torch.isnan(out).any(), f"{p}: NaN left in the output"
    assert rel_error(out, ref) <= 1e-2, p
    outside = frame.clone()
    outside[: p.M, : p.N] = float("nan")
    assert torch.isnan(outside).all(), f"{p}: wrote outside the output"


@pytest.mark.parametrize("M, N, K", [(322, 6144, 6144), (683, 13824, 5120)])
def test_matmul_on_the_shapes_swap_pad_span_moves_matches_float64_either_way(monkeypatch, M, N, K):
    """planner.SWAP_PAD_SPAN moves these picks from a swapped plan to the plain one: gemmlab.matmul runs the
    plain plan and matches float64 on fresh inputs into a poisoned output; with the rule off it runs the
    swapped plan, and it matches too."""
    import gemmlab
    from gemmlab import ops

    g = torch.Generator(device="cuda").manual_seed(5)
    a = torch.randn(M, K, device="cuda", generator=g).bfloat16()
    w = torch.randn(N, K, device="cuda", generator=g).bfloat16()
    ref = reference(a, w.t())
    for span, swapped in ((planner.SWAP_PAD_SPAN, False), (None, True)):
        monkeypatch.setattr(planner, "SWAP_PAD_SPAN", span)
        ops.clear_prepared_calls()
        try:
            assert gemmlab.plan(M, N, K).plan.swap_ab == swapped
            out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
            gemmlab.matmul(a, w.t(), out=out)
            torch.cuda.synchronize()
            assert not torch.isnan(out).any() and rel_error(out, ref) <= 1e-2, (span, M, N, K)
        finally:
            ops.clear_prepared_calls()
