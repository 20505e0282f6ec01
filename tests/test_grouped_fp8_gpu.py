"""FP8 grouped GEMM (kernels/engine/gemm_grouped.cu with Fp8GemmTraits, through gemmlab.grouped_mm) on a
Hopper GPU, against the float64 reference of the dequantized inputs: uneven contiguous groups (empty ones
included, 8 to 256 experts, ragged rows and N, K a multiple of 16 but not of the 128-deep k-step), one
scale for b or one per group, every FP8 tile with both group-table sizes and bf16 / fp16 / fp32 output,
DIRECT stores, the masked layout, and the masked layout inside a captured CUDA graph replayed with new
counts. Outputs NaN-poisoned inside a NaN frame; rows outside the groups must stay NaN.

Not yet run on a GPU (written with the kernel, 2026-12-02; the session's device time was spent)."""

import dataclasses

import pytest
import torch

import gemmlab
from gemmlab import fp8, grouped
from gemmlab.bench import rel_error

pytestmark = pytest.mark.hopper

_TYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# Relative (Frobenius) error vs float64 of the dequantized inputs: the output's rounding, and the FP8
# tensor core's 128-deep partial sums (promoted into fp32 every 128 of K, as gemmlab.scaled_mm).
TOL = {"bf16": 8e-3, "fp16": 3e-3, "fp32": 1e-3}


def _uneven_offsets(G, T, *, seed, empty=()):
    g = torch.Generator().manual_seed(seed)
    w = torch.rand(G, generator=g) ** 2
    for e in empty:
        w[e] = 0
    sizes = torch.floor(w / w.sum() * T).long()
    sizes[int(torch.argmax(w))] += T - int(sizes.sum())
    offs = torch.zeros(G + 1, dtype=torch.int64)
    offs[1:] = torch.cumsum(sizes, 0)
    return offs.to(torch.int32).cuda()


def _operands(rows_shape, G, N, K, *, per_group, seed=0):
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


def _framed(shape, dtype):
    if len(shape) == 2:
        frame = torch.full((shape[0] + 1, shape[1] + 8), float("nan"), device="cuda", dtype=dtype)
        return frame[: shape[0], : shape[1]], frame
    frame = torch.full(shape, float("nan"), device="cuda", dtype=dtype)
    return frame, frame


def _check(out, ref, odt):
    torch.cuda.synchronize()
    written = ~torch.isnan(ref[..., 0])
    got = out.double()
    assert torch.isnan(got[~written]).all(), "rows outside the groups were written"
    if written.any():
        assert not torch.isnan(got[written]).any(), "rows of a group were not written"
        err = rel_error(got[written], ref[written])
        assert err < TOL[odt], err


@pytest.mark.parametrize("per_group", [False, True])
@pytest.mark.parametrize("G,T,N,K", [(8, 4096, 1792, 4096), (64, 3000, 1408, 2048), (256, 2048, 256, 7168),
                                     (16, 100, 200, 144), (8, 1, 4096, 512)])
def test_contiguous_uneven_groups(G, T, N, K, per_group):
    a, b, sa, sb = _operands((T,), G, N, K, per_group=per_group, seed=G + T)
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


def _tile_plan(G, T, N, K, tile, odt, layout="contiguous"):
    unaligned = N * (4 if odt == "fp32" else 2) % 16 != 0
    return next(dataclasses.replace(c, direct=unaligned)
                for c in grouped.candidates(layout, G, T, N, K, dtype="e4m3", out_dtype=odt) if (c.bm, c.bn) == tile)


@pytest.mark.parametrize("G", [12, 200])  # the 128- and the 512-group table
@pytest.mark.parametrize("tile", grouped.FP8_TILES)
@pytest.mark.parametrize("odt", ["bf16", "fp16", "fp32"])
def test_every_tile_and_output_dtype(tile, odt, G):
    T, N, K = 1000, 392, 528  # N not a multiple of the tile, K not of the 128-deep k-step
    a, b, sa, sb = _operands((T,), G, N, K, per_group=True, seed=3)
    offs = _uneven_offsets(G, T, seed=7, empty=(3,))
    p = _tile_plan(G, T, N, K, tile, odt)
    assert p.table == (128 if G <= 128 else 512) and not p.direct
    out, frame = _framed((T, N), _TYPES[odt])
    grouped.run(a, b, offs, out=out, plan=p, scale_a=sa, scale_b=sb)
    _check(out, grouped.reference_grouped_mm(a, b, offs, scale_a=sa, scale_b=sb), odt)
    assert torch.isnan(frame[T:]).all() and torch.isnan(frame[:, N:]).all()


@pytest.mark.parametrize("tile", grouped.FP8_TILES)
def test_direct_stores_for_unaligned_out(tile):
    G, T, N, K = 12, 1000, 396, 256  # rows of 396 bf16: no TMA map over out
    a, b, sa, sb = _operands((T,), G, N, K, per_group=False, seed=9)
    offs = _uneven_offsets(G, T, seed=9, empty=(5,))
    p = _tile_plan(G, T, N, K, tile, "bf16")
    assert p.direct
    out, frame = _framed((T, N), torch.bfloat16)
    grouped.run(a, b, offs, out=out, plan=p, scale_a=sa, scale_b=sb)
    _check(out, grouped.reference_grouped_mm(a, b, offs, scale_a=sa, scale_b=sb), "bf16")
    assert torch.isnan(frame[T:]).all() and torch.isnan(frame[:, N:]).all()


@pytest.mark.parametrize("tile", grouped.FP8_TILES)
def test_masked_layout(tile):
    G, C, N, K = 6, 300, 520, 384
    a, b, sa, sb = _operands((G, C), G, N, K, per_group=True, seed=11)
    counts = torch.tensor([300, 0, 299, 64, 1, 200], dtype=torch.int32, device="cuda")
    out, _ = _framed((G, C, N), torch.bfloat16)
    grouped.run(a, b, counts=counts, out=out, plan=_tile_plan(G, C, N, K, tile, "bf16", "masked"),
                scale_a=sa, scale_b=sb)
    _check(out, grouped.reference_grouped_mm(a, b, counts=counts, scale_a=sa, scale_b=sb), "bf16")


def test_masked_layout_in_a_cuda_graph_with_new_counts():
    G, C, N, K = 32, 16, 1024, 512
    a, b, sa, sb = _operands((G, C), G, N, K, per_group=True, seed=5)
    counts = torch.zeros(G, dtype=torch.int32, device="cuda")
    out = torch.full((G, C, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    grouped.run(a, b, counts=counts, out=out, scale_a=sa, scale_b=sb)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        grouped.run(a, b, counts=counts, out=out, scale_a=sa, scale_b=sb)
    gen = torch.Generator().manual_seed(5)
    for step in range(3):
        counts.copy_(torch.randint(0, C + 1, (G,), generator=gen, dtype=torch.int32))
        a.copy_(fp8.quantize_per_tensor(torch.randn(G, C, K, generator=gen).cuda())[0])
        out.fill_(float("nan"))
        graph.replay()
        _check(out, grouped.reference_grouped_mm(a, b, counts=counts, scale_a=sa, scale_b=sb), "bf16")
