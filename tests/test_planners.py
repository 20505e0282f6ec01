"""Every planner returns a valid plan for every shape it can be handed (issue 15), checked without a GPU
over dense grids of M, N, K from 1 upward (tiny N and K included): the decode kernel's split
(``decode.plan``, every variant), the engine's (``engine.choose_plan`` / ``choose_bn`` /
``plan_problem``), the routing between them for each dtype, and the fp32 route's config and row blocks
(``fp32.config_for``, ``fp32.row_blocks``). "Valid" is what the kernels need, restated here from their headers, not
read back from the planners."""

import itertools
import math
import subprocess
import sys
import textwrap

import pytest
import torch

from gemmlab import decode, engine, fp32
from gemmlab.errors import UnsupportedProblem

# Sizes around every boundary the planners have: 1..48 (tiny), the MMA/tile/chunk multiples +-1.
TINY = tuple(range(1, 49))
EDGES = (63, 64, 65, 127, 128, 129, 191, 192, 193, 255, 256, 257, 383, 384, 511, 512, 513, 1000, 1023, 1024,
         2048, 4095, 4096, 4104, 8192, 14336, 28672)
DECODE_M = (1, 2, 3, 7, 8, 9, 15, 16, 17, 24, 31, 32, 33, 40, 48, 63, 64)


def check_decode_plan(M, N, K, sm, variant, p):
    """What engine_decode (kernels/engine/decode.cu) needs from a plan, and what the model promises."""
    where = f"decode.plan({M}, {N}, {K}, {sm}, {variant}) = {p}"
    v = variant or decode.default_variant(decode.token_tiles(M))
    assert p.variant == v, where
    assert p.nt == decode.token_tiles(M) and 8 * p.nt >= M, where
    assert p.rw in (1, 2, 4, 8) and p.rw * p.kw == decode.WARPS, where
    assert p.piece >= decode.CHUNK_K and p.piece % decode.CHUNK_K == 0, where
    assert 1 <= p.splits <= decode.MAX_SPLITS, where
    assert p.row_blocks == math.ceil(N / p.rows_cta), where  # every row covered, no empty row block
    pieces = p.splits * p.kw
    assert pieces * p.piece >= K, where  # every k covered (pieces are disjoint by construction)
    assert (p.splits - 1) * p.kw * p.piece < K, where  # no CTA without k
    assert p.piece < K + decode.CHUNK_K, where  # no piece longer than K needs
    assert 0 < p.smem_bytes <= 100 * 1024, where
    assert p.row_blocks < 2**31 and p.splits < 2**16, where  # grid limits


def _decode_grid():
    ks = sorted(set(TINY + tuple(range(56, 1040, 16)) + EDGES))
    ns = sorted(set(TINY + EDGES))
    return ns, ks


@pytest.mark.parametrize("M", DECODE_M)
def test_decode_plan_is_valid_for_every_shape(M):
    """The default variant of M's NT over every (N, K) of the grid, on 132 SMs and (every other shape)
    on 1."""
    ns, ks = _decode_grid()
    for i, (N, K) in enumerate(itertools.product(ns, ks)):
        sm = 132 if i % 2 else 1
        check_decode_plan(M, N, K, sm, None, decode.plan(M, N, K, sm))


@pytest.mark.parametrize("nt, variant", [(nt, v) for nt, vs in decode.VARIANTS.items() for v in vs],
                         ids=lambda x: str(x))
def test_decode_plan_is_valid_for_every_variant(nt, variant):
    Ms = sorted({8 * nt, max(1, 8 * nt - 3), 4 * nt + 1 if nt > 1 else 1})
    ns = sorted(set(TINY[:33] + EDGES[::2]))
    ks = sorted(set(TINY[:24] + tuple(range(32, 600, 24)) + EDGES[::2]))
    for M, N, K in itertools.product(Ms, ns, ks):
        check_decode_plan(M, N, K, 132, variant, decode.plan(M, N, K, 132, variant))


def test_decode_plan_for_the_linear_layer_that_asserted():
    """gemmlab.linear(x (7, 256), w (14, 256)) in bf16 reached ``assert best is not None`` (issue 15):
    8 k pieces of a 256-long K leave a warp less than MIN_WARP_K, and 14 rows skip every CTA wider than
    one row group. The planner now gives the warps MIN_WARP_K each and lets the other pieces idle."""
    x = torch.empty(7, 256, dtype=torch.bfloat16, device="meta")
    w = torch.empty(14, 256, dtype=torch.bfloat16, device="meta")
    assert engine.use_decode(x, w.t())
    p = decode.plan(7, 14, 256, 132)
    check_decode_plan(7, 14, 256, 132, None, p)
    assert (p.rw, p.splits, p.piece, p.row_blocks) == (1, 1, decode.MIN_WARP_K, 1)


def test_decode_plan_refuses_sizes_outside_its_range_with_a_typed_error():
    for M, N, K in ((0, 8, 8), (1, 0, 8), (1, 8, 0), (decode.KERNEL_MAX_M + 1, 8, 8), (-1, 8, 8)):
        with pytest.raises(ValueError):
            decode.plan(M, N, K, 132)


def test_decode_plan_needs_no_assert_under_python_O():
    """The planner's control flow does not rest on assert statements: under ``python -O`` (asserts
    stripped) the shapes that used to assert get plans that cover the problem."""
    code = textwrap.dedent("""
        import sys
        from gemmlab import decode
        bad = []
        for M in (1, 7, 9, 17, 33, 64):
            for N in range(1, 40):
                for K in range(8, 520, 8):
                    p = decode.plan(M, N, K, 132)
                    if p.splits * p.kw * p.piece < K or p.row_blocks * p.rows_cta < N or p.piece < 128:
                        bad.append((M, N, K, p))
        print(sys.flags.optimize, len(bad))
    """)
    run = subprocess.run([sys.executable, "-O", "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["1", "0"]


def check_engine_plan(M, N, K, sm, capacity, plan):
    where = f"engine.choose_plan({M}, {N}, {K}, {sm}) = {plan}"
    bn, splits = plan
    assert engine.plan_problem(K, bn, splits) is None, where
    if splits > 1:
        assert engine._capacity_of(capacity).get(splits, 0) >= 1, where + ": a cluster this GPU cannot launch"
    q = engine._qsize(bn, 2, split=splits > 1)
    assert engine.smem_bytes(bn, q, 2, split=splits > 1) <= engine.SMEM_LIMIT, where
    tiles = math.ceil(M / engine.BM) * math.ceil(N / bn)
    assert tiles * splits < 2**31, where
    k_iters = math.ceil(K / engine.BK)
    per = math.ceil(k_iters / splits)
    assert (splits - 1) * per < k_iters, where  # no empty split


ENGINE_SIZES = sorted(set(TINY[:20] + (24, 31, 32, 33, 40, 48) + EDGES))


@pytest.mark.parametrize("sms", [(132, 1), (114, 78)])
def test_engine_choose_plan_is_valid_for_every_shape(sms):
    """With the H200's cluster table (what plans without a GPU use), on SM counts taken in turn."""
    for i, (M, N, K) in enumerate(itertools.product(ENGINE_SIZES, ENGINE_SIZES, ENGINE_SIZES[::2])):
        sm = sms[i % 2]
        check_engine_plan(M, N, K, sm, None, engine.choose_plan(M, N, K, sm))
        bn = engine.choose_bn(M, N, sm)
        assert bn in engine.SPLIT_WIDTHS


# A GPU whose occupancy query says clusters of 8 (or of 5 and more) cannot launch, e.g. a MIG slice or
# a part with smaller GPCs: engine.cluster_capacity reports 0 for them.
PARTIAL_CAPACITY = {1: 132, 2: 66, 3: 39, 4: 30, 5: 22, 6: 17, 7: 15, 8: 0}
SMALL_GPU_CAPACITY = {1: 16, 2: 8, 3: 4, 4: 4, 5: 0, 6: 0, 7: 0, 8: 0}


@pytest.mark.parametrize("capacity", [PARTIAL_CAPACITY, SMALL_GPU_CAPACITY], ids=["no-8-clusters", "small-gpu"])
def test_engine_choose_plan_only_splits_into_clusters_that_launch(capacity):
    sm = capacity[1]
    for M, N, K in itertools.product(ENGINE_SIZES[::3], ENGINE_SIZES[::3], (2048, 4096, 8192, 28672)):
        check_engine_plan(M, N, K, sm, capacity, engine.choose_plan(M, N, K, sm, capacity))


def test_engine_plan_problem_agrees_with_validate_plan():
    """plan_problem (the reason) and validate_plan (the error) accept exactly the same forced plans."""
    for K in TINY + EDGES:
        for bn in (32, 64, 96, 128, 192, 256, 512):
            for splits in range(0, engine.MAX_CLUSTER + 2):
                why = engine.plan_problem(K, bn, splits)
                if why is None:
                    assert engine.validate_plan((bn, splits), K) == (bn, splits)
                    check_engine_plan(1, 1, K, 132, None, (bn, splits))
                else:
                    with pytest.raises(UnsupportedProblem):
                        engine.validate_plan((bn, splits), K)


def test_engine_a_rows_loaded_is_a_legal_box_for_every_m():
    for M in range(1, 1100):
        for a_mn in (False, True):
            rows = engine.a_rows_loaded(M, a_mn)
            assert rows % 8 == 0 and 8 <= rows <= 64
            left = M - (math.ceil(M / engine.BM) - 1) * engine.BM
            assert rows == 64 if a_mn else rows >= min(left, 64)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_routing_gives_every_shape_a_valid_plan(dtype):
    """The engine's choice for meta tensors of each dtype (an nn.Linear layout and a row-major B): where
    ``use_decode`` says decode kernel, ``decode.plan`` is valid; elsewhere ``choose_plan`` is."""
    shapes = itertools.product((1, 3, 7, 8, 9, 16, 31, 32, 33, 64, 129), (1, 2, 7, 8, 14, 16, 17, 100, 1000, 4096),
                               (8, 16, 24, 40, 64, 128, 256, 264, 1000, 4096, 12296))
    for (M, N, K), weight_layout in itertools.product(shapes, (True, False)):
        a = torch.empty(M, K, dtype=dtype, device="meta")
        b = (torch.empty(N, K, dtype=dtype, device="meta").t() if weight_layout
             else torch.empty(K, N, dtype=dtype, device="meta"))
        out = torch.empty(M, N, dtype=dtype, device="meta")
        if engine.use_decode(a, b, out):
            check_decode_plan(M, N, K, 132, None, decode.plan(M, N, K, 132))
        else:
            check_engine_plan(M, N, K, 132, None, engine.choose_plan(M, N, K, 132))


def test_fp32_route_launches_cover_m_below_the_index_limit_and_refuse_a_b_above():
    sizes = sorted(set(TINY[:16] + (31, 32, 33, 63, 64, 65, 127, 128, 129, 1000, 4095, 4096, 4097, 65536)))
    blocked = 0
    for M, N, K in itertools.product(sizes + [2**23 + 1, 2**27], sizes, sizes[::2]):
        for sm in (132, 1):
            if K * N >= 2**31 - 1024:  # B itself: every launch reads all of it
                with pytest.raises(UnsupportedProblem, match=r"B \(K x N\)"):
                    fp32.config_for(M, N, K, sm)
                continue
            cfg = fp32.config_for(M, N, K, sm)
            blocks = fp32.row_blocks(M, N, K, cfg)
            # the blocks tile M in order, each a whole number of tiles but the last, each one launch of K10
            assert [m0 for m0, _ in blocks] == list(itertools.accumulate([0] + [r for _, r in blocks[:-1]]))
            assert sum(r for _, r in blocks) == M and all(r % cfg["BM"] == 0 for _, r in blocks[:-1])
            assert all(fp32.K10.why_unsupported(r, N, K, cfg) is None for _, r in blocks)
            # one launch whenever one launch can: then the launch is the whole problem's
            assert (len(blocks) == 1) == (fp32.K10.why_unsupported(M, N, K, cfg) is None)
            blocked += len(blocks) > 1
    assert blocked > 100  # the grid reaches past one launch (M * N, M * K or M past 65535 tiles)
