"""The Hopper engine (h11) on the GPU: every operand layout, unaligned sizes, dtypes and epilogues
against a float64 reference, on fresh random inputs with a poisoned output."""

import pytest
import torch
import torch.nn.functional as F

from gemmlab.bench import poison_, rel_error

pytestmark = pytest.mark.hopper

TOL = {torch.bfloat16: 1e-2, torch.float16: 5e-3, torch.float32: 5e-3}


def _operands(M, N, K, dtype, layout):
    """A (M,K) and B (K,N) in the layout named by two letters: N = K contiguous for A / N contiguous for B
    ("row-major"), T = the other way round."""
    a = torch.randn(M, K, device="cuda", dtype=dtype) if layout[0] == "N" else \
        torch.randn(K, M, device="cuda", dtype=dtype).t()
    b = torch.randn(K, N, device="cuda", dtype=dtype) if layout[1] == "N" else \
        torch.randn(N, K, device="cuda", dtype=dtype).t()
    return a, b


def _reference(a, b, bias=None, act=None, alpha=1.0, beta=0.0, c=None):
    ref = alpha * (a.double() @ b.double())
    if c is not None and beta != 0.0:
        ref = ref + beta * c.double()
    if bias is not None:
        ref = ref + bias.double()
    return {None: lambda x: x, "relu": F.relu, "gelu": F.gelu, "silu": F.silu,
            "gelu_tanh": lambda x: F.gelu(x, approximate="tanh")}[act](ref)


@pytest.mark.parametrize("layout", ["NN", "NT", "TN", "TT"])
@pytest.mark.parametrize("shape", [(256, 512, 192), (1000, 1001, 999), (17, 33, 65), (1, 1, 1), (4096, 4096, 4095)])
def test_layouts_and_ragged_shapes(layout, shape):
    from gemmlab import engine

    M, N, K = shape
    a, b = _operands(M, N, K, torch.bfloat16, layout)
    out = poison_(torch.empty(M, N, device="cuda", dtype=torch.bfloat16))
    engine.gemm(a, b, out)
    torch.cuda.synchronize()
    assert rel_error(out, _reference(a, b)) <= TOL[torch.bfloat16]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("out_dtype", [None, torch.float32])
@pytest.mark.parametrize("act", [None, "relu", "gelu", "gelu_tanh", "silu"])
def test_epilogue(dtype, out_dtype, act):
    from gemmlab import engine

    M, N, K = 384, 520, 256
    a, b = _operands(M, N, K, dtype, "NT")
    od = out_dtype or dtype
    bias = torch.randn(N, device="cuda", dtype=dtype)
    c = torch.randn(N, M, device="cuda", dtype=od).t()  # strided C
    out = poison_(torch.empty(M, N, device="cuda", dtype=od))
    engine.gemm(a, b, out, bias=bias, activation=act, alpha=0.5, beta=-0.75, c=c)
    torch.cuda.synchronize()
    ref = _reference(a, b, bias, act, 0.5, -0.75, c)
    assert rel_error(out, ref) <= TOL[od]


def test_unaligned_output_and_fp32_bias():
    from gemmlab import engine

    M, N, K = 300, 301, 302  # N*2 bytes is not a multiple of 16: the output goes through a copy
    a, b = _operands(M, N, K, torch.bfloat16, "NN")
    bias = torch.randn(N, device="cuda", dtype=torch.float32)
    out = poison_(torch.empty(M, N, device="cuda", dtype=torch.bfloat16))
    engine.gemm(a, b, out, bias=bias)
    torch.cuda.synchronize()
    assert rel_error(out, _reference(a, b, bias)) <= TOL[torch.bfloat16]


@pytest.mark.parametrize("shape", [(1, 4096, 4096), (16, 4096, 4096), (128, 1024, 8192), (77, 3000, 2000)])
def test_split_k_decode_shapes(shape):
    """Few tiles and long K: the engine splits K, a tile's splits one cluster reducing through
    distributed shared memory; three launches in a row stay right."""
    from gemmlab import engine

    M, N, K = shape
    sm = torch.cuda.get_device_properties(0).multi_processor_count
    assert engine.choose_plan(M, N, K, sm, engine.cluster_capacity(torch.device("cuda")))[1] > 1
    a, b = _operands(M, N, K, torch.bfloat16, "NT")
    bias = torch.randn(N, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        out = poison_(torch.empty(M, N, device="cuda", dtype=torch.bfloat16))
        engine.gemm(a, b, out, bias=bias, activation="silu")
        torch.cuda.synchronize()
        assert rel_error(out, _reference(a, b, bias, "silu")) <= TOL[torch.bfloat16]


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("plan", [(128, 3), (64, 2), (192, 5), (256, 8), (64, 1)])
def test_split_k_ragged_clusters_with_epilogue_in_place(monkeypatch, out_dtype, plan):
    """Split-K through clusters of 2, 3, 5 and 8 (29 k-steps of a ragged K: e.g. ranges of 10, 10, 9; the
    128 rows shared 43, 43, 42), tile widths 64 to 256, M = 40 (the second consumer idles and only a
    40-row box of A is loaded), a ragged N (the last columns go one by one), and beta * C read from the
    output itself. (256, 8) makes 16 clusters, more than an H200 holds at once: a second wave."""
    from gemmlab import engine

    M, N, K = 40, 3998, 1800
    monkeypatch.setattr(engine, "choose_plan", lambda *args: plan)
    a, b = _operands(M, N, K, torch.bfloat16, "NT")
    assert not engine.use_decode(a, b)  # M > decode.MAX_M: h11
    bias = torch.randn(N, device="cuda", dtype=torch.float32)
    c = torch.randn(M, N, device="cuda", dtype=out_dtype)
    out = c.clone()
    engine.gemm(a, b, out, bias=bias, activation="gelu_tanh", alpha=0.5, beta=-1.0, c=out)
    torch.cuda.synchronize()
    assert rel_error(out, _reference(a, b, bias, "gelu_tanh", 0.5, -1.0, c)) <= TOL[out_dtype]


@pytest.mark.parametrize("M", [13, 150])
@pytest.mark.parametrize("plan", [(128, 1), (64, 3), (256, 2)])
@pytest.mark.parametrize("aligned_out", [True, False])
def test_short_a_boxes_leave_rows_past_m_alone(M, plan, aligned_out):
    """Tiles whose rows past M + 64 lie outside A load only the rows left, rounded up to 8 (M = 13: 16
    rows; M = 150: the last tile's 22 rows, 24), so the MMAs make garbage in rows past M. Those rows must
    never reach memory: the output is a view into a poisoned buffer with 8 spare rows below it (and a
    row stride that is not 16-byte aligned for the DIRECT stores), the epilogue reads C and a bias."""
    from gemmlab import engine

    N, K = 1000, 2000
    assert engine.a_rows_loaded(M, False) == {13: 16, 150: 24}[M]
    a, b = _operands(M, N, K, torch.bfloat16, "NT")
    ld = N if aligned_out else N + 3
    buf = poison_(torch.empty((M + 8) * ld, device="cuda", dtype=torch.bfloat16))
    out = buf[:M * ld].view(M, ld)[:, :N]
    c = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    out.copy_(c)
    bias = torch.randn(N, device="cuda", dtype=torch.bfloat16)
    engine.gemm(a, b, out, bias=bias, activation="relu", beta=0.5, c=out, plan=plan)
    torch.cuda.synchronize()
    assert rel_error(out, _reference(a, b, bias, "relu", 1.0, 0.5, c)) <= TOL[torch.bfloat16]
    spare = buf[M * ld:]
    assert torch.isnan(spare.float()).all(), "rows past M were written"


def test_cluster_capacity_is_queried_from_the_gpu():
    from gemmlab import engine

    cap = engine.cluster_capacity(torch.device("cuda"))
    sm = torch.cuda.get_device_properties(0).multi_processor_count
    assert cap[1] == sm  # one CTA per SM
    assert all(0 < cap[s] * s <= sm for s in range(1, engine.MAX_CLUSTER + 1))


def test_the_gpus_memory_peak_decides_stream_k_as_the_records_say():
    """The driver's memory clock and bus width give the peak ``devices.stream_k_offered`` reads: an H200's is
    near the profile's 4.92 TB/s (boards report 3134-3201 MHz memory clocks: 4.81-4.92 TB/s; stream-K offered),
    an H100's 3.35 TB/s (not offered), and the route of a stream-K shape follows it."""
    from gemmlab import devices, engine
    from gemmlab.gpu import gpu_info

    info = gpu_info()
    peak = info.hbm_peak_bytes_per_s
    assert peak is not None and 1e12 < peak < 2e13
    if "H200" in info.name:
        assert abs(peak / devices.H200.hbm_peak_bytes_per_s - 1) < 0.05 and devices.stream_k_offered(peak)
    if "H100" in info.name:
        assert not devices.stream_k_offered(peak)
    a = torch.empty(8192, 28672, device="meta", dtype=torch.bfloat16)  # route reads metadata only
    b = torch.empty(8192, 28672, device="meta", dtype=torch.bfloat16).t()
    out = torch.empty(8192, 8192, device="meta", dtype=torch.bfloat16)
    gpu = torch.device("cuda")
    r = engine.route(a, b, out, bias=None, activation=None, has_c=False, sm_count=lambda: engine._sm_count(gpu),
                     memory_peak=lambda: engine._memory_peak(gpu))
    if not devices.stream_k_offered(peak):
        assert r.plan.schedule != "stream_k"
    elif info.sm_count == 132:  # the H200's pick (bb0d0cc's broad records)
        assert r.plan.schedule == "stream_k"


def test_split_k_in_a_cuda_graph():
    from gemmlab import engine

    M, N, K = 16, 4096, 4096
    a, b = _operands(M, N, K, torch.bfloat16, "NT")
    out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    engine.gemm(a, b, out)  # warm-up outside capture (compile, descriptors, buffers)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        engine.gemm(a, b, out)
    for _ in range(3):
        poison_(out)
        a.copy_(torch.randn_like(a))
        g.replay()
        torch.cuda.synchronize()
        assert rel_error(out, _reference(a, b)) <= TOL[torch.bfloat16]


@pytest.mark.parametrize("shape", [(33, 257, 129), (300, 1001, 777)])
def test_operand_copies_follow_the_kernel_that_writes_them(shape):
    """Both operands unaligned: one PDL launch copies both (``pad_copy_operands``), and it must wait for the
    GEMM before it, which writes its A. A chain of three calls, each reading the last one's output (odd
    widths: every call copies), eager and replayed from a CUDA graph with new inputs."""
    import gemmlab

    M, N, K = shape
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    ws = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K**0.5,
          torch.randn(K, N, device="cuda", dtype=torch.bfloat16) / N**0.5]

    def chain(x):
        y = gemmlab.matmul(x, ws[0].t())  # (M, N)
        z = gemmlab.matmul(y, ws[1].t())  # (M, K)
        return gemmlab.matmul(z, ws[0].t())

    def reference(x):
        w0, w1 = ws[0].double(), ws[1].double()
        return ((x.double() @ w0.t()).to(torch.bfloat16).double() @ w1.t()).to(torch.bfloat16).double() @ w0.t()

    out = chain(x)
    torch.cuda.synchronize()
    assert rel_error(out, reference(x)) <= 2 * TOL[torch.bfloat16]
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = chain(x)
    for _ in range(3):
        poison_(out)
        x.copy_(torch.randn_like(x))
        g.replay()
        torch.cuda.synchronize()
        assert rel_error(out, reference(x)) <= 2 * TOL[torch.bfloat16]


def test_copied_calls_share_the_copy_space_safely():
    """Calls whose operands are copied reuse one copy space per (device, stream, thread)
    (``engine.copy_space``): shapes in an order that makes the space grow between calls and then go back
    to a smaller one, and two threads running such calls at once, on one stream and on two, with fresh
    inputs every call; every result against float64, none poisoned output left behind."""
    import threading

    import gemmlab
    from gemmlab import engine

    shapes = [(33, 257, 129), (300, 1001, 777), (1, 4097, 1025), (65, 2049, 1025), (33, 257, 129)]

    def calls(rounds, results):
        for _ in range(rounds):
            for M, N, K in shapes:
                a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
                w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K**0.5
                out = poison_(torch.empty(M, N, device="cuda", dtype=torch.bfloat16))
                results.append((a, w, gemmlab.matmul(a, w.t(), out=out)))

    def check(results):
        torch.cuda.synchronize()
        assert results
        for a, w, out in results:
            assert rel_error(out, _reference(a, w.t())) <= TOL[torch.bfloat16]

    results = []
    calls(2, results)
    check(results)
    assert any(k[2] == threading.get_ident() for k in engine._COPY_SPACE)  # the calls used the space
    for streams in ("one", "two"):
        side = [torch.cuda.Stream() for _ in range(2)] if streams == "two" else [torch.cuda.current_stream()] * 2
        per_thread = [[], []]

        def work(i):
            with torch.cuda.stream(side[i]):
                calls(8, per_thread[i])

        threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        check(per_thread[0] + per_thread[1])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("src_cols, dst_cols", [(4095, 4096), (4096, 4095), (4095, 4095), (4104, 4104), (3, 9)])
def test_pad_copy_between_row_strides(dtype, src_cols, dst_cols):
    """engine.pad_copy moves a (rows, cols) block between any two row strides (16-byte chunks where a side
    is aligned, elements where not, the ragged last chunk of each row) and touches nothing else."""
    from gemmlab import engine

    rows, cols = 37, min(src_cols, dst_cols) - 1
    src = torch.randn(rows, src_cols, device="cuda").to(dtype)[:, 1:cols + 1]  # a 2- or 4-byte offset base
    big = torch.full((rows, dst_cols), float("nan"), device="cuda", dtype=dtype)
    dst = big[:, :cols]
    engine.pad_copy(src, dst)
    torch.cuda.synchronize()
    assert torch.equal(dst, src)
    assert torch.isnan(big[:, cols:]).all()  # the padding is left alone


def test_large_unaligned_output_with_epilogue_in_place():
    """A large output with 2047-wide rows (no TMA store: DIRECT, stored from the slab row by row, odd rows
    2-byte aligned and even rows 4-byte aligned), the fused epilogue, and beta * C read from that output
    itself: every element is read before its piece is stored."""
    from gemmlab import engine

    M, N, K = 2050, 2047, 192
    a, b = _operands(M, N, K, torch.bfloat16, "NT")
    bias = torch.randn(N, device="cuda", dtype=torch.bfloat16)
    c = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    out = c.clone()
    engine.gemm(a, b, out, bias=bias, activation="gelu", alpha=0.5, beta=-1.0, c=out)
    torch.cuda.synchronize()
    assert rel_error(out, _reference(a, b, bias, "gelu", 0.5, -1.0, c)) <= TOL[torch.bfloat16]


def test_split_k_on_two_streams_at_once():
    """Two streams running the same split shape concurrently both get the right answer, five times over
    (split-K keeps its partials in each cluster's own shared memory, nothing shared between launches)."""
    from gemmlab import engine

    M, N, K = 128, 1024, 8192
    assert engine.choose_plan(M, N, K, 132)[1] > 1
    assert not engine.use_decode(*_operands(M, N, K, torch.bfloat16, "NT"))  # M > decode.MAX_M: h11
    a, b = _operands(M, N, K, torch.bfloat16, "NT")
    outs = [torch.empty(M, N, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
    streams = [torch.cuda.Stream() for _ in range(2)]
    torch.cuda.synchronize()
    for _ in range(5):
        for s, o in zip(streams, outs):
            with torch.cuda.stream(s):
                poison_(o)
                engine.gemm(a, b, o)
        torch.cuda.synchronize()
        for o in outs:
            assert rel_error(o, _reference(a, b)) <= TOL[torch.bfloat16]


def _h11_plans(monkeypatch) -> list[tuple[int, int]]:
    """Spy on the engine's launches: the (BN, splits) of each h11 launch, read from the instantiation it
    launches and the cluster it launches with."""
    from gemmlab import engine

    plans, real = [], engine.H11Launch.run

    def spy(self, *args):
        bn = int(self.compiled.name_expression.split(", ")[3])  # hopper_h11<T, TO, TBIAS, BN, ...>
        plans.append((bn, self.launcher.cluster or 1))
        real(self, *args)

    monkeypatch.setattr(engine.H11Launch, "run", spy)
    return plans


@pytest.mark.parametrize("plan", [(64, 1), (256, 1), (128, 3), (192, 5), (64, 8), (256, 8)])
def test_forced_plans_on_a_ragged_shape(monkeypatch, plan):
    """engine.gemm(plan=...) runs exactly that plan (what the autotuner times), right on a shape of no
    tile or k-step multiple: 100 x 1000 x 3000 is 47 k-steps (8 splits: ranges of 6, the last 5)."""
    from gemmlab import engine

    M, N, K = 100, 1000, 3000
    plans = _h11_plans(monkeypatch)
    a, b = _operands(M, N, K, torch.bfloat16, "NT")
    out = poison_(torch.empty(M, N, device="cuda", dtype=torch.bfloat16))
    engine.gemm(a, b, out, plan=plan)
    torch.cuda.synchronize()
    assert plans == [plan]
    assert rel_error(out, _reference(a, b)) <= TOL[torch.bfloat16]


def test_a_forced_plan_runs_h11_at_a_decode_shape(monkeypatch):
    from gemmlab import engine

    M, N, K = 16, 4096, 4096
    a, b = _operands(M, N, K, torch.bfloat16, "NT")
    assert engine.use_decode(a, b)  # the decode kernel may run it unforced
    plans = _h11_plans(monkeypatch)
    out = poison_(torch.empty(M, N, device="cuda", dtype=torch.bfloat16))
    engine.gemm(a, b, out, plan=(128, 4))
    torch.cuda.synchronize()
    assert plans == [(128, 4)]
    assert rel_error(out, _reference(a, b)) <= TOL[torch.bfloat16]


def test_matmul_runs_the_tuned_plan(tmp_path, monkeypatch):
    """`gemmlab tune hopper.h11_general` at a shape saves a plan for this GPU; from then on gemmlab.matmul
    at exactly that shape launches it (and stays right); a plan saved later replaces it at once."""
    import gemmlab
    from gemmlab import autotune, engine

    monkeypatch.setenv("GEMMLAB_CACHE_DIR", str(tmp_path))
    M, N, K = 200, 1024, 4096
    res = autotune.tune("hopper.h11_general", M, N, K, max_configs=6, rounds=2)
    assert res.winner is not None and res.winner["correct"] and len(res.candidates) == 6
    dev = torch.device("cuda", torch.cuda.current_device())
    gpu = autotune.device_gpu(dev.index)
    assert res.saved_to == autotune.tuned_path(gpu) and res.saved_to.exists()
    sm = torch.cuda.get_device_properties(dev).multi_processor_count
    won = (res.config["BN"], res.config["SPLITS"])
    assert engine.plan_for(M, N, K, sm, engine.cluster_capacity(dev), gpu=gpu) == won

    plans = _h11_plans(monkeypatch)

    def matmul_plan() -> tuple[int, int]:
        a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)  # an nn.Linear weight: the tuned layout
        out = poison_(torch.empty(M, N, device="cuda", dtype=torch.bfloat16))
        plans.clear()
        gemmlab.matmul(a, w.t(), out=out)
        torch.cuda.synchronize()
        assert rel_error(out, _reference(a, w.t())) <= TOL[torch.bfloat16]
        assert len(plans) == 1
        return plans[0]

    assert matmul_plan() == won
    other = next(r["config"] for r in res.records if r.get("correct") and r["config"] != res.config)
    autotune.save_entry(gpu, {"kernel": "hopper.h11_general", "M": M, "N": N, "K": K, "config": other})
    assert matmul_plan() == (other["BN"], other["SPLITS"])
    # Another shape: not the tuned plan but the router's own choice (h11's choose_plan plan, or the engine
    # kernel, which records no h11 plan).
    a = torch.randn(M, K + 64, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(K + 64, N, device="cuda", dtype=torch.bfloat16)
    plans.clear()
    y = gemmlab.matmul(a, b)
    torch.cuda.synchronize()
    r = engine.route(a, b, y, bias=None, activation=None, has_c=False, sm_count=sm,
                     capacity=engine.cluster_capacity(dev), gpu=lambda: gpu)
    assert r.how == "model" and r.h11 == engine.choose_plan(M, N, K + 64, sm, engine.cluster_capacity(dev))
    assert plans == ([r.h11] if r.kernel == "h11" else [])
