"""The grouped kernel (kernels/engine/gemm_grouped.cu through gemmlab.grouped_mm) on a Hopper GPU: the
contiguous layout with uneven groups (empty ones included, 8 to 256 experts, ragged rows, N and K not
multiples of the tile) and the masked layout, every tile of the plan space with both group-table sizes,
bf16 / fp16 / fp32 output, TMA-stored blocks beside DIRECT ones and all-DIRECT plans (unaligned rows or
start of out), panels of m-tiles in tall groups, against the float64 reference; outputs poisoned with
NaN inside a NaN frame, rows outside the groups or past the counts left untouched; the masked layout
inside a captured CUDA graph replayed with new counts; clamped bad offsets never writing outside;
agreement with torch._grouped_mm where torch has it; stream-K plans (``test_stream_k_*``: every tile, both
tables, bitwise repeatable, fp16, the workspace shared with the dense kernel, graphs with new offsets and
counts); FP8 (e4m3 operands, per-tensor scales, one per
group for b) on every FP8 tile, both layouts and in a graph; and FP8 with block scales (``test_block_*``:
1 x 128 for a, 128 x 128 per expert for b) on every FP8 tile, both layouts, NaN scales outside the groups,
in a graph, K up to 7168; the fitted form (``test_fitted_*``: token tiles fitted per group, data-parallel and
with ping-pong consumers, every width and group edge, through ``grouped_mm`` in a graph and with fresh tensors).

Run on the H200 at 6417c0c (DIRECT stores only) and d107e97 (TMA stores, both tables, 256 x 128,
panels): all passed.
"""

import dataclasses


import pytest
import torch

import gemmlab
from gemmlab import fp8, grouped
from gemmlab.bench import rel_error

pytestmark = pytest.mark.hopper

_TYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
TOL = {"bf16": 8e-3, "fp16": 2e-3, "fp32": 5e-4}  # relative (Frobenius) error vs float64: output rounding


def _uneven_offsets(G, T, *, seed, empty=()):
    """(G + 1,) int32 boundaries on the GPU: T rows cut at random (seeded) points; groups in ``empty`` get 0 rows."""
    g = torch.Generator().manual_seed(seed)
    w = torch.rand(G, generator=g) ** 2  # skewed, as routers are
    for e in empty:
        w[e] = 0
    sizes = torch.floor(w / w.sum() * T).long()
    sizes[int(torch.argmax(w))] += T - int(sizes.sum())
    offs = torch.zeros(G + 1, dtype=torch.int64)
    offs[1:] = torch.cumsum(sizes, 0)
    return offs.to(torch.int32).cuda()


def _captured(call):
    """``call`` run once (compiled and prepared outside the capture), then captured into a CUDA graph."""
    call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    return graph


def _operands(rows_shape, G, N, K, dtype=torch.bfloat16, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(*rows_shape, K, device="cuda", generator=g).to(dtype)
    b = (torch.randn(G, N, K, device="cuda", generator=g) / K ** 0.5).to(dtype)
    return a, b


def _framed(shape, dtype):
    """A NaN output and what to check around it: 2-D, a view inside a frame one row and eight columns
    larger; 3-D (out must be packed), the tensor itself."""
    if len(shape) == 2:
        frame = torch.full((shape[0] + 1, shape[1] + 8), float("nan"), device="cuda", dtype=dtype)
        return frame[: shape[0], : shape[1]], frame
    frame = torch.full(shape, float("nan"), device="cuda", dtype=dtype)
    return frame, frame


def _check(out, ref, odt):
    """Rows the reference computes match it; rows it leaves NaN are still NaN (not written)."""
    torch.cuda.synchronize()
    written = ~torch.isnan(ref[..., 0])
    got = out.double()
    assert torch.isnan(got[~written]).all(), "rows outside the groups were written"
    if written.any():
        assert not torch.isnan(got[written]).any(), "rows of a group were not written"
        err = rel_error(got[written], ref[written])
        assert err < TOL[odt], err


@pytest.mark.parametrize("G,T,N,K", [(8, 4096, 14336 // 8, 4096), (64, 3000, 1408, 2048), (128, 777, 2048, 1024),
                                     (256, 2048, 256, 7168), (8, 1, 4096, 512), (16, 100, 200, 136)])
def test_contiguous_uneven_groups(G, T, N, K):
    a, b = _operands((T,), G, N, K)
    offs = _uneven_offsets(G, T, seed=G + T, empty=(0, G // 2))
    out, frame = _framed((T, N), torch.bfloat16)
    gemmlab.grouped_mm(a, b, offs, out=out)
    ref = grouped.reference_grouped_mm(a, b, offs)
    _check(out, ref, "bf16")
    assert torch.isnan(frame[T:]).all() and torch.isnan(frame[:, N:]).all()


def _tile_plan(G, T, N, K, tile, dtype, odt, layout="contiguous", schedule="data_parallel"):
    """The candidate of that tile with TMA stores inside the groups (the planner stores every block
    directly where groups are this small: grouped.ALL_DIRECT_SHARE; those plans are the DIRECT tests')."""
    unaligned = N * (4 if odt == "fp32" else 2) % 16 != 0  # out's rows take no TMA map: DIRECT regardless
    for c in grouped.candidates(layout, G, T, N, K, dtype=grouped._NAMES[dtype], out_dtype=odt):
        if (c.bm, c.bn, c.schedule) == (*tile, schedule) and not c.fit:
            return dataclasses.replace(c, direct=unaligned)
    why = schedule == "pingpong" and grouped.pingpong_problem(*tile, odt, True)
    if why:  # not listed where every block would be thread-stored (the small groups here)
        pytest.skip(why)
    raise AssertionError(f"no {tile} {schedule} candidate")


@pytest.mark.parametrize("G", [12, 200])  # the 128- and the 512-group table
@pytest.mark.parametrize("tile", grouped.TILES)
@pytest.mark.parametrize("odt", ["bf16", "fp16", "fp32"])
def test_every_tile_and_output_dtype(tile, odt, G):
    T, N, K = 1000, 392, 520  # N, K not multiples of the tile; groups straddle tiles
    dtype = torch.float16 if odt == "fp16" else torch.bfloat16
    a, b = _operands((T,), G, N, K, dtype=dtype)
    offs = _uneven_offsets(G, T, seed=7, empty=(3,))
    p = _tile_plan(G, T, N, K, tile, dtype, odt)
    assert p.table == (128 if G <= 128 else 512) and not p.direct  # TMA stores beside the ragged blocks'
    out, frame = _framed((T, N), _TYPES[odt])
    grouped.run(a, b, offs, out=out, plan=p)
    _check(out, grouped.reference_grouped_mm(a, b, offs), odt)
    assert torch.isnan(frame[T:]).all() and torch.isnan(frame[:, N:]).all()


@pytest.mark.parametrize("tile", grouped.TILES)
def test_direct_stores_for_unaligned_out(tile):
    """All-DIRECT plans: rows of 396 bf16 (792 bytes, no TMA map), and an out= view starting 2 bytes off."""
    G, T, N, K = 12, 1000, 396, 520
    a, b = _operands((T,), G, N, K)
    offs = _uneven_offsets(G, T, seed=9, empty=(5,))
    p = _tile_plan(G, T, N, K, tile, torch.bfloat16, "bf16")
    assert p.direct
    out, frame = _framed((T, N), torch.bfloat16)
    grouped.run(a, b, offs, out=out, plan=p)
    _check(out, grouped.reference_grouped_mm(a, b, offs), "bf16")
    assert torch.isnan(frame[T:]).all() and torch.isnan(frame[:, N:]).all()
    N = 392  # aligned rows, but the view starts one element into its buffer
    a, b = _operands((T,), G, N, K, seed=1)
    buf = torch.full((T * N + 2,), float("nan"), device="cuda", dtype=torch.bfloat16)
    odd = buf[1:T * N + 1].view(T, N)
    grouped.run(a, b, offs, out=odd, plan=_tile_plan(G, T, N, K, tile, torch.bfloat16, "bf16"))
    _check(odd, grouped.reference_grouped_mm(a, b, offs), "bf16")
    assert torch.isnan(buf[0]) and torch.isnan(buf[-1])


@pytest.mark.parametrize("panel", [1, 2, 3, 7])
@pytest.mark.parametrize("tile", [(64, 128), (128, 256), (256, 128)])
def test_panels_in_tall_groups(tile, panel):
    """Groups of up to ~40 m-tiles walked in panels (forced small): every row stored once, right."""
    G, T, N, K = 5, 6000, 1000, 256
    a, b = _operands((T,), G, N, K)
    offs = _uneven_offsets(G, T, seed=13, empty=(1,))
    p = dataclasses.replace(_tile_plan(G, T, N, K, tile, torch.bfloat16, "bf16"), panel=panel)
    out, frame = _framed((T, N), torch.bfloat16)
    grouped.run(a, b, offs, out=out, plan=p)
    _check(out, grouped.reference_grouped_mm(a, b, offs), "bf16")
    assert torch.isnan(frame[T:]).all() and torch.isnan(frame[:, N:]).all()


def test_offsets_as_torch_ends_and_uncovered_rows():
    G, T, N, K = 8, 512, 256, 256
    a, b = _operands((T,), G, N, K)
    offs = _uneven_offsets(G, T, seed=3)
    short = offs.clone()
    short[-1] = T - 40  # the last 40 rows belong to no group
    out = torch.full((T, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    gemmlab.grouped_mm(a, b, short[1:], out=out)  # G ends, torch._grouped_mm's offs
    _check(out, grouped.reference_grouped_mm(a, b, short), "bf16")
    assert torch.isnan(out[T - 40:]).all()


def test_bad_offsets_are_clamped_not_out_of_bounds():
    G, T, N, K = 4, 300, 128, 128
    a, b = _operands((T,), G, N, K)
    frame = torch.full((T + 64, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    out = frame[:T]
    bad = torch.tensor([-50, 100, 20, 5000, 4000], dtype=torch.int32, device="cuda")
    gemmlab.grouped_mm(a, b, bad, out=out)
    torch.cuda.synchronize()
    assert torch.isnan(frame[T:]).all()  # nothing past T
    ref = grouped.reference_grouped_mm(a, b, bad)  # [0, 100), [100, 100), [20, 300), [300, 300)
    rows = torch.arange(T, device="cuda")
    only0, only2 = rows < 20, rows >= 100
    assert rel_error(out[only0].double(), ref[only0]) < TOL["bf16"]
    assert rel_error(out[only2].double(), ref[only2]) < TOL["bf16"]


@pytest.mark.parametrize("G,C,N,K", [(8, 64, 4096, 1024), (64, 16, 1408, 2048), (256, 8, 512, 7168),
                                     (6, 300, 1000, 512)])
def test_masked_layout(G, C, N, K):
    a, b = _operands((G, C), G, N, K)
    counts = torch.randint(0, C + 1, (G,), generator=torch.Generator().manual_seed(G), dtype=torch.int32)
    counts[0], counts[-1] = 0, C
    counts = counts.cuda()
    out, _ = _framed((G, C, N), torch.bfloat16)
    gemmlab.grouped_mm(a, b, counts=counts, out=out)
    _check(out, grouped.reference_grouped_mm(a, b, counts=counts), "bf16")


@pytest.mark.parametrize("tile", grouped.TILES)
def test_masked_every_tile(tile):
    """Slabs of 300 rows: TMA-stored blocks must stop at each slab's count, not at its capacity."""
    G, C, N, K = 6, 300, 520, 256
    a, b = _operands((G, C), G, N, K)
    counts = torch.tensor([300, 0, 299, 64, 1, 200], dtype=torch.int32, device="cuda")
    out, _ = _framed((G, C, N), torch.bfloat16)
    grouped.run(a, b, counts=counts, out=out, plan=_tile_plan(G, C, N, K, tile, torch.bfloat16, "bf16", "masked"))
    _check(out, grouped.reference_grouped_mm(a, b, counts=counts), "bf16")


def test_masked_layout_in_a_cuda_graph_with_new_counts():
    """Decode under CUDA graphs: capture once, change counts (and a) in place between replays."""
    G, C, N, K = 32, 16, 1024, 512
    a, b = _operands((G, C), G, N, K)
    counts = torch.zeros(G, dtype=torch.int32, device="cuda")
    out = torch.full((G, C, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    # compile and prepare outside the capture
    graph = _captured(lambda: gemmlab.grouped_mm(a, b, counts=counts, out=out))
    gen = torch.Generator().manual_seed(5)
    for step in range(4):
        counts.copy_(torch.randint(0, C + 1, (G,), generator=gen, dtype=torch.int32))
        a.copy_(torch.randn(G, C, K, generator=gen).to(a.dtype))
        out.fill_(float("nan"))
        graph.replay()
        _check(out, grouped.reference_grouped_mm(a, b, counts=counts), "bf16")


def _replays_with_new_offsets(G, T, N, K):
    """grouped_mm captured into a CUDA graph and replayed with new offsets (another group empty each time),
    each replay checked; returns the offsets as last replayed."""
    a, b = _operands((T,), G, N, K)
    offs = _uneven_offsets(G, T, seed=1)
    out = torch.full((T, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    graph = _captured(lambda: gemmlab.grouped_mm(a, b, offs, out=out))
    for seed in (2, 3):
        offs.copy_(_uneven_offsets(G, T, seed=seed, empty=(seed,)))
        out.fill_(float("nan"))
        graph.replay()
        _check(out, grouped.reference_grouped_mm(a, b, offs), "bf16")
    return offs


def test_contiguous_in_a_cuda_graph_with_new_offsets():
    assert not grouped.plan("contiguous", 16, 1024, 512, 512).fit  # the tiled kernel (64 rows a group)
    _replays_with_new_offsets(16, 1024, 512, 512)


def _tiles_there_are(sizes, bm, bn, N):
    """The kernel's tile count for these group sizes (group_scheduler.cuh: ceil(rows / bm) m-tiles each)."""
    return sum(-(-r // bm) for r in sizes) * -(-N // bn)


@pytest.mark.parametrize("G", [12, 200])  # the 128- and the 512-group table
@pytest.mark.parametrize("tile", [t for t in grouped.TILES if grouped.stream_k_problem(*t, "bf16") is None])
def test_stream_k_every_tile_is_correct_and_bitwise_deterministic(tile, G):
    """Stream-K plans (the split decided on the device from the real tile count): more tiles than CTAs
    with a partial last wave, groups straddling tiles, empty groups, N and K not multiples of the tile;
    against float64, then three more runs bitwise equal, and every flag back at 0."""
    T, N, K = 4096, 1000, 2056
    a, b = _operands((T,), G, N, K)
    offs = _uneven_offsets(G, T, seed=11, empty=(1,))
    p = _tile_plan(G, T, N, K, tile, torch.bfloat16, "bf16", schedule="stream_k")
    sizes = (offs[1:] - offs[:-1]).tolist()
    tiles, k_steps = _tiles_there_are(sizes, *tile, N), -(-K // grouped.BK)
    assert tiles > p.grid and (tiles % p.grid) * k_steps >= p.grid, (tiles, p.grid)  # the last wave is streamed
    out, frame = _framed((T, N), torch.bfloat16)
    grouped.run(a, b, offs, out=out, plan=p)
    ref = grouped.reference_grouped_mm(a, b, offs)
    _check(out, ref, "bf16")
    assert torch.isnan(frame[T:]).all() and torch.isnan(frame[:, N:]).all()
    first = out.clone()
    for _ in range(3):
        out.fill_(float("nan"))
        grouped.run(a, b, offs, out=out, plan=p)
        torch.cuda.synchronize()
        assert torch.equal(out.view(torch.int16), first.view(torch.int16))
    _, flags = grouped._workspace(p, a.device)
    assert int(flags.abs().sum()) == 0


@pytest.mark.parametrize("G", [12, 200])  # the 128- and the 512-group table
@pytest.mark.parametrize("tile,schedule", [(t, "data_parallel") for t in grouped.TILES if t not in grouped.CLAIM_REFUSED]
                         + [(t, "pingpong") for t in grouped.PINGPONG_TILES])
def test_claimed_tiles_every_tile_bitwise_equal_to_the_static_order(tile, schedule, G):
    """Tiles in claim order (a global counter): the same numbers as the static order, bit for bit, over
    repeated runs (which CTA runs a tile changes, what the tile computes does not); every group's rows
    written, nothing outside; the counter back at 0 after each launch, and under graph replay."""
    T, N, K = 3000, 2000, 1032  # more tiles than CTAs at every tile (1000 columns left 128 x 256 short)
    a, b = _operands((T,), G, N, K)
    offs = _uneven_offsets(G, T, seed=41, empty=(1,))
    p = dataclasses.replace(_tile_plan(G, T, N, K, tile, torch.bfloat16, "bf16", schedule=schedule), claim=False)
    q = dataclasses.replace(p, claim=True)
    assert _tiles_there_are((offs[1:] - offs[:-1]).tolist(), *tile, N) > q.grid  # CTAs claim tiles
    want, _ = _framed((T, N), torch.bfloat16)
    grouped.run(a, b, offs, out=want, plan=p)
    _check(want, grouped.reference_grouped_mm(a, b, offs), "bf16")
    out, frame = _framed((T, N), torch.bfloat16)
    _, flags = grouped._workspace(q, a.device)
    for _ in range(3):
        out.fill_(float("nan"))
        grouped.run(a, b, offs, out=out, plan=q)
        torch.cuda.synchronize()
        assert torch.equal(out.view(torch.int16), want.view(torch.int16))
        assert torch.isnan(frame[T:]).all() and torch.isnan(frame[:, N:]).all()
        assert int(flags.abs().sum()) == 0
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        grouped.run(a, b, offs, out=out, plan=q)
    for _ in range(3):
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out.view(torch.int16), want.view(torch.int16))
    assert int(grouped._workspace(q, a.device)[1].abs().sum()) == 0


@pytest.mark.parametrize("G", [12, 200])  # the 128- and the 512-group table
@pytest.mark.parametrize("tile", grouped.PINGPONG_TILES)
@pytest.mark.parametrize("odt", ["bf16", "fp32"])
def test_ping_pong_every_tile(tile, odt, G):
    """Ping-pong plans: each consumer's whole tiles in turn, an odd and an even count per CTA, groups
    straddling tiles, empty groups, N and K not multiples of the tile, TMA and thread-stored blocks; fp16
    operands with fp32 out. Then the same plan with DIRECT stores (out's rows not 16-byte aligned)."""
    T, N, K = 3000, 1000, 1032
    dtype = torch.float16 if odt == "fp32" else torch.bfloat16
    a, b = _operands((T,), G, N, K, dtype=dtype)
    offs = _uneven_offsets(G, T, seed=13, empty=(2,))
    p = _tile_plan(G, T, N, K, tile, dtype, odt, schedule="pingpong")
    assert p.consumers == 2 and _tiles_there_are((offs[1:] - offs[:-1]).tolist(), *tile, N) > p.grid
    out, frame = _framed((T, N), _TYPES[odt])
    grouped.run(a, b, offs, out=out, plan=p)
    _check(out, grouped.reference_grouped_mm(a, b, offs), odt)
    assert torch.isnan(frame[T:]).all() and torch.isnan(frame[:, N:]).all()
    N = 998  # 1996-byte bf16 rows / 3992-byte fp32 rows: not 16-byte aligned, every block thread-stored
    if grouped.pingpong_problem(*tile, odt, True):  # not listed with DIRECT stores (it spills)
        listed = grouped.candidates("contiguous", G, T, N, K, dtype=grouped._NAMES[dtype], out_dtype=odt)
        assert not any((c.bm, c.bn, c.schedule) == (*tile, "pingpong") for c in listed)
        return
    b = b[:, :N].contiguous()
    p = _tile_plan(G, T, N, K, tile, dtype, odt, schedule="pingpong")
    assert p.direct
    out, frame = _framed((T, N), _TYPES[odt])
    grouped.run(a, b, offs, out=out, plan=p)
    _check(out, grouped.reference_grouped_mm(a, b, offs), odt)
    assert torch.isnan(frame[T:]).all() and torch.isnan(frame[:, N:]).all()


def test_ping_pong_masked_in_a_cuda_graph():
    """Masked layout, ping-pong, captured once and replayed with new counts."""
    G, C, N, K = 16, 512, 1024, 1024
    g = torch.Generator().manual_seed(5)
    a = torch.randn(G, C, K, generator=g).cuda().bfloat16()
    b = torch.randn(G, N, K, generator=g).cuda().bfloat16()
    counts = torch.randint(0, C + 1, (G,), generator=g).int().cuda()
    p = next(c for c in grouped.candidates("masked", G, C, N, K) if (c.bm, c.bn, c.schedule) == (128, 128, "pingpong"))
    out = torch.full((G, C, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    graph = _captured(lambda: grouped.run(a, b, counts=counts, out=out, plan=p))
    for seed in (6, 7):
        counts.copy_(torch.randint(0, C + 1, (G,), generator=torch.Generator().manual_seed(seed)).int())
        out.fill_(float("nan"))
        graph.replay()
        ref = grouped.reference_grouped_mm(a, b, counts=counts)
        for e, n in enumerate(counts.tolist()):
            assert rel_error(out[e, :n].double(), ref[e, :n].double()) < 1e-2
            assert torch.isnan(out[e, n:]).all()  # rows past a count untouched


@pytest.mark.parametrize("odt", ["fp16", "fp32"])
def test_stream_k_fp16_operands_and_a_dense_stream_k_plan_on_the_same_stream(odt):
    """fp16 operands, fp16 / fp32 out, and the workspace shared with the dense kernel's stream-K plans on
    one stream: grouped, dense, grouped again, each checked."""
    from gemmlab import engine2, planner

    G, T, N, K = 8, 4096, 4096, 2056
    a, b = _operands((T,), G, N, K, dtype=torch.float16)
    offs = _uneven_offsets(G, T, seed=4, empty=(2,))
    tile = (256, 128) if odt == "fp32" else (128, 256)  # grouped.stream_k_problem: no 128 x 256 with fp32 out
    p = _tile_plan(G, T, N, K, tile, torch.float16, odt, schedule="stream_k")
    dp = next(c for c in planner.candidates(1500, 3000, 2000, schedules=planner.SCHEDULES) if c.schedule == "stream_k")
    x = torch.randn(1500, 2000, device="cuda").bfloat16()
    w = torch.randn(3000, 2000, device="cuda").bfloat16()
    for _ in range(2):
        out = torch.full((T, N), float("nan"), device="cuda", dtype=_TYPES[odt])
        grouped.run(a, b, offs, out=out, plan=p)
        _check(out, grouped.reference_grouped_mm(a, b, offs), odt)
        dense = torch.full((1500, 3000), float("nan"), device="cuda", dtype=torch.bfloat16)
        engine2.launch(dp, x, w.t(), dense)
        torch.cuda.synchronize()
        assert rel_error(dense.double(), x.double() @ w.double().t()) < 1e-2


def test_stream_k_in_cuda_graphs_with_new_offsets_and_counts():
    """Captured once, replayed with new offsets (contiguous) and counts (masked): the device recomputes the
    split from the new tile count at every replay; the flags stay clean between replays."""
    G, T, N, K = 16, 4096, 1024, 1024
    a, b = _operands((T,), G, N, K)
    offs = _uneven_offsets(G, T, seed=1)
    p = _tile_plan(G, T, N, K, (128, 128), torch.bfloat16, "bf16", schedule="stream_k")
    out = torch.full((T, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    # compile and grow the workspace outside the capture
    graph = _captured(lambda: grouped.run(a, b, offs, out=out, plan=p))
    for seed in (2, 3, 4):
        offs.copy_(_uneven_offsets(G, T, seed=seed, empty=(seed,)))
        out.fill_(float("nan"))
        graph.replay()
        _check(out, grouped.reference_grouped_mm(a, b, offs), "bf16")
    Gm, C = 32, 512
    am, bm_ = _operands((Gm, C), Gm, N, K, seed=2)
    counts = torch.full((Gm,), C, dtype=torch.int32, device="cuda")
    pm = _tile_plan(Gm, C, N, K, (128, 256), torch.bfloat16, "bf16", layout="masked", schedule="stream_k")
    outm = torch.full((Gm, C, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    graph = _captured(lambda: grouped.run(am, bm_, counts=counts, out=outm, plan=pm))
    gen = torch.Generator().manual_seed(6)
    for _ in range(3):
        counts.copy_(torch.randint(0, C + 1, (Gm,), generator=gen, dtype=torch.int32))
        outm.fill_(float("nan"))
        graph.replay()
        _check(outm, grouped.reference_grouped_mm(am, bm_, counts=counts), "bf16")


def test_torch_compile_and_torch_grouped_mm():
    G, T, N, K = 8, 512, 256, 512
    a, b = _operands((T,), G, N, K)
    offs = _uneven_offsets(G, T, seed=11)
    ours = torch.compile(lambda a, b, o: gemmlab.grouped_mm(a, b, o), fullgraph=True)(a, b, offs)
    _check(ours, grouped.reference_grouped_mm(a, b, offs), "bf16")
    if hasattr(torch, "_grouped_mm"):
        theirs = torch._grouped_mm(a, b.transpose(-2, -1), offs[1:])
        assert rel_error(ours.double(), theirs.double()) < 1e-2


# FP8 (e4m3, per-tensor scales: one for a; one, or one per group, for b) against the float64 reference of
# the dequantized inputs. The tolerances above hold: the FP8 partial sums are promoted into fp32 every
# 128 of K (gemmlab.scaled_mm's precision tests). Written 2026-12-02 with the kernel, not yet run on a GPU.

def _fp8_operands(rows_shape, G, N, K, *, per_group, seed=0):
    """e4m3 a (rows_shape + (K,)) and b (G, N, K) with their fp32 scales (b: one, or one per group)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    a, sa = fp8.quantize_per_tensor(torch.randn(*rows_shape, K, device="cuda", generator=g))
    w = torch.randn(G, N, K, device="cuda", generator=g) * torch.linspace(0.5, 2.0, G, device="cuda")[:, None, None]
    if per_group:
        qs = [fp8.quantize_per_tensor(w[e]) for e in range(G)]
        b, sb = torch.stack([q for q, _ in qs]), torch.stack([s.reshape(()) for _, s in qs]).contiguous()
    else:
        b, sb = fp8.quantize_per_tensor(w)
    return a, b, sa, sb


@pytest.mark.parametrize("per_group", [False, True])
@pytest.mark.parametrize("G,T,N,K", [(8, 4096, 1792, 4096), (64, 3000, 1408, 2048), (256, 2048, 256, 7168),
                                     (16, 100, 200, 144), (8, 1, 4096, 512)])
def test_fp8_contiguous_uneven_groups(G, T, N, K, per_group):
    a, b, sa, sb = _fp8_operands((T,), G, N, K, per_group=per_group, seed=G + T)
    offs = _uneven_offsets(G, T, seed=G + T, empty=(0, G // 2))
    out, frame = _framed((T, N), torch.bfloat16)
    grouped.run(a, b, offs, out=out, scale_a=sa, scale_b=sb)
    ref = grouped.reference_grouped_mm(a, b, offs, scale_a=sa, scale_b=sb)
    _check(out, ref, "bf16")
    assert torch.isnan(frame[T:]).all() and torch.isnan(frame[:, N:]).all()
    # The public call (the custom op) gives the same rows.
    got = gemmlab.grouped_mm(a, b, offs, scale_a=sa, scale_b=sb)
    written = ~torch.isnan(ref[:, 0])
    assert torch.equal(got[written], out[written])


def _fp8_tile_plan(G, T, N, K, tile, odt, layout="contiguous", scale="tensor"):
    unaligned = N * (4 if odt == "fp32" else 2) % 16 != 0
    return next(dataclasses.replace(c, direct=unaligned)
                for c in grouped.candidates(layout, G, T, N, K, dtype="e4m3", out_dtype=odt, scale=scale)
                if (c.bm, c.bn) == tile)


@pytest.mark.parametrize("G", [12, 200])  # the 128- and the 512-group table
@pytest.mark.parametrize("tile", grouped.FP8_TILES)
@pytest.mark.parametrize("odt", ["bf16", "fp16", "fp32"])
def test_fp8_every_tile_and_output_dtype(tile, odt, G):
    T, N, K = 1000, 392, 528  # N not a multiple of the tile, K not of the 128-deep k-step
    a, b, sa, sb = _fp8_operands((T,), G, N, K, per_group=True, seed=3)
    offs = _uneven_offsets(G, T, seed=7, empty=(3,))
    p = _fp8_tile_plan(G, T, N, K, tile, odt)
    assert p.table == (128 if G <= 128 else 512) and not p.direct
    out, frame = _framed((T, N), _TYPES[odt])
    grouped.run(a, b, offs, out=out, plan=p, scale_a=sa, scale_b=sb)
    _check(out, grouped.reference_grouped_mm(a, b, offs, scale_a=sa, scale_b=sb), odt)
    assert torch.isnan(frame[T:]).all() and torch.isnan(frame[:, N:]).all()


@pytest.mark.parametrize("scale", ["tensor", "block"])
@pytest.mark.parametrize("tile", grouped.FP8_TILES)
def test_fp8_direct_stores_for_unaligned_out(tile, scale):
    G, T, N, K = 12, 1000, 396, 256  # rows of 396 bf16: no TMA map over out
    a, b, sa, sb = (_fp8_operands((T,), G, N, K, per_group=False, seed=9) if scale == "tensor"
                    else _block_operands((T,), G, N, K, seed=9))
    offs = _uneven_offsets(G, T, seed=9, empty=(5,))
    p = _fp8_tile_plan(G, T, N, K, tile, "bf16", scale=scale)
    assert p.direct
    out, frame = _framed((T, N), torch.bfloat16)
    grouped.run(a, b, offs, out=out, plan=p, scale_a=sa, scale_b=sb)
    _check(out, grouped.reference_grouped_mm(a, b, offs, scale_a=sa, scale_b=sb), "bf16")
    assert torch.isnan(frame[T:]).all() and torch.isnan(frame[:, N:]).all()


@pytest.mark.parametrize("tile", grouped.FP8_TILES)
def test_fp8_masked_layout(tile):
    G, C, N, K = 6, 300, 520, 384
    a, b, sa, sb = _fp8_operands((G, C), G, N, K, per_group=True, seed=11)
    counts = torch.tensor([300, 0, 299, 64, 1, 200], dtype=torch.int32, device="cuda")
    out, _ = _framed((G, C, N), torch.bfloat16)
    grouped.run(a, b, counts=counts, out=out, plan=_fp8_tile_plan(G, C, N, K, tile, "bf16", "masked"),
                scale_a=sa, scale_b=sb)
    _check(out, grouped.reference_grouped_mm(a, b, counts=counts, scale_a=sa, scale_b=sb), "bf16")


def test_fp8_masked_layout_in_a_cuda_graph_with_new_counts():
    G, C, N, K = 32, 16, 1024, 512
    a, b, sa, sb = _fp8_operands((G, C), G, N, K, per_group=True, seed=5)
    counts = torch.zeros(G, dtype=torch.int32, device="cuda")
    out = torch.full((G, C, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    # compile outside the capture
    graph = _captured(lambda: grouped.run(a, b, counts=counts, out=out, scale_a=sa, scale_b=sb))
    gen = torch.Generator().manual_seed(5)
    for step in range(3):
        counts.copy_(torch.randint(0, C + 1, (G,), generator=gen, dtype=torch.int32))
        a.copy_(fp8.quantize_per_tensor(torch.randn(G, C, K, generator=gen).cuda())[0])
        out.fill_(float("nan"))
        graph.replay()
        _check(out, grouped.reference_grouped_mm(a, b, counts=counts, scale_a=sa, scale_b=sb), "bf16")


# FP8 with block scales (DeepSeek-V3's: a 1 x 128 per row and 128 of K, each expert's weight 128 x 128)
# against the float64 reference of the dequantized inputs. Rows and blocks of different magnitudes, so a
# scale applied to the wrong row, k-block, column block or expert fails the tolerance. Written with the
# kernel (branch grouped-block), not yet run on a GPU.

def _block_operands(rows_shape, G, N, K, *, seed=0):
    """e4m3 a (rows_shape + (K,)) with (rows..., K / 128) scales and b (G, N, K) with (G, ceil(N / 128),
    K / 128) scales, both in the quantizers' MN-major layout (read in place)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(*rows_shape, K, device="cuda", generator=g)
    x = x * torch.exp(2 * torch.rand(*rows_shape, K // 128, device="cuda", generator=g)).repeat_interleave(128, -1)
    if len(rows_shape) == 1:
        a, sa = fp8.quantize_blocks(x, 1)
    else:
        a, sa = fp8.quantize_expert_blocks(x, 1)
    nb = -(-N // 128)
    w = torch.randn(G, N, K, device="cuda", generator=g) / K ** 0.5
    blocks = torch.exp(2 * torch.rand(G, nb, K // 128, device="cuda", generator=g))
    w = w * blocks.repeat_interleave(128, 1)[:, :N].repeat_interleave(128, 2)
    b, sb = fp8.quantize_expert_blocks(w, 128)
    return a, b, sa, sb


def _block_tile_plan(G, T, N, K, tile, odt, layout="contiguous"):
    return _fp8_tile_plan(G, T, N, K, tile, odt, layout, scale="block")


@pytest.mark.parametrize("G,T,N,K", [(8, 4096, 1792, 4096), (64, 3000, 1408, 2048), (256, 2048, 256, 7168),
                                     (16, 100, 200, 256), (8, 1, 4096, 512), (60, 777, 2816, 2048)])
def test_block_contiguous_uneven_groups(G, T, N, K):
    a, b, sa, sb = _block_operands((T,), G, N, K, seed=G + T)
    offs = _uneven_offsets(G, T, seed=G + T, empty=(0, G // 2))
    out, frame = _framed((T, N), torch.bfloat16)
    got = gemmlab.grouped_mm(a, b, offs, scale_a=sa, scale_b=sb)  # the public call: the planner's tile
    ref = grouped.reference_grouped_mm(a, b, offs, scale_a=sa, scale_b=sb)
    _check(got, ref, "bf16")
    grouped.run(a, b, offs, out=out, scale_a=sa, scale_b=sb)
    _check(out, ref, "bf16")
    assert torch.isnan(frame[T:]).all() and torch.isnan(frame[:, N:]).all()
    written = ~torch.isnan(ref[:, 0])
    assert torch.equal(got[written], out[written])


def test_block_rows_outside_the_groups_and_their_scales():
    """Groups cover rows [5, T - 7) only; the rows outside hold garbage and NaN scales. A tile at the last
    group's end loads those rows and their scales (its A box and its row-scale box start at the same row),
    multiplies them into rows that are never stored: the written rows stay exact, the others NaN."""
    G, T, N, K = 8, 1000, 520, 768
    a, b, sa, sb = _block_operands((T,), G, N, K, seed=21)
    offs = _uneven_offsets(G, T - 12, seed=21, empty=(2,)) + 5
    sa[:5] = float("nan")
    sa[T - 7:] = float("nan")
    a[:5] = a[T - 7:] = torch.tensor(448.0).to(fp8.E4M3)
    for tile in grouped.FP8_TILES:
        out, frame = _framed((T, N), torch.bfloat16)
        grouped.run(a, b, offs, out=out, scale_a=sa, scale_b=sb, plan=_block_tile_plan(G, T, N, K, tile, "bf16"))
        ref = grouped.reference_grouped_mm(a, b, offs, scale_a=sa, scale_b=sb)
        _check(out, ref, "bf16")
        assert torch.isnan(out[:5]).all() and torch.isnan(out[T - 7:]).all()


# Every tile with the 128-group table and bf16 out and with the 512-group table and fp32 out; the other
# combinations under -m slow.
_BLOCK_TILE_CASES = [pytest.param(t, odt, G, marks=[pytest.mark.slow] if slow else [])
                     for t in grouped.FP8_TILES
                     for odt, G, slow in (("bf16", 12, False), ("fp32", 200, False), ("fp16", 12, True),
                                          ("fp16", 200, True), ("bf16", 200, True), ("fp32", 12, True))]


@pytest.mark.parametrize("tile,odt,G", _BLOCK_TILE_CASES)
def test_block_every_tile_and_output_dtype(tile, odt, G):
    T, N, K = 1000, 392, 640  # N not a multiple of 128 (nor of the tile): tiles read the next expert's scales
    a, b, sa, sb = _block_operands((T,), G, N, K, seed=3)
    offs = _uneven_offsets(G, T, seed=7, empty=(3,))
    p = _block_tile_plan(G, T, N, K, tile, odt)
    assert p.table == (128 if G <= 128 else 512) and not p.direct and p.scale == "block"
    out, frame = _framed((T, N), _TYPES[odt])
    grouped.run(a, b, offs, out=out, plan=p, scale_a=sa, scale_b=sb)
    _check(out, grouped.reference_grouped_mm(a, b, offs, scale_a=sa, scale_b=sb), odt)
    assert torch.isnan(frame[T:]).all() and torch.isnan(frame[:, N:]).all()


@pytest.mark.parametrize("tile", grouped.FP8_TILES)
def test_block_masked_layout(tile):
    """Slabs of 300 rows (not a multiple of any tile): rows past a count hold garbage and NaN scales, the
    next slab's first rows are read into a slab's last tile; only the counted rows are written."""
    G, C, N, K = 6, 300, 520, 384
    a, b, sa, sb = _block_operands((G, C), G, N, K, seed=11)
    counts = torch.tensor([300, 0, 299, 64, 1, 200], dtype=torch.int32, device="cuda")
    for g, n in enumerate(counts.tolist()):
        sa[g, n:] = float("nan")
        a[g, n:] = torch.tensor(-448.0).to(fp8.E4M3)
    out, _ = _framed((G, C, N), torch.bfloat16)
    grouped.run(a, b, counts=counts, out=out, plan=_block_tile_plan(G, C, N, K, tile, "bf16", "masked"),
                scale_a=sa, scale_b=sb)
    _check(out, grouped.reference_grouped_mm(a, b, counts=counts, scale_a=sa, scale_b=sb), "bf16")


def test_block_masked_layout_in_a_cuda_graph_with_new_counts():
    """Decode under a CUDA graph: the counts, the tokens and their scales change between replays."""
    G, C, N, K = 32, 16, 1024, 512
    a, b, sa, sb = _block_operands((G, C), G, N, K, seed=5)
    counts = torch.zeros(G, dtype=torch.int32, device="cuda")
    out = torch.full((G, C, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    # compile outside the capture
    graph = _captured(lambda: grouped.run(a, b, counts=counts, out=out, scale_a=sa, scale_b=sb))
    gen = torch.Generator().manual_seed(5)
    for step in range(3):
        counts.copy_(torch.randint(0, C + 1, (G,), generator=gen, dtype=torch.int32))
        x = torch.randn(G, C, K, generator=gen).cuda() * (1 + 10 * step)
        a2, sa2 = fp8.quantize_expert_blocks(x, 1)
        a.copy_(a2)
        sa.copy_(sa2)  # in place: the graph's TMA map points at sa's storage
        out.fill_(float("nan"))
        graph.replay()
        _check(out, grouped.reference_grouped_mm(a, b, counts=counts, scale_a=sa, scale_b=sb), "bf16")


def test_block_scales_in_other_layouts_give_the_same_result():
    """Row-major scales (copied into the (K / 128, rows) view each call) against the quantizers' MN-major
    ones (read in place): bitwise the same output, both layouts."""
    G, T, N, K = 8, 600, 640, 1024
    a, b, sa, sb = _block_operands((T,), G, N, K, seed=13)
    offs = _uneven_offsets(G, T, seed=13)
    assert grouped.scale_rows_mn_major(sa).data_ptr() == sa.data_ptr()
    first = gemmlab.grouped_mm(a, b, offs, scale_a=sa, scale_b=sb)
    again = gemmlab.grouped_mm(a, b, offs, scale_a=sa.contiguous(), scale_b=sb.contiguous())
    assert sa.contiguous().stride() != sa.stride() and torch.equal(first, again)
    a3, b3, sa3, sb3 = _block_operands((G, 40), G, N, K, seed=13)
    counts = torch.tensor([40, 0, 7, 33, 40, 1, 2, 39], dtype=torch.int32, device="cuda")
    first = gemmlab.grouped_mm(a3, b3, counts=counts, scale_a=sa3, scale_b=sb3)
    again = gemmlab.grouped_mm(a3, b3, counts=counts, scale_a=sa3.contiguous(), scale_b=sb3.contiguous())
    written = ~torch.isnan(grouped.reference_grouped_mm(a3, b3, counts=counts, scale_a=sa3, scale_b=sb3)[..., 0])
    assert torch.equal(first[written], again[written])


def test_block_deep_k():
    """K = 7168 (DeepSeek-V3's hidden size): block scales promoted every 128 of K stay within the bf16
    output's rounding of the float64 product of the dequantized inputs."""
    G, T, N, K = 4, 512, 512, 7168
    a, b, sa, sb = _block_operands((T,), G, N, K, seed=17)
    offs = torch.tensor([0, 100, 228, 228, T], dtype=torch.int32, device="cuda")
    out = gemmlab.grouped_mm(a, b, offs, scale_a=sa, scale_b=sb, out_dtype=torch.float32)
    ref = grouped.reference_grouped_mm(a, b, offs, scale_a=sa, scale_b=sb)
    assert rel_error(out.double(), ref) < 1e-3


# The eager path (grouped.GroupedLaunch prepared per metadata key) ---------------------------------------

def _eager_case(mode, layout, seed):
    """Fresh grouped_mm arguments for ``mode`` ("bf16"; e4m3 "tensor" with a scale per expert; "block"
    MN-major; "block_row": a's block scales row-major, re-laid every call) and ``layout``, their offsets
    or counts changing with ``seed`` (uneven, an empty group)."""
    G, T, N, K = 8, 600, 1536, 1024
    rows = (T,) if layout == "contiguous" else (G, 96)
    if mode == "bf16":
        a, b = _operands(rows, G, N, K, seed=seed)
        kw = {}
    elif mode == "tensor":
        a, b, sa, sb = _fp8_operands(rows, G, N, K, per_group=True, seed=seed)
        kw = dict(scale_a=sa, scale_b=sb)
    else:
        a, b, sa, sb = _block_operands(rows, G, N, K, seed=seed)
        kw = dict(scale_a=sa.contiguous() if mode == "block_row" else sa, scale_b=sb)
    if layout == "contiguous":
        kw["offsets"] = _uneven_offsets(G, T, seed=seed, empty=(seed % G,))
    else:
        gen = torch.Generator().manual_seed(seed)
        kw["counts"] = torch.randint(0, 97, (G,), generator=gen, dtype=torch.int32).cuda()
    return dict(a=a, b=b, **kw)


def _eager_check(y, c, odt="bf16"):
    ref = grouped.reference_grouped_mm(**c)
    _check(torch.where(torch.isnan(ref), float("nan"), y.double()), ref, odt)


@pytest.mark.parametrize("mode", ["bf16", "tensor", "block", "block_row"])
@pytest.mark.parametrize("layout", grouped.LAYOUTS)
def test_eager_fresh_tensors_every_call(mode, layout):
    """Eager grouped_mm calls with fresh a, b, offsets / counts, scales and outputs every call (new
    addresses, new group sizes): each matches the reference, from one prepared launch."""
    grouped.clear_prepared_calls()
    for seed in range(3):
        c = _eager_case(mode, layout, seed)
        _eager_check(gemmlab.grouped_mm(**c), c)
    assert len(grouped._PREPARED) == 1


def test_eager_out_keeps_rows_outside_the_groups():
    c = _eager_case("bf16", "contiguous", 1)
    c["offsets"][-1] = 500  # rows 500.. in no group
    out = torch.full((600, 1536), float("nan"), device="cuda", dtype=torch.bfloat16)
    _check(gemmlab.grouped_mm(**c, out=out), grouped.reference_grouped_mm(**c), "bf16")


@pytest.mark.parametrize("mode", ["bf16", "block_row"])
def test_eager_on_a_side_stream(mode):
    """A call on a side stream launches there (its inputs made there too): the result is right after
    that stream alone is synchronized."""
    grouped.clear_prepared_calls()
    c = _eager_case(mode, "contiguous", 0)
    gemmlab.grouped_mm(**c)  # prepared on the default stream
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        c = _eager_case(mode, "contiguous", 1)
        y = gemmlab.grouped_mm(**c)
    side.synchronize()
    _eager_check(y, c)


@pytest.mark.parametrize("mode", ["bf16", "tensor", "block_row"])
def test_eager_call_captured_in_a_cuda_graph(mode):
    """An eager call captured in a CUDA graph (prepared outside it; the capture keeps no preparation of
    its own) replays with new offsets and inputs copied in, and eager calls after it still run."""
    grouped.clear_prepared_calls()
    c = _eager_case(mode, "contiguous", 0)
    gemmlab.grouped_mm(**c)
    torch.cuda.synchronize()
    keys = len(grouped._PREPARED)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = gemmlab.grouped_mm(**c)
    assert len(grouped._PREPARED) == keys
    for seed in (1, 2):
        new = _eager_case(mode, "contiguous", seed)
        for k, v in new.items():
            c[k].copy_(v)
        graph.replay()
        _eager_check(y, c)
    c2 = _eager_case(mode, "contiguous", 3)
    _eager_check(gemmlab.grouped_mm(**c2), c2)


def _grad_reference(a, b, offsets=None, counts=None):
    """float64 autograd through a per-group loop: (out, a.grad, b.grad) for loss = sum(out * w)."""
    a64, b64 = a.detach().double().requires_grad_(True), b.detach().double().requires_grad_(True)
    if counts is None:
        o = offsets.tolist()
        starts, ends = (o[:-1], o[1:]) if len(o) == b.shape[0] + 1 else ([0] + o[:-1], o)
        parts = [(s, e, g) for g, (s, e) in enumerate(zip(starts, ends)) if e > s]
        y = torch.zeros(a.shape[0], b.shape[1], dtype=torch.float64, device=a.device)
        for s, e, g in parts:
            y = y.index_put((torch.arange(s, e, device=a.device),), a64[s:e] @ b64[g].t())
        return y, a64, b64
    keep = (torch.arange(a.shape[1], device=a.device)[None, :] < counts[:, None].long())[..., None]
    y = torch.where(keep, torch.bmm(torch.where(keep, a64, 0.0), b64.transpose(1, 2)), 0.0)
    return y, a64, b64


@pytest.mark.parametrize("layout,dtype,N", [("contiguous", torch.bfloat16, 1024), ("contiguous", torch.float16, 1000),
                                            ("contiguous", torch.bfloat16, 1003), ("masked", torch.bfloat16, 1024)])
@pytest.mark.parametrize("mn_b", [False, True])  # True: MN-major b offered, contiguous da on the grouped kernel
def test_gradients_against_float64_autograd(monkeypatch, layout, dtype, N, mn_b):
    """grouped_mm's backward on the GPU: torch._grouped_mm (contiguous; where torch refuses the dtype, the
    grouped kernel for da, N padded, and one GEMM per group for db) or batched GEMMs (masked); rows outside
    every group and past a count get zero, NaN there never leaks."""
    monkeypatch.setattr(grouped, "MN_MAJOR_B_OFFERED", mn_b)
    G, T, K = 12, 3000, 1032
    if layout == "contiguous":
        a = torch.randn(T, K, device="cuda").to(dtype)
        kw = {"offsets": _uneven_offsets(G, T - 40, seed=21, empty=(3,)) + 20}  # rows 0..19 and the last 20: none
        a[:20] = float("nan")
    else:
        a = torch.randn(G, 300, K, device="cuda").to(dtype)
        counts = torch.randint(0, 301, (G,), generator=torch.Generator().manual_seed(22)).int()
        counts[4] = 0
        kw = {"counts": counts.cuda()}
        a[5, int(counts[5]):] = float("nan")
    b = (torch.randn(G, N, K, device="cuda") / K ** 0.5).to(dtype)
    a.requires_grad_(True)
    b.requires_grad_(True)
    y = gemmlab.grouped_mm(a, b, **kw)
    y64, a64, b64 = _grad_reference(a, b, **kw)
    written = ~torch.isnan(grouped.reference_grouped_mm(a.detach(), b.detach(), **kw))
    w = torch.where(written, torch.randn(y64.shape, device="cuda", dtype=torch.float64), 0.0)
    (y.double() * w).sum().backward()
    (y64 * w).sum().backward()
    for got, want in ((a.grad, a64.grad), (b.grad, b64.grad)):
        assert got.dtype == dtype and not torch.isnan(got).any()
        assert rel_error(got.double(), want) < 2e-2
    if layout == "contiguous":
        assert (a.grad[:20] == 0).all() and (a.grad[-20:] == 0).all()
    else:
        assert (a.grad[4] == 0).all() and (a.grad[5, int(kw["counts"][5]):] == 0).all()


def test_gradients_under_torch_compile():
    """A compiled MoE projection's forward and backward: the op traces with its fake, the backward formula
    (the grouped kernel and torch._grouped_mm) traces into the backward graph; the same gradients."""
    G, T, N, K = 8, 2048, 512, 256
    a = torch.randn(T, K, device="cuda").bfloat16().requires_grad_(True)
    b = (torch.randn(G, N, K, device="cuda") / 16).bfloat16().requires_grad_(True)
    offs = _uneven_offsets(G, T, seed=23, empty=(1,))
    f = torch.compile(lambda x, w, o: gemmlab.grouped_mm(x, w, o).float().square().sum())
    f(a, b, offs).backward()
    ga, gb = a.grad.clone(), b.grad.clone()
    a.grad = b.grad = None
    gemmlab.grouped_mm(a, b, offs).float().square().sum().backward()
    assert rel_error(ga.double(), a.grad.double()) < 1e-2 and rel_error(gb.double(), b.grad.double()) < 1e-2


@pytest.mark.parametrize("tile,schedule", [(t, "data_parallel") for t in grouped.TILES]
                         + [((128, 128), "stream_k"), ((64, 256), "pingpong"), ((128, 128), "pingpong")])
@pytest.mark.parametrize("G", [12, 200])
def test_mn_major_b_every_tile(monkeypatch, tile, schedule, G):
    """b stored MN-major (the transpose of a (G, K, N) tensor: torch._grouped_mm's mat_b, the backward's
    w[g]): the B_MN kernel loads (G K, N) rows in 64-column boxes; each group's k-steps stay inside its own
    K rows (K a multiple of 64). N not a multiple of the tile, groups straddling tiles, an empty group."""
    monkeypatch.setattr(grouped, "MN_MAJOR_B_OFFERED", True)
    T, N, K = 3000, 1000, 1088
    g = torch.Generator().manual_seed(31)
    a = torch.randn(T, K, generator=g).cuda().bfloat16()
    b = (torch.randn(G, K, N, generator=g) / K ** 0.5).cuda().bfloat16().transpose(1, 2)
    offs = _uneven_offsets(G, T, seed=32, empty=(1,))
    p = next(c for c in grouped.candidates("contiguous", G, T, N, K, b_mn=True)
             if (c.bm, c.bn, c.schedule) == (*tile, schedule))
    out, frame = _framed((T, N), torch.bfloat16)
    grouped.run(a, b, offs, out=out, plan=p)
    _check(out, grouped.reference_grouped_mm(a, b, offs), "bf16")
    assert torch.isnan(frame[T:]).all() and torch.isnan(frame[:, N:]).all()
    y = gemmlab.grouped_mm(a, b, offs)  # the eager path's own plan for it
    _check(y, grouped.reference_grouped_mm(a, b, offs), "bf16")


# Group sizes on both sides of every short A box (8, 16, 32, 64, 128 rows: grouped.short_a_rows of the
# tiles) and of whole tiles, an empty group among them.
_BOX_SIZES = [1, 8, 9, 16, 17, 31, 33, 64, 65, 100, 127, 128, 0, 129, 200, 255, 257]


def _sized_offsets(sizes):
    offs = torch.zeros(len(sizes) + 1, dtype=torch.int64)
    offs[1:] = torch.cumsum(torch.tensor(sizes), 0)
    return offs.to(torch.int32).cuda()


@pytest.mark.parametrize("tile,schedule", [(t, "data_parallel") for t in grouped.TILES]
                         + [((128, 128), "stream_k"), ((64, 256), "pingpong"), ((128, 128), "pingpong"),
                            ((128, 176), "pingpong")])
@pytest.mark.parametrize("kind", ["bf16", "bf16-mn-b", "masked"])
def test_short_a_boxes_at_every_group_size(monkeypatch, tile, schedule, kind):
    """A tile over a group's last rows loads the shortest of A's short boxes that holds them (gemm_grouped.cu's
    a_box): group sizes on both sides of each box's rows and of the tile, K-major and MN-major b, and the
    masked layout (counts of those sizes in slabs of 257). The slot's rows past the box keep stale data
    from earlier tiles; only rows past the group depend on them, and those are never stored."""
    monkeypatch.setattr(grouped, "MN_MAJOR_B_OFFERED", True)
    G, N, K = len(_BOX_SIZES), 392, 1088
    g = torch.Generator().manual_seed(5)
    if kind == "masked":
        C = max(_BOX_SIZES)
        a = torch.randn(G, C, K, generator=g).cuda().bfloat16()
        ranges = torch.tensor(_BOX_SIZES, dtype=torch.int32).cuda()
        layout, T, out_shape = "masked", C, (G, C, N)
    else:
        T = sum(_BOX_SIZES)
        a = torch.randn(T, K, generator=g).cuda().bfloat16()
        ranges = _sized_offsets(_BOX_SIZES)
        layout, out_shape = "contiguous", (T, N)
    w = torch.randn(G, K, N, generator=g) if kind == "bf16-mn-b" else torch.randn(G, N, K, generator=g)
    b = (w / K ** 0.5).cuda().bfloat16()
    b = b.transpose(1, 2) if kind == "bf16-mn-b" else b
    p = next((c for c in grouped.candidates(layout, G, T, N, K, b_mn=kind == "bf16-mn-b")
              if (c.bm, c.bn, c.schedule) == (*tile, schedule)), None)
    if p is None:
        pytest.skip(f"no {tile} {schedule} plan for {kind}")
    p = dataclasses.replace(p, direct=False)
    out, frame = _framed(out_shape, torch.bfloat16)
    offs, counts = (None, ranges) if kind == "masked" else (ranges, None)
    grouped.run(a, b, offs, counts=counts, out=out, plan=p)
    _check(out, grouped.reference_grouped_mm(a, b, offs, counts=counts), "bf16")


@pytest.mark.parametrize("scale", ["tensor", "block"])
@pytest.mark.parametrize("tile", grouped.FP8_TILES)
def test_fp8_short_a_boxes_at_every_group_size(tile, scale):
    """The same group sizes with e4m3 operands: A's short boxes are 128-byte rows of e4m3 as its whole box,
    per-tensor scales (one per group for b) and block scales (A's row-scale box still BM + 4 rows)."""
    G, N, K = len(_BOX_SIZES), 392, 1024
    T = sum(_BOX_SIZES)
    if scale == "tensor":
        a, b, sa, sb = _fp8_operands((T,), G, N, K, per_group=True, seed=17)
    else:
        a, b, sa, sb = _block_operands((T,), G, N, K, seed=17)
    offs = _sized_offsets(_BOX_SIZES)
    p = _fp8_tile_plan(G, T, N, K, tile, "bf16", scale=scale)
    out, frame = _framed((T, N), torch.bfloat16)
    grouped.run(a, b, offs, out=out, plan=p, scale_a=sa, scale_b=sb)
    _check(out, grouped.reference_grouped_mm(a, b, offs, scale_a=sa, scale_b=sb), "bf16")
    assert torch.isnan(frame[T:]).all() and torch.isnan(frame[:, N:]).all()


# The fitted form (GroupedPlan.fit: gemm_grouped_fit.cu, token tiles fitted per group) -------------------------

def _fit_plan(G, T, N, K, dtype="bf16", schedule="data_parallel", wmax=None, store_step=None):
    """The fitted form at ``schedule`` for any rows (``grouped.fitted_plan``: listed where measured ahead)."""
    return grouped.fitted_plan("contiguous", G, T, N, K, dtype=dtype, out_dtype=dtype, schedule=schedule, wmax=wmax,
                               store_step=store_step)


# Both schedules: data-parallel (listed at few rows a group) and ping-pong consumers (taken at 128 rows a group
# and more, 64 where N >= 2 K; K >= 2048); grouped.FIT_SHARED_STORE: one epilogue a width, or one for all.
@pytest.mark.parametrize("schedule", grouped.FIT_SCHEDULES)
@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("G,T,N,K,dtype", [(64, 512, 1408, 2048, "bf16"), (128, 512, 768, 2048, "bf16"),
                                           (60, 256, 2816, 2048, "fp16"), (11, 64, 200, 104, "bf16"),
                                           (8, 128, 4096, 4096, "bf16"), (16, 4096, 1000, 2056, "bf16"),
                                           (8, 4096, 2048, 4096, "fp16")])
def test_fitted_form_uneven_groups(G, T, N, K, dtype, shared, schedule, monkeypatch):
    monkeypatch.setattr(grouped, "FIT_SHARED_STORE", shared)
    a, b = _operands((T,), G, N, K, dtype=_TYPES[dtype])
    offs = _uneven_offsets(G, T, seed=G + T, empty=(0, G // 2))
    out, frame = _framed((T, N), _TYPES[dtype])
    grouped.run(a, b, offs, out=out, plan=_fit_plan(G, T, N, K, dtype, schedule))
    _check(out, grouped.reference_grouped_mm(a, b, offs), dtype)
    assert torch.isnan(frame[T:]).all() and torch.isnan(frame[:, N:]).all()


@pytest.mark.parametrize("wmax,store_step", [(128, 0), (176, 0), (176, 64)])
def test_ping_pong_fitted_form_at_each_widest_tile(wmax, store_step):
    # Each of the ping-pong form's widest tiles (grouped.FIT_PINGPONG_WIDTHS), one epilogue a width or a bucket
    # of widths (store_step 64: stored at 64, 128 or 176 columns, bounded at the tile's end): groups at every
    # width up to 176 (one token tile each), just past it (177: two of 96) and several tiles (353: three of 128
    # at 176, 300: three of 112 at 128); the same bits on a second run.
    sizes = [0, 1, 17, 64, 100, 127, 128, 129, 144, 150, 161, 175, 176, 177, 300, 353, 0, 33]
    G, T, N, K = len(sizes), sum(sizes), 328, 2112
    offs = torch.tensor([0] + torch.tensor(sizes).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    a, b = _operands((T,), G, N, K)
    p = _fit_plan(G, T, N, K, schedule="pingpong", wmax=wmax, store_step=store_step)
    assert p.bn == wmax and p.name_expression.count(f", {wmax}, 5,") == 1 and p.store_step == store_step
    runs = _checked_runs(a, b, offs, [p, p])
    assert torch.equal(runs[0].view(torch.int16), runs[1].view(torch.int16))


def _checked_runs(a, b, offs, plans) -> list:
    """Each bf16 plan's output on NaN-framed outputs, checked against the reference, the frame untouched."""
    (T, _), N = a.shape, b.shape[1]
    ref, runs = grouped.reference_grouped_mm(a, b, offs), []
    for p in plans:
        out, frame = _framed((T, N), torch.bfloat16)
        grouped.run(a, b, offs, out=out, plan=p)
        _check(out, ref, "bf16")
        assert torch.isnan(frame[T:]).all() and torch.isnan(frame[:, N:]).all()
        runs.append(out.clone())
    return runs


@pytest.mark.parametrize("G", [18, 77])
@pytest.mark.parametrize("store_step", [0, 64])
def test_widest_first_table_runs_every_tile_once(G, store_step):
    # The ping-pong fitted form with its tiles by token width, widest first (the plan's widest_first: the
    # kernel's three-sweep table, ranks across 32-group sweeps at 77 groups): every width, empty groups among
    # them, against the reference on NaN-poisoned outputs, and bit for bit the group-order build's output
    # (the same tiles, only their order differs).
    gen = torch.Generator().manual_seed(G + store_step)
    sizes = [0, 1, 17, 64, 100, 127, 128, 129, 144, 150, 161, 175, 176, 177, 300, 353, 0, 33]
    sizes = (sizes + torch.randint(0, 400, (G,), generator=gen).tolist())[:G]
    sizes[G // 2] = 0
    T, N, K = sum(sizes), 328, 2112
    offs = torch.tensor([0] + torch.tensor(sizes).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    a, b = _operands((T,), G, N, K, seed=G)
    plans = [grouped.fitted_plan("contiguous", G, T, N, K, schedule="pingpong", wmax=176, store_step=store_step,
                                 widest_first=widest) for widest in (True, False)]
    assert [(p.widest_first, p.name_expression.endswith(", true>")) for p in plans] == [(True, True), (False, False)]
    outs = _checked_runs(a, b, offs, plans)
    assert torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16))


@pytest.mark.parametrize("schedule", grouped.FIT_SCHEDULES)
@pytest.mark.parametrize("shared", [False, True])
def test_fitted_form_at_every_width_and_group_edge(shared, schedule, monkeypatch):
    # Groups of 0 .. 300 rows: one token tile of each width, and several (300: three of 112, padded from 100).
    # Ping-pong: the CTAs' tiles alternate between the consumers at every width.
    monkeypatch.setattr(grouped, "FIT_SHARED_STORE", shared)
    sizes = [0, 1, 15, 16, 17, 33, 64, 65, 100, 127, 128, 129, 300, 0, 2, 48]
    G, T, N, K = len(sizes), sum(sizes), 328, 1000
    offs = torch.tensor([0] + torch.tensor(sizes).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    a, b = _operands((T,), G, N, K)
    out, frame = _framed((T, N), torch.bfloat16)
    grouped.run(a, b, offs, out=out, plan=_fit_plan(G, T, N, K, schedule=schedule))
    _check(out, grouped.reference_grouped_mm(a, b, offs), "bf16")
    assert torch.isnan(frame[T:]).all() and torch.isnan(frame[:, N:]).all()


# Ping-pong: 256 rows a group, token tiles up to 128 wide at K = 2048 and up to 176 from K = 2560
# (grouped.fit_wmax).
# Shallow K: the ping-pong form as shipped (176 wide, stores in steps of 64) and as before session 61's switch
# (128 wide, one epilogue a width; grouped.FIT_PINGPONG_SHORT_K_*, set for the case: prepared calls made under
# other settings are dropped).
@pytest.mark.parametrize("schedule,G,T,N,K,wmax,step", [("data_parallel", 64, 512, 1024, 512, 128, 0),  # 8 rows
                                                        ("pingpong", 8, 2048, 1000, 2048, 128, 0),
                                                        ("pingpong", 8, 2048, 1000, 2560, 176, 0),
                                                        ("pingpong", 8, 2048, 1000, 2048, 176, 64)])
def test_fitted_form_through_grouped_mm_in_a_graph_and_with_fresh_tensors(schedule, G, T, N, K, wmax, step,
                                                                         monkeypatch, request):
    if schedule == "pingpong" and K < grouped.FIT_PINGPONG_WIDE_MIN_K:
        monkeypatch.setattr(grouped, "FIT_PINGPONG_SHORT_K_WMAX", wmax)
        monkeypatch.setattr(grouped, "FIT_PINGPONG_SHORT_K_STORE_STEP", step)
        grouped.clear_prepared_calls()
        request.addfinalizer(grouped.clear_prepared_calls)
    p = grouped.plan("contiguous", G, T, N, K)
    assert p.fit and p.schedule == schedule and (p.bn, p.store_step) == (wmax, step)  # what grouped_mm runs here
    offs = _replays_with_new_offsets(G, T, N, K)
    for seed in (4, 5):  # the prepared launch's descriptors follow new tensors
        a, b = _operands((T,), G, N, K, seed=seed)
        _check(gemmlab.grouped_mm(a, b, offs), grouped.reference_grouped_mm(a, b, offs), "bf16")
