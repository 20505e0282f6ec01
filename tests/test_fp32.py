"""The fp32 route of gemmlab.matmul (``gemmlab.fp32``): k10's config, and the row blocks that take it past
one launch's reach (65,535 tiles on gridDim.y, 32-bit index math). The CPU tests run the route's real
blocking with a recording stand-in for the kernel's launch; the GPU tests run the kernel."""

import pytest
import torch

import gemmlab
from gemmlab import fp32, registry
from gemmlab.bench import poison_, rel_error
from gemmlab.errors import UnsupportedProblem

FP32 = torch.float32


class RecordingK10:
    """K10 with its launch replaced: checks what each launch gets, records it, computes it on the CPU."""

    def __init__(self):
        self.real, self.launches = fp32.K10, []

    def __getattr__(self, name):
        return getattr(self.real, name)

    def run(self, a, b, c, *, alpha=1.0, beta=0.0, config=None):
        (rows, K), N = a.shape, b.shape[1]
        assert a.is_contiguous() and b.is_contiguous() and c.is_contiguous() and c.shape == (rows, N)
        assert self.real.why_unsupported(rows, N, K, config) is None  # what the real run would refuse
        self.launches.append((a.data_ptr(), c.data_ptr(), rows))
        acc = alpha * (a.double() @ b.double())
        c.copy_(acc if beta == 0 else acc + beta * c.double())


def _reference(a, b, c, alpha, beta):
    return alpha * (a.double() @ b.double()) + beta * c.double()


def test_the_route_runs_the_registered_k10():
    assert registry.get("k10") is fp32.K10
    assert fp32.K10.source == "sgemm/k10_double_buffered.cu" and fp32.K10.step == max(
        s.step for s in registry.all_kernels("sgemm"))


@pytest.mark.parametrize("shape", [(4096, 4096, 4096), (100, 100, 100)])
def test_the_configs_the_route_picks_compile_to_their_promises(shape):
    """Both configs the heuristic picks (the tuned 256 x 128 tile, the default 128 x 128) compile without
    spills and with k10's SASS claims (128-bit loads, the unrolled FFMA loop, no local memory)."""
    from gemmlab import sass

    cfg = fp32.config_for(*shape, 132)
    assert (cfg["BM"], cfg["BN"]) == ((256, 128) if shape[0] == 4096 else (128, 128))
    ck = fp32.K10.compile(cfg)
    assert sass.check(fp32.K10.sass_expect(cfg), sass.kernel_summary(ck), ck.resources) == []


@pytest.mark.parametrize("M", [1, 383, 384, 385, 1000])
def test_row_blocks_compute_what_one_launch_would(monkeypatch, M):
    """With room for 3 tiles a launch, a problem of M rows runs as ceil(M / 384) launches over row slices
    of A and C (contiguous views at the right offsets), and the result is the whole product."""
    rec = RecordingK10()
    monkeypatch.setattr(fp32, "K10", rec)
    monkeypatch.setattr(fp32, "MAX_GRID_Y", 3)
    N, K = 300, 70
    cfg = fp32.config_for(M, N, K, 132)
    assert cfg["BM"] == 128
    a, b, c = torch.randn(M, K), torch.randn(K, N), torch.randn(M, N)
    out = c.clone()
    fp32.run(a, b, out, alpha=0.5, beta=-2.0, config=cfg)
    assert rel_error(out, _reference(a, b, c, 0.5, -2.0)) < 1e-6
    want = [(m0, min(384, M - m0)) for m0 in range(0, M, 384)]
    assert rec.launches == [(a.data_ptr() + m0 * K * 4, out.data_ptr() + m0 * N * 4, rows) for m0, rows in want]


def test_row_blocks_stay_under_the_index_limit():
    N, K = 2048, 32  # M * N passes 2^31 - 1024 elements: C needs several launches
    M = 2**20 + 37
    cfg = fp32.config_for(M, N, K, 132)
    blocks = fp32.row_blocks(M, N, K, cfg)
    assert len(blocks) == 2 and blocks[0][1] * N < 2**31 - 1024 and blocks[0][1] % cfg["BM"] == 0
    assert fp32.row_blocks(2**20 - 64, N, K, cfg) == [(0, 2**20 - 64)]  # under the limit: one launch


def test_a_b_past_the_index_limit_is_refused_clearly():
    with pytest.raises(UnsupportedProblem, match=r"B \(K x N\) has 2\^31 - 1024 or more elements"):
        fp32.config_for(16, 2**16, 2**15, 132)
    with pytest.raises(UnsupportedProblem, match=r"B \(K x N\)"):
        gemmlab.plan(16, 2**16, 2**15, dtype=FP32)


def test_plan_names_the_route_for_outputs_past_one_launch():
    r = gemmlab.plan(2**20 + 37, 2048, 32, dtype=FP32, sm_count=132)
    assert (r.kernel, r.step) == ("sgemm", "sgemm.k10_double_buffered") and "2 launches over row blocks" in repr(r)
    assert "row blocks" not in repr(gemmlab.plan(4096, 4096, 4096, dtype=FP32, sm_count=132))


# On the GPU -----------------------------------------------------------------------------------------------

@pytest.mark.gpu
def test_row_blocks_on_the_gpu_match_one_launch_bit_for_bit(monkeypatch):
    """The same kernel over row slices computes each element as one launch does: bitwise equal."""
    torch.manual_seed(0)
    M, N, K = 1000, 300, 200
    a, b = torch.randn(M, K, device="cuda"), torch.randn(K, N, device="cuda")
    c = torch.randn(M, N, device="cuda")
    whole = gemmlab.matmul(a, b, alpha=0.5, beta=-1.0, c=c)
    monkeypatch.setattr(fp32, "MAX_GRID_Y", 3)  # 384-row launches
    gemmlab.ops.clear_prepared_calls()
    out = poison_(torch.empty(M, N, device="cuda"))
    gemmlab.matmul(a, b, alpha=0.5, beta=-1.0, c=c, out=out)
    torch.cuda.synchronize()
    assert rel_error(whole, _reference(a, b, c, 0.5, -1.0)) < 1e-5
    assert torch.equal(out, whole)


@pytest.mark.gpu
def test_an_output_past_the_32bit_index_limit():
    """M * N > 2^31 elements (8.6 GB of fp32 output): two launches; every element written, the rows at the
    launches' seam, the last rows and random rows against float64."""
    if torch.cuda.get_device_properties(0).total_memory < 24 * 2**30:
        pytest.skip("needs 24 GB of GPU memory")
    torch.manual_seed(1)
    M, N, K = 2**20 + 37, 2048, 32
    a, b = torch.randn(M, K, device="cuda"), torch.randn(K, N, device="cuda")
    out = poison_(torch.empty(M, N, device="cuda"))
    gemmlab.matmul(a, b, out=out)
    torch.cuda.synchronize()
    assert not torch.isnan(out).any()
    (_, first), _ = fp32.row_blocks(M, N, K, fp32.config_for(M, N, K, 132))
    rows = torch.cat([torch.arange(first - 3, first + 3), torch.arange(M - 3, M),
                      torch.randint(0, M, (2000,))]).cuda()
    assert rel_error(out[rows], a[rows].double() @ b.double()) < 1e-5
    del out
