"""The randomized differential suite on the GPU (issue 15; the machinery is tests/fuzzing.py, checked on
the CPU by tests/test_fuzzing.py).

Every GPU run: the regression calls, the fixed-seed part (``fuzzing.FIXED_CASES`` calls of seed
``fuzzing.FIXED_SEED``, about a minute on an H200, most of it compiling kernel variants), two calls at
once on two streams, CUDA graphs replayed with new input values, ``torch.compile(fullgraph=True)``, and
bad inputs. The soak (``-m slow``) runs for ``GEMMLAB_FUZZ_SECONDS`` on a new seed with the full palette.

    python -m pytest -q tests/test_fuzz_gpu.py                       # fixed part
    GEMMLAB_FUZZ_SECONDS=300 GEMMLAB_FUZZ_RECORD=benchmarks/results/fuzz.jsonl \\
        python -m pytest -q -s -m slow tests/test_fuzz_gpu.py -k soak  # soak, one JSON line of record

A failure prints the seed and the case; ``GEMMLAB_FUZZ_SEED`` and ``GEMMLAB_FUZZ_CASE`` run it again.
``GEMMLAB_FUZZ_CASES`` changes the size of the fixed part.
"""

from __future__ import annotations

import dataclasses
import os
import time
import types

import pytest
import torch

import fuzzing
from fuzzing import Case, Layout

pytestmark = pytest.mark.hopper


def _env_int(name: str) -> int | None:
    v = os.environ.get(name, "").strip()
    return int(v) if v else None


SEED = _env_int("GEMMLAB_FUZZ_SEED")
CASE = _env_int("GEMMLAB_FUZZ_CASE")


@pytest.fixture(scope="module")
def gpu():
    from gemmlab import engine

    dev = torch.device("cuda", torch.cuda.current_device())
    try:
        capacity = engine.cluster_capacity(dev)
    except Exception:  # noqa: BLE001 - classification falls back to the H200 table
        capacity = None
    return types.SimpleNamespace(device=dev, sm=torch.cuda.get_device_properties(dev).multi_processor_count,
                                 capacity=capacity, streams=[torch.cuda.Stream(dev) for _ in range(2)])


def _compiled_kernels() -> int:
    from gemmlab.jit import compiler

    return len(getattr(compiler, "_MEMORY", {}))


def _finish(tally: fuzzing.Tally, started: float, kernels_before: int, gpu) -> None:
    """Print the summary, append the record where GEMMLAB_FUZZ_RECORD says, fail with every failure."""
    record = tally.record(duration_s=round(time.monotonic() - started, 1), gpu=torch.cuda.get_device_name(),
                          sm_count=gpu.sm, torch=torch.__version__,
                          kernels_compiled=_compiled_kernels() - kernels_before)
    path = os.environ.get("GEMMLAB_FUZZ_RECORD")
    if path:
        fuzzing.write_record(path, record)
    print(f"\nfuzz {tally.mode}: seed {tally.seed}, {tally.cases} cases in {record['duration_s']} s, "
          f"{record['kernels_compiled']} kernels compiled, routes {record['routes']}, "
          f"worst error / cuBLAS's {tally.worst_ratio:.2f}")
    assert not tally.failures and not tally.lost_context, tally.report()


def test_fuzz_regressions(gpu):
    tally = fuzzing.Tally(seed=fuzzing.FIXED_SEED, mode="fixed")
    fuzzing.run_families([fuzzing.regressions()], gpu.device, tally, streams=gpu.streams, sm_count=gpu.sm,
                         capacity=gpu.capacity)
    assert not tally.failures, tally.report()


def test_fuzz_fixed_seed(gpu):
    """The part that runs in every GPU run: the same calls each time (unless GEMMLAB_FUZZ_SEED says
    otherwise), each route several times, each checked as tests/fuzzing.py describes."""
    seed = SEED if SEED is not None else fuzzing.FIXED_SEED
    families = fuzzing.selected(fuzzing.take(seed, _env_int("GEMMLAB_FUZZ_CASES") or fuzzing.FIXED_CASES), CASE)
    tally = fuzzing.Tally(seed=seed, mode="fixed")
    started, kernels = time.monotonic(), _compiled_kernels()
    fuzzing.run_families(families, gpu.device, tally, streams=gpu.streams, sm_count=gpu.sm, capacity=gpu.capacity)
    if CASE is None and seed == fuzzing.FIXED_SEED and not _env_int("GEMMLAB_FUZZ_CASES"):
        missing = {"decode", "h11", "engine", "engine-splitk", "+copy", "+direct", "fp32"} - \
            fuzzing.route_tags(tally.routes)
        assert not missing, f"the fixed part no longer reaches {missing}: {tally.routes}"
    _finish(tally, started, kernels, gpu)


def test_fuzz_two_streams_at_once(gpu):
    """Pairs of calls (different shapes, routes and dtypes) in flight together, one per stream."""
    seed = SEED if SEED is not None else fuzzing.FIXED_SEED + 1
    cases = [fam[0] for fam in fuzzing.take(seed, 60)]
    cases = [dataclasses.replace(c, alias=False) for c in cases if c.M * c.N * c.K <= 2**33]
    pairs = list(zip(cases[0::2], cases[1::2]))[:16]
    if CASE is not None:
        pairs = [p for p in pairs if CASE in (p[0].index, p[1].index)]
    tally = fuzzing.Tally(seed=seed, mode="pairs")
    started, kernels = time.monotonic(), _compiled_kernels()
    fuzzing.run_pairs(pairs, gpu.device, tally, streams=gpu.streams, sm_count=gpu.sm, capacity=gpu.capacity)
    _finish(tally, started, kernels, gpu)


# CUDA graphs and torch.compile ------------------------------------------------------------------------

def _one_per_target(seed: int, targets: tuple[str, ...]) -> list[Case]:
    """The first case aimed at each target (alone on the current stream, of moderate size)."""
    found: dict[str, Case] = {}
    for fam in fuzzing.take(seed, 3000):
        c = fam[0]
        if c.target in targets and c.target not in found and 0 < c.M * c.N * c.K <= 2**32:
            found[c.target] = dataclasses.replace(c, stream=0, alias=False)
    return [found[t] for t in targets]


def _refill(t: fuzzing.Tensors, case: Case, gen: torch.Generator) -> None:
    """New random values into the inputs' views (same buffers, so the same addresses); the output view
    poisoned again."""
    for name in ("a", "b", "bias", "c"):
        view = t.views.get(name)
        if view is not None:
            view.copy_(torch.randn(view.shape, generator=gen, device=view.device).to(view.dtype))
    if case.out is not None and not case.out_is_c:
        t.views["out"].fill_(float("nan"))


def test_fuzz_cuda_graphs_replay_new_values(gpu):
    """Each route captured in a CUDA graph after one eager warm-up, then replayed twice with new values
    written into the same input tensors: every replay is checked like an eager call (sentinels, inputs,
    values), so nothing captured may depend on the values at capture time."""
    seed = SEED if SEED is not None else fuzzing.FIXED_SEED + 2
    targets = ("decode", "decode-splitk", "h11", "h11-splitk", "h11-copy", "fp32", "tiny")
    tally = fuzzing.Tally(seed=seed, mode="graphs")
    started, kernels = time.monotonic(), _compiled_kernels()
    gen = torch.Generator(device=gpu.device).manual_seed(seed)
    for case in _one_per_target(seed, targets):
        p = fuzzing.prepare(case, gpu.device, seed, None, gpu.sm, gpu.capacity)
        name, args, kw = fuzzing.call_args(case, p.t)
        side = gpu.streams[0]
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up: compiles, descriptors, split-K buffers
            fuzzing.gemmlab_call(name, args, kw)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = fuzzing.gemmlab_call(name, args, kw)
        for _ in range(2):
            _refill(p.t, case, gen)
            snapshot = {k: v.clone() for k, v in p.t.buffers.items()}
            c_before = p.t.c.clone() if p.t.c is not None else None
            graph.replay()
            torch.cuda.synchronize()
            tally.add([fuzzing.check(fuzzing.Prepared(case, p.t, p.route, snapshot, c_before, result=y))])
    assert tally.cases == 2 * len(targets)
    _finish(tally, started, kernels, gpu)


def test_decode_split_k_graph_replayed_without_the_graph_that_allocated_its_buffers(gpu):
    """Graphs captured on one stream share the decode kernel's split-K counters, which are allocated,
    and zeroed, inside the first capture: that zeroing runs only when the first graph replays. A later
    graph replayed on its own (what a server replaying one graph per batch size does) must still get the
    right answer. To make "never zeroed" visible, the first capture's allocations land in memory a
    previous graph filled with 7s (graphs that share a pool reuse each other's freed blocks)."""
    from gemmlab import decode, engine
    from gemmlab.bench import rel_error

    M, N, K = 16, 256, 8192
    if decode.plan(M, N, K, gpu.sm).splits < 2:
        pytest.skip(f"{M}x{N}x{K} does not split on {gpu.sm} SMs")
    dev = gpu.device
    w = torch.randn(N, K, device=dev, dtype=torch.bfloat16)
    xs = [torch.randn(M, K, device=dev, dtype=torch.bfloat16) for _ in range(2)]
    outs = [torch.empty(M, N, device=dev, dtype=torch.bfloat16) for _ in range(2)]
    assert engine.use_decode(xs[0], w.t(), outs[0])
    engine.gemm(xs[0], w.t(), outs[0], plan="decode")  # compiled and loaded outside capture
    torch.cuda.synchronize()
    stream, pool = torch.cuda.Stream(dev), torch.cuda.graph_pool_handle()
    dirty = torch.cuda.CUDAGraph()
    with torch.cuda.graph(dirty, pool=pool, stream=stream):
        junk = torch.empty(2**17, device=dev, dtype=torch.int32)
        junk.fill_(7)
        del junk
    dirty.replay()
    torch.cuda.synchronize()
    graphs = [torch.cuda.CUDAGraph() for _ in range(2)]
    for g, x, out in zip(graphs, xs, outs):
        with torch.cuda.graph(g, pool=pool, stream=stream):
            engine.gemm(x, w.t(), out, plan="decode")
    outs[1].fill_(float("nan"))
    graphs[1].replay()
    torch.cuda.synchronize()
    assert rel_error(outs[1], xs[1].double() @ w.double().t()) <= 1e-2, \
        "a graph captured after the one that allocated the split-K counters ran with counters never zeroed"


def _compile_case(index: int, M: int, N: int, K: int, a: Layout, b: Layout, dtype: str = "bf16") -> Case:
    return Case(index=index, family=index, target="compile", M=M, N=N, K=K, dtype=dtype, out_dtype="fp32",
                a=a, b=b, bias="in", activation="silu", alpha=0.5, beta=-1.0, c=Layout(), pass_out_dtype=True)


def test_fuzz_torch_compile_fullgraph(gpu):
    """One compiled function (fullgraph, dynamic shapes) over a decode shape, an h11 shape, an unaligned
    column-major one, a split-K one and an fp16 one: the op's output is checked like an eager call and the
    ops traced around it agree with eager on it."""
    import gemmlab

    def block(a, b, bias, c):
        y = gemmlab.matmul(a, b, bias=bias, activation="silu", alpha=0.5, beta=-1.0, c=c, out_dtype=torch.float32)
        return y, y * 2 + 1

    compiled = torch.compile(block, fullgraph=True, dynamic=True)
    cases = [_compile_case(0, 5, 1000, 1024, Layout("row", 0, 16), Layout("col", 0, 16)),
             _compile_case(1, 300, 520, 256, Layout("row", 0, 16), Layout("row", 8, 32)),
             _compile_case(2, 33, 77, 65, Layout("col", 3, 21), Layout("row", 1, 16)),
             _compile_case(3, 64, 256, 4096, Layout("row", 0, 16), Layout("row", 0, 16)),
             _compile_case(4, 48, 136, 520, Layout("row", 0, 16), Layout("col", 0, 16), dtype="fp16")]
    tally = fuzzing.Tally(seed=0, mode="compile")
    started, kernels = time.monotonic(), _compiled_kernels()
    for case in cases:
        p = fuzzing.prepare(case, gpu.device, 20261215, None, gpu.sm, gpu.capacity)
        y, z = compiled(p.t.a, p.t.b, p.t.bias, p.t.c)
        torch.cuda.synchronize()
        tally.add([fuzzing.check(dataclasses.replace(p, result=y))])
        assert torch.allclose(z, y * 2 + 1, rtol=1e-6, atol=1e-6)

    lin = torch.compile(lambda x, w, bias: gemmlab.linear(x, w, bias, activation="gelu_tanh"), fullgraph=True)
    case = dataclasses.replace(fuzzing.regressions()[0], index=5, M=24, N=200, K=96, lead=(2, 12),
                               activation="gelu_tanh")
    p = fuzzing.prepare(case, gpu.device, 20261215, None, gpu.sm, gpu.capacity)
    y = lin(p.t.a.unflatten(0, case.lead), p.t.b.t(), p.t.bias)
    torch.cuda.synchronize()
    tally.add([fuzzing.check(dataclasses.replace(p, result=y))])
    _finish(tally, started, kernels, gpu)


# Bad inputs --------------------------------------------------------------------------------------------

def test_fuzz_bad_inputs_raise_documented_errors(gpu):
    """Each wrong call raises the error gemmlab.ops documents (type and message), and a valid call right
    after still works: an error leaves no state behind."""
    import gemmlab
    from gemmlab.errors import UnsupportedProblem

    dev = gpu.device
    bf, M, N, K = torch.bfloat16, 8, 24, 16
    a = torch.randn(M, K, device=dev, dtype=bf)
    b = torch.randn(K, N, device=dev, dtype=bf)
    w = torch.randn(N, K, device=dev, dtype=bf)
    x = torch.randn(M, 40, device=dev, dtype=bf)
    bad = [
        ("inner dimensions", lambda: gemmlab.matmul(a, b.t()), UnsupportedProblem, "inner dimensions"),
        ("mixed dtypes", lambda: gemmlab.matmul(a, b.half()), TypeError, "one dtype"),
        ("integer inputs", lambda: gemmlab.matmul(a.int(), b.int()), TypeError, "dtype"),
        ("3-D a", lambda: gemmlab.matmul(a[None], b), UnsupportedProblem, "2-D"),
        ("non-tensor", lambda: gemmlab.matmul([[1.0]], b), TypeError, "torch.Tensor"),
        ("sparse a", lambda: gemmlab.matmul(a.float().to_sparse(), b.float()), UnsupportedProblem, "strided"),
        ("bias shape", lambda: gemmlab.matmul(a, b, bias=torch.randn(N - 1, device=dev, dtype=bf)),
         UnsupportedProblem, "bias"),
        ("bias dtype", lambda: gemmlab.matmul(a, b, bias=torch.randn(N, device=dev, dtype=torch.float16)),
         TypeError, "bias"),
        ("c without beta", lambda: gemmlab.matmul(a, b, c=torch.randn(M, N, device=dev, dtype=bf)),
         UnsupportedProblem, "beta"),
        ("beta without c", lambda: gemmlab.matmul(a, b, beta=1.0), UnsupportedProblem, "needs c"),
        ("c dtype", lambda: gemmlab.matmul(a, b, c=torch.randn(M, N, device=dev), beta=1.0), TypeError, "c must"),
        ("c shape", lambda: gemmlab.matmul(a, b, c=torch.randn(M, 1, device=dev, dtype=bf), beta=1.0),
         UnsupportedProblem, "c must have shape"),
        ("out shape", lambda: gemmlab.matmul(a, b, out=torch.empty(M, N + 1, device=dev, dtype=bf)),
         UnsupportedProblem, "out must have shape"),
        ("out dtype", lambda: gemmlab.matmul(a, b, out=torch.empty(M, N, device=dev, dtype=torch.float16),
                                             out_dtype=torch.float32), TypeError, "out has dtype"),
        ("out_dtype", lambda: gemmlab.matmul(a, b, out_dtype=torch.int8), TypeError, "out_dtype"),
        ("activation", lambda: gemmlab.matmul(a, b, activation="tanh"), UnsupportedProblem, "activation"),
        ("activation type", lambda: gemmlab.matmul(a, b, activation=1), TypeError, "activation"),
        ("tensor alpha", lambda: gemmlab.matmul(a, b, alpha=torch.tensor(2.0)), TypeError, "alpha"),
        ("mixed devices", lambda: gemmlab.matmul(a, b.cpu()), UnsupportedProblem, "one device"),
        ("cpu tensors", lambda: gemmlab.matmul(a.cpu(), b.cpu()), UnsupportedProblem, "CUDA tensors"),
        ("out overlaps a", lambda: gemmlab.matmul(x[:, :K], b, out=x[:, K:K + N]), UnsupportedProblem, "overlaps"),
        ("linear features", lambda: gemmlab.linear(a, torch.randn(N, K + 1, device=dev, dtype=bf)),
         UnsupportedProblem, "features"),
        ("linear scalar", lambda: gemmlab.linear(torch.tensor(1.0, device=dev), w), UnsupportedProblem, "scalar"),
        ("linear 3-D weight", lambda: gemmlab.linear(a, w[None]), UnsupportedProblem, "2-D"),
    ]
    x_before = x.clone()
    wrong = []
    for what, call, exc, fragment in bad:
        try:
            call()
            wrong.append(f"{what}: no error")
        except exc as e:
            if fragment.lower() not in str(e).lower():
                wrong.append(f"{what}: {type(e).__name__} without {fragment!r}: {e}")
        except Exception as e:  # noqa: BLE001 - the wrong type is the finding
            wrong.append(f"{what}: {type(e).__name__} instead of {exc.__name__}: {e}")
    assert not wrong, "\n".join(wrong)
    y = gemmlab.matmul(a, b, bias=torch.randn(N, device=dev, dtype=bf), activation="relu")
    torch.cuda.synchronize()
    assert y.shape == (M, N) and torch.isfinite(y.float()).all()
    assert torch.equal(x, x_before)  # the refused out= call wrote nothing


def test_out_overlapping_itself_is_refused_up_front(gpu):
    import gemmlab
    from gemmlab.errors import UnsupportedProblem

    a = torch.randn(8, 16, device=gpu.device, dtype=torch.bfloat16)
    b = torch.randn(16, 24, device=gpu.device, dtype=torch.bfloat16)
    c = torch.randn(1, 24, device=gpu.device, dtype=torch.bfloat16).expand(8, 24)
    with pytest.raises(UnsupportedProblem, match="overlap"):
        gemmlab.matmul(a, b, c=c, beta=1.0, out=c)
    with pytest.raises(UnsupportedProblem, match="overlap"):
        gemmlab.matmul(a, b, out=torch.empty(1, 24, device=gpu.device, dtype=torch.bfloat16).expand(8, 24))


# The soak ------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_fuzz_soak(gpu):
    """GEMMLAB_FUZZ_SECONDS of new cases (full palette: every activation and dtype pair, shapes to
    16384), with a pair of calls on two streams after every eight families; a new seed each run unless
    GEMMLAB_FUZZ_SEED is set. Writes its record to GEMMLAB_FUZZ_RECORD."""
    seconds = float(os.environ.get("GEMMLAB_FUZZ_SECONDS") or 0)
    if seconds <= 0:
        pytest.skip("set GEMMLAB_FUZZ_SECONDS to soak")
    seed = SEED if SEED is not None else int(time.time()) % 2**31
    print(f"\nfuzz soak: seed {seed} (GEMMLAB_FUZZ_SEED={seed} repeats it)")
    tally = fuzzing.Tally(seed=seed, mode="soak")
    started, kernels = time.monotonic(), _compiled_kernels()
    deadline = started + seconds
    if CASE is not None:
        families = fuzzing.selected(fuzzing.take(seed, CASE + 1, quick=False), CASE)
        fuzzing.run_families(families, gpu.device, tally, streams=gpu.streams, sm_count=gpu.sm,
                             capacity=gpu.capacity)
        _finish(tally, started, kernels, gpu)
        return
    gen = fuzzing.Generator(seed, quick=False).families()
    while time.monotonic() < deadline and not tally.lost_context:
        batch = [next(gen) for _ in range(8)]
        fuzzing.run_families(batch, gpu.device, tally, streams=gpu.streams, sm_count=gpu.sm, capacity=gpu.capacity,
                             keep_going=lambda: time.monotonic() < deadline)
        pair = [dataclasses.replace(next(gen)[0], alias=False) for _ in range(2)]
        if not tally.lost_context and time.monotonic() < deadline:
            fuzzing.run_pairs([pair], gpu.device, tally, streams=gpu.streams, sm_count=gpu.sm, capacity=gpu.capacity)
    _finish(tally, started, kernels, gpu)
