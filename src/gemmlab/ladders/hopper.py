"""The bf16 Hopper ladder: TMA, 128B swizzle, wgmma, warp specialization, persistence, clusters.

TN layout throughout: A (M,K) row-major, B (N,K) row-major (an nn.Linear weight), C = A @ B^T (M,N),
bf16 in and out, fp32 accumulation. Ladder steps need tile-multiple sizes (``gemmlab.matmul`` lifts
that). Each step is one ``.cu`` file under ``gemmlab/kernels/hopper`` and one ``register`` call here.
"""

from __future__ import annotations

import numpy as np
import torch

from ..jit.launch import launch, tensor_map_2d
from ..kernelspec import KernelSpec, Param
from ..schedule import device_order_table as order_table
from ..registry import Ladder, register, register_ladder
from ..sass import SassExpect

BK = 64  # one 128-byte swizzle row of bf16: every step's k-slab


def make_inputs(M: int, N: int, K: int, device="cuda", generator=None):
    """Fresh random A (M,K), B (N,K), C (M,N), bf16, entries ~ U(-1, 1)."""
    def rnd(*shape):
        return (torch.rand(*shape, device=device, generator=generator, dtype=torch.float32) * 2 - 1).to(torch.bfloat16)
    return rnd(M, K), rnd(N, K), rnd(M, N)


def reference(a, b, c, alpha, beta):
    return alpha * (a.double() @ b.double().t()) + beta * c.double()


def baseline(a, b):
    """cuBLAS through torch.mm in the same TN layout (what F.linear calls)."""
    return torch.mm(a, b.t())


LADDER = register_ladder(Ladder(
    name="hopper",
    title="bf16 on Hopper tensor cores",
    dtype="bf16",
    layout="TN",
    layout_doc="A (M,K) bf16 row-major, B (N,K) bf16 row-major, C (M,N) bf16 = A @ B^T (alpha=1, beta=0)",
    make_inputs=make_inputs,
    reference=reference,
    baseline=baseline,
    rel_tolerance=1e-2,
))


def tile_multiple(cfg, M, N, K, bm, bn):
    if min(M, N, K) < 1:
        return "M, N and K must be >= 1"
    if M % bm or N % bn or K % BK:
        return f"needs M % {bm} == 0, N % {bn} == 0, K % {BK} == 0 (ladder steps take tile multiples)"
    if max(M, N, K) >= 2**31 // 2 or M * N >= 2**40:
        return "sizes beyond the ladder's index range"
    return None


def _plain_only(spec, alpha, beta):
    if alpha != 1.0 or beta != 0.0:
        from ..errors import UnsupportedProblem

        raise UnsupportedProblem(f"{spec.name} computes C = A @ B^T only (alpha=1, beta=0)")


# SASS claims shared by all Hopper steps: tensor cores through wgmma, TMA loads, no local memory.
HOPPER_SASS = dict(contains=(r"^HGMMA", r"^UTMALDG"), absent=(r"^HMMA",), no_local_memory=True)


# h01 ---------------------------------------------------------------------------------------------

def _smem_h01(cfg):
    return (64 + cfg["BN"]) * BK * 2 + 1024


def _launch_h01(spec, compiled, cfg, a, b, c, alpha, beta):
    _plain_only(spec, alpha, beta)
    M, K = a.shape
    N = b.shape[0]
    bn = cfg["BN"]
    ta = tensor_map_2d(a, (64, BK))
    tb = tensor_map_2d(b, (bn, BK))
    launch(compiled, grid=(N // bn, M // 64), block=128, smem=_smem_h01(cfg),
           args=(ta, tb, c, np.int32(M), np.int32(N), np.int32(K)))


register(KernelSpec(
    name="hopper.h01_tma_wgmma", ladder="hopper", step=1,
    technique="TMA loads into 128B-swizzled smem on an mbarrier; one warpgroup issues wgmma (64-row tile)",
    source="hopper/h01_tma_wgmma.cu", template="hopper_h01",
    params=(Param("BN", (128, 64, 256), "tile width (wgmma N)"),),
    arch="sm_90a", constraints="M % 64 == 0, N % BN == 0, K % 64 == 0; alpha=1, beta=0",
    sass=SassExpect(**HOPPER_SASS),
    launcher=_launch_h01, supports=lambda cfg, M, N, K: tile_multiple(cfg, M, N, K, 64, cfg["BN"]),
    threads=lambda c: 128, smem_bytes=_smem_h01, tile=lambda c: (64, c["BN"], BK),
))


# Shared launch helpers for h02 on --------------------------------------------------------------

def _mnk(a, b):
    return a.shape[0], b.shape[0], a.shape[1]


def _ring_smem(bm: int, bn: int, qsize: int, extra: int = 0) -> int:
    """QSIZE stages of an A slab (bm x 64) and a B slab (bn x 64), plus ``extra``, plus 1 KB for alignment."""
    return qsize * (bm + bn) * BK * 2 + extra + 1024


def _sm_count(device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


_CLUSTER_SLOTS: dict = {}


def _max_clusters(compiled, threads: int, smem: int, cluster: int, device) -> int:
    """How many clusters fit on the GPU at once (cuda-core's occupancy query; GPCs can strand SMs)."""
    key = (compiled.name, threads, smem, cluster, device.index)
    if key not in _CLUSTER_SLOTS:
        n = _sm_count(device) // cluster
        try:
            from cuda.core import LaunchConfig

            from ..jit.launch import prepare, torch_stream

            kern = prepare(compiled, smem, device.index)
            # The query counts co-resident clusters of the *launch* described, so describe a full grid.
            cfg = LaunchConfig(grid=n, cluster=cluster, block=threads, shmem_size=smem)
            n = int(kern.occupancy.max_active_clusters(cfg, stream=torch_stream()))
        except Exception:  # noqa: BLE001 - older cuda-core or driver: fall back to SMs / cluster size
            pass
        if n < 1:
            from ..errors import LaunchError

            raise LaunchError(f"{compiled.name}: no cluster of {cluster} CTAs with {smem} B of shared memory "
                              "fits on this GPU")
        _CLUSTER_SLOTS[key] = n
    return _CLUSTER_SLOTS[key]


def _grid_tiles(spec, cfg, a, b, c, alpha, beta, bm, bn, threads, smem):
    """Launch a one-CTA-per-tile step: grid (N/bn, M/bm)."""
    _plain_only(spec, alpha, beta)
    M, N, K = _mnk(a, b)
    return (N // bn, M // bm), (tensor_map_2d(a, (bm, BK)), tensor_map_2d(b, (bn, BK)), c,
                                np.int32(M), np.int32(N), np.int32(K))


def _tiles_fn(bm, bn):
    return lambda cfg, M, N, K: tile_multiple(cfg, M, N, K, bm, bn)


# h02 ---------------------------------------------------------------------------------------------

def _launch_h02(spec, compiled, cfg, a, b, c, alpha, beta):
    smem = _ring_smem(128, cfg["BN"], 1)
    grid, args = _grid_tiles(spec, cfg, a, b, c, alpha, beta, 128, cfg["BN"], 128, smem)
    launch(compiled, grid=grid, block=128, smem=smem, args=args)


register(KernelSpec(
    name="hopper.h02_tile_128", ladder="hopper", step=2,
    technique="128-row tile: one warpgroup issues two m64 wgmmas per k16 against the same B slab",
    source="hopper/h02_tile_128.cu", template="hopper_h02",
    params=(Param("BN", (128, 64), "tile width (wgmma N)"),),
    arch="sm_90a", constraints="M % 128 == 0, N % BN == 0, K % 64 == 0; alpha=1, beta=0",
    sass=SassExpect(**HOPPER_SASS),
    launcher=_launch_h02, supports=lambda cfg, M, N, K: tile_multiple(cfg, M, N, K, 128, cfg["BN"]),
    threads=lambda c: 128, smem_bytes=lambda c: _ring_smem(128, c["BN"], 1), tile=lambda c: (128, c["BN"], BK),
))


# h03 ---------------------------------------------------------------------------------------------

def _launch_h03(spec, compiled, cfg, a, b, c, alpha, beta):
    smem = _ring_smem(128, cfg["BN"], cfg["QSIZE"])
    grid, args = _grid_tiles(spec, cfg, a, b, c, alpha, beta, 128, cfg["BN"], 256, smem)
    launch(compiled, grid=grid, block=256, smem=smem, args=args)


register(KernelSpec(
    name="hopper.h03_warp_specialized", ladder="hopper", step=3,
    technique="producer warpgroup (TMA) + consumer warpgroup (wgmma) around a multi-stage mbarrier ring",
    source="hopper/h03_warp_specialized.cu", template="hopper_h03",
    params=(Param("BN", (128, 64), "tile width (wgmma N)"), Param("QSIZE", (4, 3, 5), "pipeline stages")),
    arch="sm_90a", constraints="M % 128 == 0, N % BN == 0, K % 64 == 0; alpha=1, beta=0",
    sass=SassExpect(**HOPPER_SASS),
    launcher=_launch_h03, supports=lambda cfg, M, N, K: tile_multiple(cfg, M, N, K, 128, cfg["BN"]),
    threads=lambda c: 256, smem_bytes=lambda c: _ring_smem(128, c["BN"], c["QSIZE"]),
    tile=lambda c: (128, c["BN"], BK),
))


# h04 ---------------------------------------------------------------------------------------------

def _launch_h04(spec, compiled, cfg, a, b, c, alpha, beta):
    smem = _ring_smem(128, 256, cfg["QSIZE"])
    grid, args = _grid_tiles(spec, cfg, a, b, c, alpha, beta, 128, 256, 384, smem)
    launch(compiled, grid=grid, block=384, smem=smem, args=args)


# Consumers hold 128 fp32 accumulators; setmaxnreg must leave them room (no spills, no local memory).
WS_SASS = dict(contains=HOPPER_SASS["contains"] + (r"^USETMAXREG",), absent=HOPPER_SASS["absent"],
               no_local_memory=True)

register(KernelSpec(
    name="hopper.h04_two_consumers", ladder="hopper", step=4,
    technique="128x256 tile, two consumer warpgroups (m64n256k16 each); setmaxnreg gives the producer's "
              "registers to the consumers",
    source="hopper/h04_two_consumers.cu", template="hopper_h04",
    params=(Param("QSIZE", (4, 3), "pipeline stages"),),
    arch="sm_90a", constraints="M % 128 == 0, N % 256 == 0, K % 64 == 0; alpha=1, beta=0",
    sass=SassExpect(**WS_SASS),
    launcher=_launch_h04, supports=_tiles_fn(128, 256),
    threads=lambda c: 384, smem_bytes=lambda c: _ring_smem(128, 256, c["QSIZE"]), tile=lambda c: (128, 256, BK),
))


# h05, h06: persistent -----------------------------------------------------------------------------

def _launch_persistent(spec, compiled, cfg, a, b, c, alpha, beta):
    smem = _ring_smem(128, 256, cfg["QSIZE"])
    _, args = _grid_tiles(spec, cfg, a, b, c, alpha, beta, 128, 256, 384, smem)
    M, N, _ = _mnk(a, b)
    tiles = (M // 128) * (N // 256)
    launch(compiled, grid=min(_sm_count(a.device), tiles), block=384, smem=smem, args=args)


register(KernelSpec(
    name="hopper.h05_persistent", ladder="hopper", step=5,
    technique="persistent kernel: one CTA per SM (SM count read from the device) walks the tiles; "
              "the ring runs on across tiles",
    source="hopper/h05_persistent.cu", template="hopper_h05",
    params=(Param("QSIZE", (4, 3), "pipeline stages"),),
    arch="sm_90a", constraints="M % 128 == 0, N % 256 == 0, K % 64 == 0; alpha=1, beta=0",
    sass=SassExpect(**WS_SASS),
    launcher=_launch_persistent, supports=_tiles_fn(128, 256),
    threads=lambda c: 384, smem_bytes=lambda c: _ring_smem(128, 256, c["QSIZE"]), tile=lambda c: (128, 256, BK),
    extra={"persistent": True},
))

register(KernelSpec(
    name="hopper.h06_ptx_barriers", ladder="hopper", step=6,
    technique="parity-wait mbarriers (waiters don't arrive; one arrival per consumer) and one wgmma "
              "group kept in flight",
    source="hopper/h06_ptx_barriers.cu", template="hopper_h06",
    params=(Param("QSIZE", (4, 3), "pipeline stages"),),
    arch="sm_90a", constraints="M % 128 == 0, N % 256 == 0, K % 64 == 0; alpha=1, beta=0",
    sass=SassExpect(**WS_SASS),
    launcher=_launch_persistent, supports=_tiles_fn(128, 256),
    threads=lambda c: 384, smem_bytes=lambda c: _ring_smem(128, 256, c["QSIZE"]), tile=lambda c: (128, 256, BK),
    extra={"persistent": True, "wgmma_in_flight": 1},
))


# h07, h08: clusters of two sharing B ----------------------------------------------------------------

def _launch_cluster(spec, compiled, cfg, a, b, c, alpha, beta, *, store_tma: bool, ordered: bool = False,
                    cluster: int = 2, c_slab_bytes: int | None = None):
    """Persistent warp-specialized steps from h07 on: clusters of ``cluster`` CTAs along M, B multicast."""
    _plain_only(spec, alpha, beta)
    M, N, K = _mnk(a, b)
    if c_slab_bytes is None:
        c_slab_bytes = 2 * 64 * 256 * 2 if store_tma else 0
    smem = _ring_smem(128, 256, cfg["QSIZE"], extra=c_slab_bytes)
    # With multicast each CTA loads half of the 256 B rows; alone it loads all of them.
    ta, tb = tensor_map_2d(a, (128, BK)), tensor_map_2d(b, (256 // cluster, BK))
    cargs = (tensor_map_2d(c, (64, 64)),) if store_tma else (c,)
    tiles = (M // (128 * cluster)) * (N // 256)
    if ordered:
        cargs += (order_table(ORDER_NAMES[cfg["ORDER"]], M // (128 * cluster), N // 256, cfg["GROUP_M"], a.device),)
    if cluster > 1:
        groups = min(_max_clusters(compiled, 384, smem, cluster, a.device), tiles)
        launch(compiled, grid=cluster * groups, cluster=cluster, block=384, smem=smem,
               args=(ta, tb) + cargs + (np.int32(M), np.int32(N), np.int32(K)))
    else:
        launch(compiled, grid=min(_sm_count(a.device), tiles), block=384, smem=smem,
               args=(ta, tb) + cargs + (np.int32(M), np.int32(N), np.int32(K)))


# Facts of the main loop that gemmlab.model's pipeline model needs and no parameter states: one CTA per
# SM walking the tiles, one wgmma group kept in flight (parity barriers), and B shared by a cluster of 2.
CLUSTER_MODEL = {"persistent": True, "wgmma_in_flight": 1, "cluster": 2}

# Cluster steps: multicast TMA, and no GPU-wide fence in the k-loop (a release-ordered remote arrive
# puts MEMBAR.ALL.GPU there: measured 0.67x of the step before).
CLUSTER_SASS = dict(contains=WS_SASS["contains"] + (r"\.MULTICAST",), absent=HOPPER_SASS["absent"],
                    no_local_memory=True, loop_absent=(r"^MEMBAR\.ALL\.GPU",))

register(KernelSpec(
    name="hopper.h07_cluster_multicast", ladder="hopper", step=7,
    technique="clusters of 2 CTAs on vertically adjacent tiles; each loads half of B and TMA-multicasts it",
    source="hopper/h07_cluster_multicast.cu", template="hopper_h07",
    params=(Param("QSIZE", (4, 3), "pipeline stages"),),
    arch="sm_90a", constraints="M % 256 == 0, N % 256 == 0, K % 64 == 0; alpha=1, beta=0",
    sass=SassExpect(**CLUSTER_SASS),
    launcher=lambda *a: _launch_cluster(*a, store_tma=False), supports=_tiles_fn(256, 256),
    threads=lambda c: 384, smem_bytes=lambda c: _ring_smem(128, 256, c["QSIZE"]), tile=lambda c: (128, 256, BK),
    extra=CLUSTER_MODEL,
))

register(KernelSpec(
    name="hopper.h08_async_store", ladder="hopper", step=8,
    technique="epilogue through stmatrix into 128B-swizzled smem and TMA bulk stores, overlapped with "
              "the next tile",
    source="hopper/h08_async_store.cu", template="hopper_h08",
    params=(Param("QSIZE", (3, 2), "pipeline stages (the C slabs take 64 KB)"),),
    arch="sm_90a", constraints="M % 256 == 0, N % 256 == 0, K % 64 == 0; alpha=1, beta=0",
    sass=SassExpect(**{**CLUSTER_SASS, "contains": CLUSTER_SASS["contains"] + (r"^UTMASTG", r"^STSM")}),
    launcher=lambda *a: _launch_cluster(*a, store_tma=True), supports=_tiles_fn(256, 256),
    threads=lambda c: 384, smem_bytes=lambda c: _ring_smem(128, 256, c["QSIZE"], extra=2 * 64 * 256 * 2),
    tile=lambda c: (128, 256, BK),
    extra=CLUSTER_MODEL,
))


# h09: tile order -------------------------------------------------------------------------------------

ORDER_NAMES = {0: "row_major", 1: "grouped", 2: "hilbert"}
register(KernelSpec(
    name="hopper.h09_tile_order", ladder="hopper", step=9,
    technique="tile order for L2 reuse (row-major, grouped or Hilbert curve), read from a table",
    source="hopper/h09_tile_order.cu", template="hopper_h09",
    params=(Param("QSIZE", (3, 2), "pipeline stages (the C slabs take 64 KB)"),
            Param("ORDER", (2, 1, 0), "tile order: 0 row-major, 1 grouped, 2 Hilbert", template=False),
            Param("GROUP_M", (8, 4, 16), "cluster-tile rows per group (grouped order)", template=False,
                  only_if=lambda c: c["ORDER"] == 1)),
    arch="sm_90a", constraints="M % 256 == 0, N % 256 == 0, K % 64 == 0, M/256 and N/256 < 65536; "
                               "alpha=1, beta=0",
    sass=SassExpect(**{**CLUSTER_SASS, "contains": CLUSTER_SASS["contains"] + (r"^UTMASTG", r"^STSM")}),
    launcher=lambda *a: _launch_cluster(*a, store_tma=True, ordered=True), supports=_tiles_fn(256, 256),
    threads=lambda c: 384, smem_bytes=lambda c: _ring_smem(128, 256, c["QSIZE"], extra=2 * 64 * 256 * 2),
    tile=lambda c: (128, 256, BK),
    extra=CLUSTER_MODEL,
))


# h10: a deeper ring (C stored in pieces), a choice of tile width, cluster optional -----------------

H10_SLABS = 2 * 2 * 64 * 64 * 2  # two consumers x two 64 x 64 bf16 slabs


def _h10_smem(cfg) -> int:
    return _ring_smem(128, cfg["BN"], cfg["QSIZE"], extra=H10_SLABS)


def _supports_h10(cfg, M, N, K):
    return tile_multiple(cfg, M, N, K, 128 * cfg["CLUSTER"], cfg["BN"])


def _check_h10(cfg):
    if _h10_smem(cfg) > 227 * 1024 - 64:
        return f"{_h10_smem(cfg)} B of shared memory is more than a block can have"
    return None


def h10_heuristic(M: int, N: int, K: int, sm_count: int) -> dict:
    """Pick BN by wave quantization: the most work per wave of persistent CTAs, wider tiles on ties.

    Per-tile efficiency falls a little with BN (less B reuse per A byte); the weights are rough
    measurements from the ladder runs (see docs/worklog.md), the wave term is exact.
    """
    from ..schedule import wave_quantization

    best, best_score = None, -1.0
    for bn, weight in ((256, 1.0), (192, 0.97), (128, 0.92)):
        if N % bn or M % 128:
            continue
        score = wave_quantization(M, N, 128, bn, sm_count).efficiency * weight
        if score > best_score:
            best, best_score = bn, score
    return {"BN": best or 256}


def _launch_h10(spec, compiled, cfg, a, b, c, alpha, beta):
    _plain_only(spec, alpha, beta)
    M, N, K = _mnk(a, b)
    bn, cluster = cfg["BN"], cfg["CLUSTER"]
    smem = _h10_smem(cfg)
    ta, tb = tensor_map_2d(a, (128, BK)), tensor_map_2d(b, (bn // cluster, BK))
    tc = tensor_map_2d(c, (64, 64))
    order = order_table(ORDER_NAMES[cfg["ORDER"]], M // (128 * cluster), N // bn, cfg["GROUP_M"], a.device)
    tiles = (M // (128 * cluster)) * (N // bn)
    args = (ta, tb, tc, order, np.int32(M), np.int32(N), np.int32(K))
    if cluster > 1:
        groups = min(_max_clusters(compiled, 384, smem, cluster, a.device), tiles)
        launch(compiled, grid=cluster * groups, cluster=cluster, block=384, smem=smem, args=args)
    else:
        launch(compiled, grid=min(_sm_count(a.device), tiles), block=384, smem=smem, args=args)


register(KernelSpec(
    name="hopper.h10_deep_pipeline", ladder="hopper", step=10,
    technique="four stages next to a small C slab (stored in pieces); tile width chosen for wave "
              "quantization; cluster optional",
    source="hopper/h10_deep_pipeline.cu", template="hopper_h10",
    params=(Param("QSIZE", (4, 3, 5), "pipeline stages (5 fits with BN <= 192)"),
            Param("CLUSTER", (1, 2), "CTAs per cluster sharing B by multicast"),
            Param("BN", (256, 192, 128), "tile width (wgmma N)"),
            Param("ORDER", (2, 1, 0), "tile order: 0 row-major, 1 grouped, 2 Hilbert", template=False),
            Param("GROUP_M", (8, 4, 16), "cluster-tile rows per group (grouped order)", template=False,
                  only_if=lambda c: c["ORDER"] == 1)),
    arch="sm_90a", constraints="M % (128*CLUSTER) == 0, N % BN == 0, K % 64 == 0; alpha=1, beta=0",
    sass=SassExpect(contains=WS_SASS["contains"] + (r"^UTMASTG", r"^STSM"), absent=HOPPER_SASS["absent"],
                    no_local_memory=True, loop_absent=(r"^MEMBAR\.ALL\.GPU",)),
    launcher=_launch_h10, supports=_supports_h10, check_config=_check_h10,
    threads=lambda c: 384, smem_bytes=_h10_smem, tile=lambda c: (128, c["BN"], BK),
    heuristic=h10_heuristic,
    extra={"persistent": True, "wgmma_in_flight": 1},
))


# h12: h10 with the epilogue under the next tile's tensor work -----------------------------------------

def _launch_h12(spec, compiled, cfg, a, b, c, alpha, beta):
    _launch_h10(spec, compiled, {**cfg, "CLUSTER": 1}, a, b, c, alpha, beta)


register(KernelSpec(
    name="hopper.h12_overlapped_epilogue", ladder="hopper", step=12,
    technique="the finished tile packed to bf16 in registers and stored during the next tile's first "
              "k-steps, so the epilogue runs under tensor work",
    source="hopper/h12_overlapped_epilogue.cu", template="hopper_h12",
    params=(Param("QSIZE", (4, 3, 5), "pipeline stages (5 fits with BN <= 192)"),
            Param("BN", (256, 192, 128), "tile width (wgmma N)"),
            Param("ORDER", (2, 1, 0), "tile order: 0 row-major, 1 grouped, 2 Hilbert", template=False),
            Param("GROUP_M", (8, 4, 16), "tile rows per group (grouped order)", template=False,
                  only_if=lambda c: c["ORDER"] == 1)),
    arch="sm_90a", constraints="M % 128 == 0, N % BN == 0, K % 64 == 0; alpha=1, beta=0",
    sass=SassExpect(contains=WS_SASS["contains"] + (r"^UTMASTG", r"^STSM"), absent=HOPPER_SASS["absent"],
                    no_local_memory=True, loop_absent=(r"^MEMBAR\.ALL\.GPU",)),
    launcher=_launch_h12, supports=lambda cfg, M, N, K: tile_multiple(cfg, M, N, K, 128, cfg["BN"]),
    check_config=_check_h10, threads=lambda c: 384, smem_bytes=_h10_smem, tile=lambda c: (128, c["BN"], BK),
    heuristic=h10_heuristic,
    extra={"persistent": True, "wgmma_in_flight": 1, "epilogue_overlapped": True},
))


# h11: general (the engine of gemmlab.matmul) --------------------------------------------------------

def _launch_h11(spec, compiled, cfg, a, b, c, alpha, beta):
    """The ladder view of h11: TN bf16, C = alpha * A @ B^T (+ beta * C), the nn.Linear layout
    ``gemmlab.matmul`` sees, through ``gemmlab.engine`` with the config's plan (BN, SPLITS)."""
    from .. import engine

    engine.gemm(a, b.t(), c, alpha=alpha, beta=beta, c=c.clone() if beta != 0.0 else None,
                plan=(cfg["BN"], cfg["SPLITS"]))


def _h11_qsize(cfg) -> int:
    """The pipeline depth the engine gives the plan (split-K stages take the output slabs' room)."""
    from .. import engine

    return engine._qsize(cfg["BN"], 2, split=cfg["SPLITS"] > 1)


def _h11_template_args(cfg) -> tuple:
    """hopper_h11<T, TO, TBIAS, BN, QSIZE, A_MN, B_MN, EPI, SPLIT, OVERLAP> as the engine instantiates it for
    the ladder's plain TN bf16 call (alpha = 1, beta = 0): K-major operands, no epilogue extras, the split
    instantiation for SPLITS > 1, else the overlapped epilogue."""
    split = int(cfg["SPLITS"] > 1)
    return ("__nv_bfloat16", "__nv_bfloat16", "float", cfg["BN"], _h11_qsize(cfg), 0, 0, 0, split, 1 - split)


def _h11_smem(cfg) -> int:
    from .. import engine

    return engine.smem_bytes(cfg["BN"], _h11_qsize(cfg), 2, split=cfg["SPLITS"] > 1)


def _supports_h11(cfg, M, N, K):
    from .. import engine

    if min(M, N, K) < 1 or max(M, N) >= 2**23:
        return "sizes out of range"
    return engine.plan_problem(K, cfg["BN"], cfg["SPLITS"])


def h11_heuristic(M: int, N: int, K: int, sm_count: int) -> dict:
    """The engine's own plan (``choose_plan``), with this GPU's cluster capacity when it is the GPU asked
    about, else the H200's table."""
    from .. import engine

    bn, splits = engine.choose_plan(M, N, K, sm_count, lambda: engine.visible_capacity(sm_count))
    return {"BN": bn, "SPLITS": splits}


H11_SASS = SassExpect(contains=WS_SASS["contains"] + (r"^UTMASTG", r"^STSM"), absent=HOPPER_SASS["absent"],
                      no_local_memory=True, loop_absent=(r"^MEMBAR\.ALL\.GPU",))
# Split-K: partials reduced through distributed shared memory behind cluster barriers and stored by the
# threads; the barrier's default .release is a MEMBAR.ALL.GPU once per tile, inside the unit loop.
H11_SPLIT_SASS = SassExpect(contains=WS_SASS["contains"] + (r"^UCGABAR_ARV", r"^UCGABAR_WAIT", r"^STG"),
                            absent=HOPPER_SASS["absent"] + (r"^UTMASTG",), no_local_memory=True)


register(KernelSpec(
    name="hopper.h11_general", ladder="hopper", step=11,
    technique="any M, N, K (TMA bounds), K- or MN-major operands, fused alpha/beta/bias/activation "
              "epilogue: gemmlab.matmul's kernel where its plan is priced cheaper",
    source="hopper/h11_general.cu", template="hopper_h11",
    params=(Param("BN", (128, 64, 192, 256), "tile width (wgmma N)"),
            Param("SPLITS", (1, 2, 3, 4, 5, 6, 7, 8), "split-K CTAs per tile, one cluster (> 1: the split "
                  "instantiation, whose stages take the output slabs' room)", template=False)),
    template_args=_h11_template_args,
    arch="sm_90a", constraints="any M, N, K >= 1 (16-byte aligned rows; gemmlab.matmul copies others); "
                               "alpha, beta any; SPLITS > 1: at least 4 k-steps of 64 per split, none empty, "
                               "and a cluster of SPLITS CTAs this GPU can launch",
    sass=H11_SASS, sass_for=lambda cfg: H11_SPLIT_SASS if cfg["SPLITS"] > 1 else H11_SASS,
    launcher=_launch_h11, supports=_supports_h11,
    threads=lambda c: 384, smem_bytes=_h11_smem, tile=lambda c: (128, c["BN"], BK),
    heuristic=h11_heuristic,
    extra={"persistent": True, "wgmma_in_flight": 1, "stages": _h11_qsize},
))
