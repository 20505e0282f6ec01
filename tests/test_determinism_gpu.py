"""Bitwise determinism of every schedule that reduces partial sums (issue 15): the same inputs give the
same bits, run after run, while other work on another stream changes which CTAs run when.

- h11 split-K: a tile's splits reduce in one cluster through distributed shared memory.
- The decode kernel: k pieces of a CTA reduce through shared memory in piece order; with split-K the last
  CTA of a row block adds every CTA's partial in slot order (not arrival order).
- The public call: repeated ``gemmlab.matmul`` on the same values, also copied to other addresses.
"""

import itertools

import pytest
import torch

from fuzzing import exact
from gemmlab.bench import poison_, rel_error

pytestmark = pytest.mark.hopper

RUNS = 6


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({2: torch.int16, 4: torch.int32}[t.element_size()])


class Noise:
    """A large GEMM on a side stream, started before each run: the run's CTAs then start, and its
    split-K partials arrive, in a different order each time."""

    def __init__(self):
        self.stream = torch.cuda.Stream()
        self.a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)

    def start(self, i: int) -> None:
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            for _ in range(i % 3):
                torch.mm(self.a, self.a)


def _runs(launch, out_like: torch.Tensor) -> list[torch.Tensor]:
    noise, outs = Noise(), []
    for i in range(RUNS):
        out = poison_(torch.empty_like(out_like))
        noise.start(i)
        launch(out)
        outs.append(out)
    torch.cuda.synchronize()
    return outs


def _assert_identical(outs: list[torch.Tensor], what: str) -> None:
    first = _bits(outs[0])
    for i, o in enumerate(outs[1:], 1):
        diff = int((_bits(o) != first).sum())
        assert diff == 0, f"{what}: run {i} differs from run 0 in {diff} of {o.numel()} elements"


@pytest.mark.parametrize("plan", [(64, 2), (128, 3), (128, 4), (192, 5), (256, 8), (64, 8)])
@pytest.mark.parametrize("dtype, out_dtype", [(torch.bfloat16, torch.bfloat16), (torch.float16, torch.float32)])
def test_h11_split_k_is_bitwise_deterministic(plan, dtype, out_dtype):
    """Forced split plans (engine.gemm(plan=...)) on a ragged shape: 65 k-steps, so the splits' ranges
    differ in length, with the fused epilogue (bias, beta * c, GELU)."""
    from gemmlab import engine

    M, N, K = 200, 1000, 4100
    a = torch.randn(M, K, device="cuda", dtype=dtype)
    w = torch.randn(N, K, device="cuda", dtype=dtype)
    bias = torch.randn(N, device="cuda", dtype=torch.float32)
    c = torch.randn(M, N, device="cuda", dtype=out_dtype)
    kw = dict(bias=bias, activation="gelu", alpha=0.5, beta=-1.0, c=c, plan=plan)
    outs = _runs(lambda out: engine.gemm(a, w.t(), out, **kw), torch.empty(M, N, device="cuda", dtype=out_dtype))
    _assert_identical(outs, f"h11 plan {plan}")
    assert rel_error(outs[0], exact(a, w.t(), bias, "gelu", 0.5, -1.0, c)) <= 1e-2


def _decode_shapes(sm: int, split: bool):
    """Decode shapes whose plan on this GPU splits K across CTAs (``split``) or reduces k pieces only
    inside a CTA (more than one piece per CTA, one CTA per row block)."""
    from gemmlab import decode

    found = []
    for M, N, K in itertools.product((1, 7, 16, 32), (64, 256, 1000, 4096), (1024, 4096, 8192, 12288)):
        p = decode.plan(M, N, K, sm)
        if (p.splits > 1) == split and (split or p.kw > 1):
            found.append((M, N, K))
    return found[::3][:6]


@pytest.mark.parametrize("split", [True, False], ids=["split-k", "in-cta"])
def test_decode_reduction_is_bitwise_deterministic(split):
    from gemmlab import engine

    sm = torch.cuda.get_device_properties(0).multi_processor_count
    shapes = _decode_shapes(sm, split)
    assert shapes, f"no decode shape with split={split} on {sm} SMs"
    for M, N, K in shapes:
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
        bias = torch.randn(N, device="cuda", dtype=torch.bfloat16)
        assert engine.use_decode(x, w.t())
        outs = _runs(lambda out: engine.gemm(x, w.t(), out, bias=bias, activation="silu", plan="decode"),
                     torch.empty(M, N, device="cuda", dtype=torch.float32))
        _assert_identical(outs, f"decode {M}x{N}x{K}")
        assert rel_error(outs[0], exact(x, w.t(), bias, "silu")) <= 5e-3


def test_every_decode_variant_with_split_k_is_bitwise_deterministic():
    """decode.run_variant forces each variant the benchmark times (each NT's loop structure differs)."""
    from gemmlab import decode

    sm = torch.cuda.get_device_properties(0).multi_processor_count
    for nt, variants in decode.VARIANTS.items():
        M = 8 * nt - 1 if nt > 1 else 5
        N, K = next(((n, k) for n, k in itertools.product((64, 256, 1000), (8192, 14336, 28672))
                     if decode.plan(M, n, k, sm, variants[0]).splits > 1), (256, 28672))
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
        for v in variants:
            outs = _runs(lambda out: decode.run_variant(x, w.t(), out, v), torch.empty(M, N, device="cuda",
                                                                                    dtype=torch.bfloat16))
            _assert_identical(outs, f"decode variant {v} at {M}x{N}x{K}")
            assert rel_error(outs[0], exact(x, w.t())) <= 1e-2


# Decode, the engine kernel's split-K (100x1000x3000, 1x1024x14336), data-parallel (777x555x333) and
# stream-K (8192x9216x8192 with bias + silu) plans as engine.route picks them, and swapped plans over many
# token columns (SWAP_WIDE): data-parallel (5000x5120x14336 with bias + silu), ping-pong (12608x768x3072).
@pytest.mark.parametrize("shape", [(16, 4096, 4096), (100, 1000, 3000), (1, 1024, 14336), (777, 555, 333),
                                   (5000, 5120, 14336), (12608, 768, 3072), (8192, 9216, 8192)])
def test_public_call_is_bitwise_repeatable_and_address_independent(shape):
    """gemmlab.matmul on the same values, run after run and from copies at other addresses (same layout
    and alignment), gives the same bits: the plan depends on the shape and layout, not on the pointers."""
    import gemmlab

    M, N, K = shape
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(N, device="cuda", dtype=torch.bfloat16)
    first = gemmlab.linear(a, w, bias, activation="silu")
    noise = Noise()
    for i in range(RUNS):
        noise.start(i)
        a2, w2 = (a, w) if i % 2 == 0 else (a.clone(), w.clone())
        again = gemmlab.linear(a2, w2, bias, activation="silu")
        torch.cuda.synchronize()
        _assert_identical([first, again], f"linear {shape} run {i}")
