"""The decode kernel (``gemmlab.decode``, reached through ``engine.gemm``) on the GPU against a float64
reference, on fresh random inputs with a NaN-poisoned output (an element it forgets fails)."""

import itertools

import pytest
import torch
import torch.nn.functional as F

from gemmlab import decode, engine
from gemmlab.bench import poison_, rel_error

pytestmark = pytest.mark.hopper

TOL = {torch.bfloat16: 1e-2, torch.float16: 5e-3, torch.float32: 5e-3}
ACTS = {None: lambda x: x, "relu": F.relu, "gelu": F.gelu, "silu": F.silu,
        "gelu_tanh": lambda x: F.gelu(x, approximate="tanh")}


def _linear(M, N, K, dtype):
    """x (M, K) row-major and b = w.t() with w an (N, K) nn.Linear weight: the decode layout."""
    return torch.randn(M, K, device="cuda", dtype=dtype), torch.randn(N, K, device="cuda", dtype=dtype).t()


def _reference(a, b, bias=None, act=None, alpha=1.0, beta=0.0, c=None):
    ref = alpha * (a.double() @ b.double())
    if c is not None:
        ref = ref + beta * c.double()
    if bias is not None:
        ref = ref + bias.double()
    return ACTS[act](ref)


def _run(a, b, out_dtype, variant=None, **kw):
    """Through engine.gemm with the decode kernel forced (``plan="decode"``: the router prices it against the
    engine kernel and may send the shape there) where use_decode allows it; past MAX_M (NT = 8), for the
    large weights the engine sends to h11, or with an explicit variant, through decode.run_variant."""
    out = poison_(torch.empty(a.shape[0], b.shape[1], device="cuda", dtype=out_dtype))
    if a.shape[0] <= 8 and max(a.shape[1], b.shape[1]) <= engine.DECODE_MAX_WEIGHT_DIM:
        assert engine.use_decode(a, b), decode.why_not(a, b)
    if variant is None and engine.use_decode(a, b):
        engine.gemm(a, b, out, plan="decode", **kw)
    else:
        decode.run_variant(a, b, out, variant, **kw)
    torch.cuda.synchronize()
    return out


@pytest.mark.parametrize("M,N,K", list(itertools.product((1, 3, 8, 16, 17, 33, 64), (1, 100, 1024, 4104),
                                                         (8, 40, 4096, 14336))))
def test_shapes(M, N, K):
    a, b = _linear(M, N, K, torch.bfloat16)
    out = _run(a, b, torch.bfloat16)
    assert rel_error(out, _reference(a, b)) <= TOL[torch.bfloat16]


@pytest.mark.parametrize("act", list(ACTS))
@pytest.mark.parametrize("dtype,out_dtype", [(torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32),
                                             (torch.float16, torch.float16), (torch.float16, torch.float32),
                                             (torch.bfloat16, torch.float16)])
@pytest.mark.parametrize("M,N,K", [(5, 1000, 4096), (64, 4096, 1032)])
def test_epilogue(M, N, K, dtype, out_dtype, act):
    a, b = _linear(M, N, K, dtype)
    bias = torch.randn(N, device="cuda", dtype=dtype if act != "gelu" else torch.float32)
    c = torch.randn(N, M, device="cuda", dtype=out_dtype).t()  # strided C
    out = _run(a, b, out_dtype, bias=bias, activation=act, alpha=0.5, beta=-0.75, c=c)
    assert rel_error(out, _reference(a, b, bias, act, 0.5, -0.75, c)) <= TOL[out_dtype]


_VARIANT_CASES = [(nt, v) for nt, vs in decode.VARIANTS.items() for v in vs]


@pytest.mark.parametrize("nt,variant", _VARIANT_CASES, ids=lambda c: str(c))
@pytest.mark.parametrize("N,K", [(100, 40), (1000, 4104), (300, 1000), (4104, 14336)])
def test_every_variant(nt, variant, N, K):
    """Every variant the benchmark times, at the largest M of its NT and one ragged M, with an epilogue
    (bias + SiLU), ragged N, K not a multiple of any CHUNK (a tail of one 32-k chunk at K = 4104, of four at
    1000: its loads issued in groups, decode::tail_ahead), and a shape that splits K."""
    for M in (8 * nt, 8 * nt - 3 if nt > 1 else 1):
        a, b = _linear(M, N, K, torch.bfloat16)
        bias = torch.randn(N, device="cuda", dtype=torch.bfloat16)
        out = _run(a, b, torch.bfloat16, variant, bias=bias, activation="silu")
        assert rel_error(out, _reference(a, b, bias, "silu")) <= TOL[torch.bfloat16], (M, N, K)


def test_nan_in_the_weight_fails():
    a, b = _linear(4, 256, 512, torch.bfloat16)
    b[7, 3] = float("nan")
    out = _run(a, b, torch.bfloat16)
    assert rel_error(out, _reference(a, b)) == float("inf")


def _split_case():
    """A shape the plan splits across CTAs on this GPU (found, not assumed: the plan depends on SM count)."""
    sm = torch.cuda.get_device_properties(0).multi_processor_count
    for M, N, K in ((16, 1024, 8192), (32, 1024, 8192), (1, 1024, 14336), (8, 256, 28672)):
        if decode.plan(M, N, K, sm).splits > 1:
            return M, N, K
    pytest.skip(f"no split-K shape on {sm} SMs")


def test_split_k_twice_in_a_row():
    """The per-row-block counters must be back at zero after each launch."""
    M, N, K = _split_case()
    a, b = _linear(M, N, K, torch.bfloat16)
    bias = torch.randn(N, device="cuda", dtype=torch.bfloat16)
    first = None
    for _ in range(3):
        out = _run(a, b, torch.bfloat16, bias=bias, activation="silu")
        assert rel_error(out, _reference(a, b, bias, "silu")) <= TOL[torch.bfloat16]
        if first is None:
            first = out.clone()
        assert torch.equal(out, first), "split-K reduction is not deterministic"


def test_split_k_in_a_cuda_graph():
    M, N, K = _split_case()
    a, b = _linear(M, N, K, torch.bfloat16)
    out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    engine.gemm(a, b, out, plan="decode")  # warm-up outside capture (compile, buffers, spare counters)
    noted = set(decode._CAPTURED)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        engine.gemm(a, b, out, plan="decode")
    assert decode._CAPTURED == noted, "the capture stream's counters were allocated in the capture (a memset node)"
    for _ in range(3):
        poison_(out)
        a.copy_(torch.randn_like(a))
        g.replay()
        torch.cuda.synchronize()
        assert rel_error(out, _reference(a, b)) <= TOL[torch.bfloat16]


def test_two_streams_get_their_own_workspace():
    M, N, K = _split_case()
    a, b = _linear(M, N, K, torch.bfloat16)
    outs = [torch.empty(M, N, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
    streams = [torch.cuda.Stream() for _ in range(2)]
    torch.cuda.synchronize()
    for _ in range(5):
        for s, o in zip(streams, outs):
            with torch.cuda.stream(s):
                poison_(o)
                engine.gemm(a, b, o, plan="decode")
        torch.cuda.synchronize()
        for o in outs:
            assert rel_error(o, _reference(a, b)) <= TOL[torch.bfloat16]


def test_matmul_routes_decode_shapes_and_not_others():
    """Through the public op: a shape the router sends to the decode kernel and a layout the decode kernel
    does not take agree with the reference (the second goes to h11 or the engine kernel)."""
    import gemmlab

    a, b = _linear(1, 2048, 2048, torch.bfloat16)
    assert engine.use_decode(a, b) and gemmlab.plan(1, 2048, 2048).kernel == "decode"
    assert rel_error(gemmlab.matmul(a, b), _reference(a, b)) <= TOL[torch.bfloat16]
    bn = b.contiguous()  # (K, N) row-major: not K-contiguous, so h11
    assert not engine.use_decode(a, bn)
    assert rel_error(gemmlab.matmul(a, bn), _reference(a, bn)) <= TOL[torch.bfloat16]


# Rows at any address (the unaligned variants) ------------------------------------------------------------

def _unaligned_linear(M, N, K, dtype, a_off, w_off, pad):
    """x (M, K) and b = w.t() whose rows start at any element: each a view at an element offset into a
    NaN-filled buffer, the weight's rows ``pad`` elements longer than K. The padding and the elements past
    the last rows stay NaN, so a byte the kernel reads but does not mask off shows up in the result."""
    def rows(r, ld, off):
        buf = torch.full((r * ld + off + 16,), float("nan"), device="cuda", dtype=dtype)
        view = buf[off:off + r * ld].view(r, ld)[:, :K]
        view.copy_(torch.randn(r, K, device="cuda", dtype=dtype))
        return view
    return rows(M, K, a_off), rows(N, K + pad, w_off).t()


_UNALIGNED_SHAPES = [(M, N, K) for M, N, K in itertools.product((1, 3, 8, 16, 17, 32), (1, 100, 1000, 4097),
                                                                 (1, 7, 129, 1025, 4093, 8191))]


@pytest.mark.parametrize("M,N,K", _UNALIGNED_SHAPES)
def test_unaligned_shapes(M, N, K):
    """Any K, bases at any element, ragged weight rows: read in place (no copy) and exact to the tolerance."""
    a, b = _unaligned_linear(M, N, K, torch.bfloat16, a_off=(M + K) % 8, w_off=(N + K) % 7 or 1, pad=K % 3)
    assert engine.use_decode(a, b) and not decode.aligned(a, b)
    out = poison_(torch.empty(M, N, device="cuda", dtype=torch.bfloat16))
    engine.gemm(a, b, out, plan="decode")
    torch.cuda.synchronize()
    assert rel_error(out, _reference(a, b)) <= TOL[torch.bfloat16], (M, N, K)


_UNALIGNED_VARIANT_CASES = [(nt, v) for nt, vs in decode.UNALIGNED_TRIALS.items()
                            for v in (decode.UNALIGNED_VARIANTS[nt], *vs)]


@pytest.mark.parametrize("nt,variant", _UNALIGNED_VARIANT_CASES, ids=lambda c: str(c))
@pytest.mark.parametrize("N,K", [(100, 41), (1000, 4101), (4097, 14335)])
def test_every_unaligned_variant(nt, variant, N, K):
    """Every unaligned variant the benchmark times, at the largest M of its NT and one ragged M, with bases
    and rows off 16 bytes (NaN around them), an epilogue (bias + SiLU), and a K that splits."""
    for M in (8 * nt, 8 * nt - 3 if nt > 1 else 1):
        a, b = _unaligned_linear(M, N, K, torch.bfloat16, a_off=M % 8 or 3, w_off=5, pad=K % 3 + 1)
        bias = torch.randn(N, device="cuda", dtype=torch.bfloat16)
        out = _run(a, b, torch.bfloat16, variant, bias=bias, activation="silu")
        assert rel_error(out, _reference(a, b, bias, "silu")) <= TOL[torch.bfloat16], (M, N, K)


@pytest.mark.parametrize("act", [None, "gelu", "silu"])
@pytest.mark.parametrize("dtype,out_dtype", [(torch.bfloat16, torch.float32), (torch.float16, torch.float16)])
@pytest.mark.parametrize("M,N,K", [(5, 1000, 4095), (32, 257, 1029)])
def test_unaligned_epilogue(M, N, K, dtype, out_dtype, act):
    a, b = _unaligned_linear(M, N, K, dtype, a_off=3, w_off=5, pad=1)
    bias = torch.randn(N, device="cuda", dtype=dtype if act != "gelu" else torch.float32)
    c = torch.randn(N, M, device="cuda", dtype=out_dtype).t()
    out = poison_(torch.empty(M, N, device="cuda", dtype=out_dtype))
    engine.gemm(a, b, out, plan="decode", bias=bias, activation=act, alpha=0.5, beta=-0.75, c=c)
    torch.cuda.synchronize()
    assert rel_error(out, _reference(a, b, bias, act, 0.5, -0.75, c)) <= TOL[out_dtype]


def test_unaligned_split_k_repeats_bitwise_and_replays_in_a_graph():
    sm = torch.cuda.get_device_properties(0).multi_processor_count
    shape = next(((M, N, K) for M, N, K in ((16, 1024, 8191), (1, 1024, 14335), (8, 256, 28671), (32, 512, 8191))
                  if decode.plan(M, N, K, sm, decode.default_variant(decode.token_tiles(M), False)).splits > 1), None)
    if shape is None:
        pytest.skip(f"no unaligned split-K shape on {sm} SMs")
    M, N, K = shape
    a, b = _unaligned_linear(M, N, K, torch.bfloat16, a_off=1, w_off=3, pad=0)
    out = poison_(torch.empty(M, N, device="cuda", dtype=torch.bfloat16))
    engine.gemm(a, b, out, plan="decode")
    torch.cuda.synchronize()
    first = out.clone()
    assert rel_error(first, _reference(a, b)) <= TOL[torch.bfloat16]
    for _ in range(3):
        poison_(out)
        engine.gemm(a, b, out, plan="decode")
        torch.cuda.synchronize()
        assert torch.equal(out, first), "split-K reduction is not deterministic"
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        engine.gemm(a, b, out, plan="decode")
    a.copy_(torch.randn_like(a))
    poison_(out)
    g.replay()
    torch.cuda.synchronize()
    assert rel_error(out, _reference(a, b)) <= TOL[torch.bfloat16]


def test_matmul_reads_unaligned_weights_in_place():
    """Through the public op: at M = 1 and K odd the router runs the decode kernel (the engine kernel would
    copy the 8 MB weight every call); a NaN in the weight's last element reaches the output (it is read)."""
    import gemmlab

    a, b = _linear(1, 4097, 1025, torch.bfloat16)
    assert gemmlab.plan(1, 4097, 1025).kernel == "decode"
    assert rel_error(gemmlab.matmul(a, b), _reference(a, b)) <= TOL[torch.bfloat16]
    b[1024, 4096] = float("nan")
    assert torch.isnan(gemmlab.matmul(a, b)[0, 4096]) and not torch.isnan(gemmlab.matmul(a, b)[0, :4096]).any()
