"""The Hopper engine behind ``gemmlab.matmul``: the ladder's general step (h11) for any shape and layout.

``gemm`` takes validated tensors (``gemmlab.ops`` validates) and works out, per call: which operand is
K-major or MN-major (no copy for either), whether a leading dimension breaks TMA's 16-byte rule (then
that operand, or the output, goes through an aligned copy), the plan: tile width and split-K count
(``plan_for``: what ``gemmlab tune hopper.h11_general`` saved for this exact shape on this GPU, else
``choose_plan``: wave quantization, and for few-tile shapes a fitted model; ``gemm(plan=)`` forces one),
the pipeline depth that fits, and the fused epilogue variant. Compiled variants and TMA descriptors are
cached, so a repeated call is a few dictionary lookups, one ``stat`` and one launch.

Decode shapes (M <= ``decode.MAX_M`` with K-contiguous operands and weights up to
``DECODE_MAX_WEIGHT_DIM``, see ``use_decode``) may go to the small-M kernel in ``gemmlab.decode`` instead:
``route`` runs it where its price is at most the engine kernel's.
Split-K needs no workspace: a tile's splits run as one thread-block cluster and reduce through
distributed shared memory.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch

from . import decode, plan_cost, planner, tuned
from .devices import H200, DeviceProfile, stream_k_offered, with_sm_count
from .epilogue import ACTIVATIONS, DIRECT, ctypes, epi_bits
from .log import logger
from .errors import UnsupportedProblem
from .jit.compiler import compile_kernel
from .jit.launch import Launcher, MapSlot, max_active_clusters, raw_stream
from .schedule import device_order_table, wave_quantization

SOURCE = "hopper/h11_general.cu"
PAD_COPY_SOURCE = "engine/pad_copy.cu"
BM, BK = 128, 64
SMEM_LIMIT = 227 * 1024 - 256  # dynamic smem per block, less the kernel's static barriers (16 B a stage)


def hopper_available(device: torch.device) -> str | None:
    """None if the engine can run on ``device``; otherwise what is missing. Cheap after the first call."""
    if device.type != "cuda":
        return f"tensors are on {device}, not a CUDA device"
    return _hopper_reason(device.index if device.index is not None else -1)


@functools.lru_cache(maxsize=None)
def _hopper_reason(index: int) -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA GPU is visible"
    cap = torch.cuda.get_device_capability(None if index < 0 else index)
    if cap != (9, 0):
        return f"the Hopper engine needs compute capability 9.0 (sm_90a); this GPU is {cap[0]}.{cap[1]}"
    return None


def _tma_ok(t: torch.Tensor) -> bool:
    """2-D, unit inner stride, 16-byte aligned rows and base: what a TMA descriptor accepts."""
    return (t.stride(1) == 1 and (t.stride(0) * t.element_size()) % 16 == 0 and t.data_ptr() % 16 == 0
            and t.stride(0) >= t.shape[1])


def rows_16b(t: torch.Tensor) -> int:
    """1 where a 2-D view's rows all start on 16-byte boundaries (base and row stride), so a pad copy moves
    whole 16-byte chunks of them (``pad_copy.cu``'s SRC_VEC / DST_VEC), else 0."""
    return int(t.data_ptr() % 16 == 0 and (t.stride(0) * t.element_size()) % 16 == 0)


def _aligned_empty(rows: int, cols: int, dtype: torch.dtype, device) -> torch.Tensor:
    """An uninitialized (rows, cols) view whose rows start on 32-byte boundaries (padding hidden): TMA needs
    16, and rows 16- but not 32-byte aligned cut its L2 rate by ``misaligned_l2_factor`` (1.75x, H200)."""
    per32 = 32 // torch.empty((), dtype=dtype).element_size()
    return torch.empty(rows, math.ceil(cols / per32) * per32, dtype=dtype, device=device)[:, :cols]


def _aligned_copy(t: torch.Tensor) -> torch.Tensor:
    """A copy of 2-D ``t`` whose rows start on 32-byte boundaries (the view hides the padding)."""
    view = _aligned_empty(*t.shape, t.dtype, t.device)
    pad_copy(t, view)
    return view


def pad_copy(src: torch.Tensor, dst: torch.Tensor) -> None:
    """dst[...] = src for 2-D tensors of one shape and dtype, on torch's current stream.

    With unit column strides and 2- or 4-byte elements this is ``kernels/engine/pad_copy.cu`` (16-byte
    chunks, a 16-byte access on each side whose rows are 16-byte aligned); anything else is torch's copy.
    """
    es = src.element_size()
    if src.stride(1) != 1 or dst.stride(1) != 1 or es not in (2, 4) or src.numel() == 0:
        dst.copy_(src)
        return
    _PadCopy(src, dst)(src, dst, raw_stream(_index(src.device)))


@functools.lru_cache(maxsize=4096)
def choose_bn(M: int, N: int, sm_count: int) -> int:
    """Tile width by wave quantization (h10's heuristic with ceil-divided tiles)."""
    best, best_score = 256, -1.0
    for bn, weight in ((256, 1.0), (192, 0.97), (128, 0.92)):
        waste = N / (math.ceil(N / bn) * bn)  # columns computed past N are lost work
        score = wave_quantization(M, N, BM, bn, sm_count).efficiency * weight * waste
        if score > best_score:
            best, best_score = bn, score
    return best


SLAB_BYTES = 2 * 2 * 64 * 64 * 2  # two consumers x two 8 KB output slabs (any output dtype)


MAX_STAGES = 9


def _qsize(bn: int, in_bytes: int, split: bool = False) -> int:
    """Pipeline stages: as many as fit, up to MAX_STAGES (split-K stores without the output slabs, so its
    stages take their room). Narrow tiles are latency-bound, and the stages in flight set their pace: at
    BN = 64, 8 stages instead of 5 ran 1024^3 in 6.7 us instead of 7.4 and 128x4096x4096 unsplit in 16.0
    instead of 20.1; 256-wide tiles fit 4 either way (benchmarks/results/h11_timeline.jsonl, sha 97805c5)."""
    for q in range(MAX_STAGES, 1, -1):
        if smem_bytes(bn, q, in_bytes, split) <= SMEM_LIMIT:
            return q
    raise UnsupportedProblem(f"no pipeline depth fits BN={bn}")


def smem_bytes(bn: int, q: int, in_bytes: int, split: bool = False) -> int:
    """Dynamic shared memory of an h11 launch: q stages of A and B, the output slabs unless split-K, and
    1 KB for aligning the stages to the 128-byte swizzle's 1024-byte atoms."""
    return q * (BM + bn) * BK * in_bytes + (0 if split else SLAB_BYTES) + 1024


SPLIT_WIDTHS = (64, 128, 192, 256)  # tile widths weighed for few-tile shapes (64: twice the tiles of 128)
MAX_CLUSTER = 8  # split-K CTAs of one tile form a cluster: 8 is the portable limit
MIN_SPLIT_K_STEPS = 4
# Clusters of 1..8 CTAs of one SM each that an H200 holds at once (``DeviceProfile.cluster_capacity``):
# GPCs of uneven size leave SMs over. The engine asks the GPU it runs on (cluster_capacity); this table is
# for planning without one.
H200_CLUSTER_CAPACITY = dict(H200.cluster_capacity)
# h11's split-K model: its constants are the device profile's (``DeviceProfile.h11_*``; what they were
# fitted to is written there).


def kstep_seconds(M: int, bn: int, q: int, hbm_share: float, in_bytes: int = 2) -> float:
    """One 64-deep k-step of a 128 x bn tile on one SM with q stages: the MMAs for the live rows (one
    consumer's 64 when M <= 64), the bytes the TMA brings (64 or 128 rows of A) at the SM's rate, or a
    load's round trip over the q stages in flight (Little's law), whichever is longest. The round trip
    runs from the L2's latency to HBM's with ``hbm_share``, the part of the loads that come from HBM
    (``DeviceProfile.h11_*``)."""
    p = H200
    rows = 64 if M <= 64 else BM
    stage = (rows + bn) * BK * in_bytes
    latency = p.h11_l2_latency_s + hbm_share * (p.h11_hbm_latency_s - p.h11_l2_latency_s)
    return max(2.0 * rows * bn * BK / p.h11_sm_flops_per_s, stage / p.h11_sm_bytes_per_s, latency / q)


def split_seconds(M: int, N: int, K: int, bn: int, splits: int, sm_count: int,
                  capacity: dict[int, int]) -> float:
    """Modelled time of the split-K plan (bn, splits): waves of clusters x (k-loop + reduction), but no
    less than the operands' bytes take from HBM once, or from L2 as often as the tiles read them (each
    tile reads its rows of A and columns of B: narrow tiles read A more often)."""
    tiles = math.ceil(M / BM) * math.ceil(N / bn)
    k_iters = math.ceil(K / BK)
    hbm = 2.0 * (M * K + N * K) / H200.hbm_bytes_per_s  # (4.0 TB/s before: no plan of 8,590 shapes moves)
    l2 = tiles * k_iters * (min(M, BM) + bn) * BK * 2.0 / H200.l2_smem_bytes_per_s
    return max(_cta_seconds(M, N, K, bn, splits, sm_count, capacity), hbm, l2)


def _cta_seconds(M: int, N: int, K: int, bn: int, splits: int, sm_count: int, capacity: dict[int, int]) -> float:
    """The per-SM part of ``split_seconds``: waves of clusters x (k-loop + reduction)."""
    tiles = math.ceil(M / BM) * math.ceil(N / bn)
    slots = sm_count if splits == 1 else capacity.get(splits, sm_count // splits)
    waves = math.ceil(tiles / max(1, slots))
    k_per = math.ceil(math.ceil(K / BK) / splits)
    q = _qsize(bn, 2, split=splits > 1)
    loaded = tiles * math.ceil(K / BK) * (min(M, BM) + bn) * BK * 2.0  # bytes all tiles load
    hbm_share = min(1.0, 2.0 * (M * K + N * K) / loaded)  # each operand byte comes from HBM once
    return waves * (k_per * kstep_seconds(M, bn, q, hbm_share)
                    + (H200.h11_reduce_s * bn / 128 if splits > 1 else 0.0))


def choose_plan(M: int, N: int, K: int, sm_count: int,
                capacity: dict[int, int] | Callable[[], dict[int, int]] | None = None) -> tuple[int, int]:
    """(tile width, split count) for a problem. Where the tiles of ``choose_bn`` fill more than half the
    SMs: that width, no split. Otherwise the (BN, splits) pair of least ``split_seconds`` (then least
    per-SM time), with splits clusters of up to MAX_CLUSTER CTAs, each split at least MIN_SPLIT_K_STEPS
    k-steps and never empty (k ranges are ceil(k_iters / splits)). ``capacity``: clusters the GPU holds at once per size, or a
    function returning that (asked only when splitting is considered); default: the H200's table. Split
    counts whose cluster the GPU cannot hold at all are never chosen."""
    if min(M, N, K) < 1:
        raise UnsupportedProblem(f"no plan for an empty problem (M={M}, N={N}, K={K}): nothing to launch")
    bn = choose_bn(M, N, sm_count)
    if math.ceil(M / BM) * math.ceil(N / bn) * 2 > sm_count:
        return bn, 1
    return _best_split(M, N, K, sm_count, tuple(sorted(_capacity_of(capacity).items())))


@functools.lru_cache(maxsize=4096)
def _best_split(M: int, N: int, K: int, sm_count: int, capacity_items: tuple) -> tuple[int, int]:
    """``choose_plan``'s search, cached: it weighs 32 plans (~140 us of Python), once per shape and GPU."""
    capacity = dict(capacity_items)
    k_iters = math.ceil(K / BK)
    best = None
    for width in SPLIT_WIDTHS:
        for s in range(1, MAX_CLUSTER + 1):
            if not _split_ok(s, k_iters) or (s > 1 and capacity.get(s, 0) < 1):
                continue
            # Ties (at a bandwidth floor): the shorter per-SM time, then fewer splits.
            key = (split_seconds(M, N, K, width, s, sm_count, capacity),
                   _cta_seconds(M, N, K, width, s, sm_count, capacity), s, width)
            if best is None or key < best:
                best = key
    return best[3], best[2]


def _split_ok(splits: int, k_iters: int) -> bool:
    """Whether ``splits`` splits of ``k_iters`` k-steps are each at least MIN_SPLIT_K_STEPS long and none
    is empty (a single split always is)."""
    return splits == 1 or (k_iters // splits >= MIN_SPLIT_K_STEPS and _no_empty_split(splits, k_iters) == splits)


def _no_empty_split(splits: int, k_iters: int) -> int:
    """The split count that ceil(k_iters / splits)-long ranges really make (never a range without k-steps)."""
    if splits <= 1:
        return 1
    return math.ceil(k_iters / math.ceil(k_iters / splits))


def plan_problem(K: int, bn: int, splits: int) -> str | None:
    """Why ``gemm`` would not run the plan (tile width ``bn``, ``splits`` split-K CTAs per tile) at depth
    ``K``, or None. Whether the GPU can launch a cluster of ``splits`` CTAs is asked at launch
    (``validate_plan``)."""
    if bn not in SPLIT_WIDTHS:
        return f"BN={bn} is not one of the tile widths {SPLIT_WIDTHS}"
    if not 1 <= splits <= MAX_CLUSTER:
        return f"splits={splits} is not in 1..{MAX_CLUSTER} (a tile's splits form one cluster)"
    k_iters = math.ceil(K / BK)
    if not _split_ok(splits, k_iters):
        if k_iters // splits < MIN_SPLIT_K_STEPS:
            return (f"{splits} splits of K={K} ({k_iters} k-steps of {BK}) leave fewer than "
                    f"{MIN_SPLIT_K_STEPS} k-steps per split")
        per = math.ceil(k_iters / splits)
        return (f"K={K} is {k_iters} k-steps of {BK}: ranges of {per} fill only "
                f"{_no_empty_split(splits, k_iters)} of {splits} splits (a split would be empty)")
    return None


def _capacity_of(capacity: dict[int, int] | Callable[[], dict[int, int]] | None) -> dict[int, int]:
    return (capacity() if callable(capacity) else capacity) or H200_CLUSTER_CAPACITY


def validate_plan(plan, K: int, capacity: dict[int, int] | Callable[[], dict[int, int]] | None = None
                  ) -> tuple[int, int]:
    """``plan`` as ``(bn, splits)`` if ``gemm`` can run it at depth ``K``; else ``UnsupportedProblem`` saying
    why. ``capacity``: as for ``choose_plan`` (asked only for a split plan: its cluster must launch)."""
    try:
        bn, splits = (operator.index(v) for v in plan)
    except (TypeError, ValueError):
        raise UnsupportedProblem(f"plan must be (BN, splits), two integers; got {plan!r}") from None
    why = plan_problem(K, bn, splits)
    if why is None and splits > 1 and _capacity_of(capacity).get(splits, 0) < 1:
        why = f"this GPU cannot launch a cluster of {splits} CTAs of the split-K kernel"
    if why is not None:
        raise UnsupportedProblem(f"plan (BN={bn}, splits={splits}) at K={K}: {why}")
    return bn, splits


TUNED_STEP = "hopper.h11_general"  # the registry step whose tuned configs are the engine's plans


def plan_for(M: int, N: int, K: int, sm_count: int,
             capacity: dict[int, int] | Callable[[], dict[int, int]] | None = None, *,
             gpu: tuned.GpuKey | None = None) -> tuple[int, int]:
    """The (tile width, split count) ``gemm`` runs when no plan is forced: ``tuned_plan``, else
    ``choose_plan``."""
    return tuned_plan(M, N, K, sm_count, capacity, gpu=gpu) or choose_plan(M, N, K, sm_count, capacity)


def tuned_plan(M: int, N: int, K: int, sm_count: int,
               capacity: dict[int, int] | Callable[[], dict[int, int]] | None = None, *,
               gpu: tuned.GpuKey | None = None) -> tuple[int, int] | None:
    """The winner ``gemmlab tune hopper.h11_general`` saved for exactly (M, N, K) on ``gpu`` while it is
    still a plan the engine runs there (exactly the keys BN and SPLITS, ``plan_problem`` finds nothing, its
    cluster launches: ``capacity`` as for ``choose_plan``), else None. ``gpu`` None: no lookup, and one
    whose SM count is not ``sm_count`` neither. The lookup is one ``stat`` of the file
    (``tuned.saved_config``); ``gemmlab.ops`` keeps the answer per call key and watches the files
    (``tuned_plans_stamp``)."""
    if gpu is None or gpu.sm_count != sm_count:
        return None
    _PLANNED.add(gpu)
    cfg = tuned.saved_config(TUNED_STEP, M, N, K, gpu)
    if cfg is None or set(cfg) != {"BN", "SPLITS"}:
        return None
    bn, splits = cfg["BN"], cfg["SPLITS"]
    if plan_problem(K, bn, splits) is None and (splits == 1 or _capacity_of(capacity).get(splits, 0) >= 1):
        return bn, splits
    return None


_PLANNED: set = set()  # the GPUs plan_for has looked up tuned plans for


def tuned_plans_stamp() -> tuple:
    """What plans chosen so far depend on besides the shape: the tuned-plan file of each GPU ``plan_for``
    looked up (``tuned.tuned_file_stamp``). Callers that keep prepared launches compare it to know
    when to forget them (``gemmlab.ops``); ``tuned.SAVES`` counts saves in this process."""
    return tuple(tuned.tuned_file_stamp(gpu) for gpu in sorted(_PLANNED, key=repr))


def visible_capacity(sm_count: int) -> dict[int, int] | None:
    """``cluster_capacity`` of the current GPU when it is a Hopper with ``sm_count`` SMs (asked once), else
    None: ``choose_plan`` then plans with the H200's table."""
    if not torch.cuda.is_available():
        return None
    device = torch.device("cuda", torch.cuda.current_device())
    if hopper_available(device) is not None or _sm_count(device) != sm_count:
        return None
    return cluster_capacity(device)


_CAPACITY: dict[int, dict[int, int]] = {}


def cluster_capacity(device: torch.device) -> dict[int, int]:
    """Clusters of 1..MAX_CLUSTER one-SM CTAs that ``device`` holds at once (asked once per device with
    the bf16 split-K kernel, whose shared memory keeps one CTA per SM as every split-K variant does)."""
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _CAPACITY:
        q = _qsize(128, 2, split=True)
        expr = f"hopper_h11<__nv_bfloat16, __nv_bfloat16, float, 128, {q}, 0, 0, 0, 1, 0>"
        compiled = compile_kernel(SOURCE, expr, arch="sm_90a", name=f"hopper.h11_general[{expr[11:-1]}]")
        smem = smem_bytes(128, q, 2, split=True)
        _CAPACITY[idx] = {s: max_active_clusters(compiled, block=384, smem=smem, cluster=s)
                          for s in range(1, MAX_CLUSTER + 1)}
    return _CAPACITY[idx]


_SM_COUNT: dict[int, int] = {}


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def _sm_count(device: torch.device) -> int:
    idx = _index(device)
    if idx not in _SM_COUNT:
        _SM_COUNT[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SM_COUNT[idx]


def _memory_peak(device: torch.device) -> float | None:
    """The memory peak of ``device`` in bytes/s (``gpu.gpu_info``'s, read once per GPU; None: unknown)."""
    from .gpu import gpu_info

    return gpu_info(_index(device)).hbm_peak_bytes_per_s


def a_rows_loaded(M: int, a_mn: bool) -> int:
    """Rows of A that h11 loads for a tile whose rows m0 + 64 .. lie past M (the last row of tiles, or
    every tile when M <= 64): the rows left in that tile rounded up to 8 (a K-major box may be as short as
    that; the MMA rows past them only make output rows past M, never stored), 64 when the last tile
    fills more than half its rows (no tile uses the short box then), and 64 for MN-major A (its box is
    64 rows of M wide)."""
    left = M - (math.ceil(M / BM) - 1) * BM
    if a_mn or left > 64:
        return 64
    return math.ceil(left / 8) * 8


DECODE_MAX_WEIGHT_DIM = 12288  # past it, h11 streams a weight faster than the decode kernel at any M
# Nor does the router send the decode kernel a call its plan splits K for: on each of the broad set's five
# such shapes (1 x 576 x 5120, 2 x 576 x 7168, 16 x 1024 x 2560, 32 x 896 x 4864, 32 x 1024 x 5120; H200,
# shas 3f0f16e and c2b08e8) the engine kernel's swapped split-K plan ran 1.40-1.81x faster, and one of them
# (2 x 576 x 7168) was priced the decode kernel's way (7.9 against 8.0 us): 0.92x torch.mm against 1.29x.


def use_decode(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> bool:
    """Whether ``a @ b`` may run on the decode kernel (``gemmlab.decode``: M <= decode.MAX_M, K-contiguous
    operands, rows at any address); ``route`` then runs it where ``decode.cost_s`` prices it at most the
    engine kernel's best plan (with its operand copies, ``copies_s``, where the rows are not 16-byte aligned).

    Weights with a dimension past DECODE_MAX_WEIGHT_DIM go to h11 at every M (its TMA pipeline keeps
    more bytes in flight). On the H200 (engine_policies.jsonl): at M = 16, 16x28672x8192 ran 116 us on
    h11 against 141 us and 16x8192x28672 116 against 138 (sha 227f35c); once h11 loaded only the rows of
    A that exist (``a_rows_loaded``) also M <= 8 (sha 6ea410a): 1x14336x4096 31.8 against 35.6 us,
    1x8192x28672 112.1 against 124.0, 1x28672x8192 118.4 against 130.5, 8x14336x4096 32.2 against 35.9.
    8192x8192 (h11 36.1 against 35.7 us at M = 1) and 4096-wide weights (1x4096x4096: 13.5 against 10.8)
    stay on the decode kernel. Rows TMA cannot read (``decode.aligned`` false) stay at any size: h11 and the
    engine kernel would copy the weight first, reading and writing all of it, and the decode kernel reads it
    in place once."""
    if decode.why_not(a, b, out) is not None:
        return False
    return max(b.shape[1], a.shape[1]) <= DECODE_MAX_WEIGHT_DIM or not decode.aligned(a, b)


def copies_s(a: torch.Tensor, b: torch.Tensor, prof: DeviceProfile) -> float:
    """What the operand copies ``_operand_plan`` makes for these tensors (where TMA cannot read one as it is)
    add to a call on the engine kernel or h11: ``copy_fixed_s`` (the copy launch's gap; fitted at 0, its PDL
    trigger hides it), then every copied byte read and written, at ``copy_resident_bytes_per_s`` up to
    ``copy_resident_share`` of the L2 (the GEMM reads those back from L2) and at ``copy_bytes_per_s`` past it
    (see ``DeviceProfile``); 0 where nothing is copied. Metadata only."""
    nbytes = sum(x.numel() * x.element_size() for x, k in ((a, 1), (b, 0)) if _operand_layout(x, k)[1] is None)
    if not nbytes:
        return 0.0
    resident = prof.copy_resident_share * prof.l2_bytes
    return prof.copy_fixed_s + 2.0 * (min(nbytes, resident) / prof.copy_resident_bytes_per_s
                                      + max(0.0, nbytes - resident) / prof.copy_bytes_per_s)


def gemm(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, *, bias: torch.Tensor | None = None,
         activation: str | None = None, alpha: float = 1.0, beta: float = 0.0,
         c: torch.Tensor | None = None, plan=None) -> None:
    """out = act(alpha * a @ b + beta * c + bias), see the module docstring. Inputs are validated by the caller.

    a: (M, K), b: (K, N), any strides, both bf16 or both fp16. out: (M, N) contiguous, bf16/fp16/fp32.
    c: (M, N) in out's dtype, any strides (used when beta != 0). bias: (N,) contiguous, a's dtype or fp32.
    plan: (BN, splits) to run h11 with, even at a decode shape (``validate_plan``; UnsupportedProblem if
    the engine cannot run it), a ``planner.Plan`` to run the engine kernel with (``Engine2Launch``), or
    "decode" for the decode kernel where ``use_decode`` allows it; None: what ``route`` chooses.
    Launches on torch's current stream. ``prepare`` + ``run``: callers that repeat a call keep the prepared
    launch (``gemmlab.ops`` does, per metadata key) instead of deciding everything again.
    """
    has_c = c is not None and beta != 0.0
    call = prepare(a, b, out, bias=bias, activation=activation, has_c=has_c, c=c if has_c else None, plan=plan)
    call.run(raw_stream(_index(a.device)), a, b, out, bias, c if has_c else None, alpha, beta)


def prepare(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, *, bias: torch.Tensor | None,
            activation: str | None, has_c: bool, c: torch.Tensor | None, plan=None):
    """Everything ``gemm`` decides, decided once for tensors with the metadata of these (shapes, strides,
    dtypes, 16-byte alignment of the data pointers, device): the kernel (``route``: decode, h11 or the
    engine kernel), its plan, instantiation, launch shape and parameter block. Returns an object whose
    ``run(stream, a, b, out, bias, c, alpha, beta)`` launches it for any tensors with that same metadata
    (only their addresses and the scalars may differ; the caller guarantees the rest, e.g. by keying on it).
    ``plan``: None, an h11 plan (BN, splits), a ``planner.Plan`` of the engine kernel, or "decode" (forced)."""
    M, K = a.shape
    N = b.shape[1]
    if a.dtype not in (torch.bfloat16, torch.float16) or b.dtype != a.dtype:
        raise UnsupportedProblem(f"the Hopper engine takes bf16 or fp16 operands of one dtype, got {a.dtype}, {b.dtype}")
    if activation not in ACTIVATIONS:
        raise UnsupportedProblem(f"unknown activation {activation!r}; known: {[k for k in ACTIVATIONS if k]}")
    r = route(a, b, out, bias=bias, activation=activation, has_c=has_c, plan=plan, sm_count=lambda: _sm_count(a.device),
              capacity=lambda: cluster_capacity(a.device), gpu=lambda: tuned.device_gpu(_index(a.device)),
              memory_peak=lambda: _memory_peak(a.device))
    if r.kernel == "decode":
        logger.debug("matmul %dx%dx%d %s: %r", M, N, K, a.dtype, r)
        return decode.prepare(a, b, out, epi=epi_bits(bias is not None, has_c, activation),
                              ctypes=ctypes(a.dtype, out.dtype, None if bias is None else bias.dtype), c=c,
                              bias=bias, sm_count=_sm_count(a.device))
    if r.kernel == "engine":
        launch = Engine2Launch(a, b, out, bias=bias, c=c, plan=r.plan)
        logger.debug("matmul %dx%dx%d %s: engine kernel %r (%s)", M, N, K, a.dtype, r.plan, r.how)
        return launch
    launch = H11Launch(a, b, out, bias=bias, activation=activation, has_c=has_c, c=c, plan=r.h11)
    logger.debug("matmul %dx%dx%d %s: h11 BN=%d splits=%d (%s)%s%s", M, N, K, a.dtype, r.h11[0], r.h11[1], r.how,
                 " direct-store" if launch.direct else "",
                 " copies " + "+".join(n for n, cp in (("A", launch.copy_a), ("B", launch.copy_b)) if cp)
                 if launch.copy_a or launch.copy_b else "")
    return launch


# The router ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Route:
    """What ``gemmlab.matmul`` runs for one call: ``kernel`` "decode" (``gemmlab.decode``), "h11" (the
    ladder's general step, plan ``h11`` = (BN, splits)), "engine" (the engine kernel, ``plan``) or, for
    float32 inputs (``gemmlab.plan`` only), "sgemm": the fp32 ladder's ``step`` with its ``config``.
    ``plan``: the engine kernel's best plan by the model (also when h11 or the decode kernel runs; None for
    forced and tuned h11 plans); ``h11_s``: h11's plan priced by the
    same model x ``h11_factor`` (None where not weighed); ``decode_s``: the decode kernel's price
    (``decode.cost_s``; None where ``use_decode`` rules it out); ``engine_s``: the engine kernel's price the
    other two were weighed against (``_engine_plan``; None where none was weighed); ``copies_s``: what that
    kernel's operand copies add (``copies_s``) where the decode kernel would read the rows in place and was
    weighed against the engine kernel plus them (None otherwise); ``how``: why this kernel ("decode priced",
    "tuned", "forced", "model")."""

    kernel: str
    M: int
    N: int
    K: int
    how: str
    plan: planner.Plan | None = None
    h11: tuple[int, int] | None = None
    h11_s: float | None = None
    decode_s: float | None = None
    engine_s: float | None = None
    copies_s: float | None = None
    step: str | None = None
    config: tuple | None = None  # "sgemm": the step's config as (name, value) pairs

    def __repr__(self) -> str:
        head = f"Route({self.M}x{self.N}x{self.K}: "
        if self.kernel == "sgemm":
            cfg = ", ".join(f"{k}={v}" for k, v in self.config or ())
            blocks = f"; {self.how}" if self.how != "fp32 inputs" else ""  # row blocks (gemmlab.fp32)
            return head + (f"fp32 CUDA-core ladder, {self.step} ({cfg}){blocks}; bias and activation as torch ops "
                           "after it)")
        if self.kernel == "decode":
            if self.decode_s is None:
                return head + f"decode kernel (gemmlab.decode, {self.how}))"
            other = (f"; the engine kernel's best: {self.plan!r}" if self.plan is not None else "")
            return head + f"decode kernel (gemmlab.decode) priced {self.decode_s * 1e6:.1f} us{other}{self._weighed()})"
        h11 = (f"h11 BN={self.h11[0]} splits={self.h11[1]}" if self.h11 else "")
        priced = f" priced {self.h11_s * 1e6:.1f} us" if self.h11_s is not None else ""
        passed = "" if self.decode_s is None else f"; gemmlab.decode priced {self.decode_s * 1e6:.1f} us"
        if self.kernel == "h11":
            other = f"; the engine kernel's best: {self.plan!r}{self._weighed()}" if self.plan is not None else ""
            return head + f"{h11} ({self.how}){priced}{other}{passed})"
        other = f"; {h11}{priced}" if self.h11 else ""
        return head + f"engine kernel ({self.how}): {self.plan!r}{self._weighed()}{other}{passed})"

    def _weighed(self) -> str:
        """The engine kernel's price as the router weighed it, where that is not its plan's own (a swapped
        plan priced as the best plain one, the small split-K discount left out), and its operand copies."""
        out = ""
        if self.engine_s is not None and self.plan is not None and abs(self.engine_s - self.plan.predicted_s) > 5e-8:
            out = f" weighed at {self.engine_s * 1e6:.1f} us"
        if self.copies_s is not None:
            out += f" + its operand copies {self.copies_s * 1e6:.1f} us"
        return out


_PROFILES: dict[tuple, DeviceProfile] = {}


def plan_profile(sm_count: int, capacity: dict[int, int] | None = None, stream_k: bool = True) -> DeviceProfile:
    """The plan model's profile for a GPU with ``sm_count`` SMs and the cluster table ``capacity`` (asked of
    the GPU: ``cluster_capacity``; None: the H200's in proportion to the SMs, ``devices.with_sm_count``),
    stream-K offered or not (``devices.stream_k_offered``): the H200's other constants. One object per
    (SMs, table, stream-K), so that the planner's cache keeps its plans."""
    key = (sm_count, tuple(sorted(capacity.items())) if capacity is not None else None, stream_k)
    prof = _PROFILES.get(key)
    if prof is None:
        prof = with_sm_count(H200, sm_count, capacity)
        if not stream_k:
            prof = dataclasses.replace(prof, stream_k_offered=False)
        prof = _PROFILES[key] = prof if prof is H200 else dataclasses.replace(prof, source="gpu")
    return prof


def h11_cost(M: int, N: int, K: int, *, prof: DeviceProfile = H200, plan: tuple[int, int] | None = None,
             clock_mhz: float | None = None, out_bytes: int = 2, direct: bool = False) -> float:
    """h11's plan (``choose_plan``'s unless given) priced by ``gemmlab.plan_cost`` as the engine kernel's
    128-row plan with h11's ring depth, its epilogue overlapped with the next tile's k-steps where h11
    overlaps it (16-bit TMA-stored output, no split), without ``h11_factor``."""
    bn, splits = plan or choose_plan(M, N, K, prof.sm_count)
    return plan_cost.predict_s(M, N, K, bm=BM, bn=bn, schedule="split_k" if splits > 1 else "data_parallel",
                               stages=_qsize(bn, 2, split=splits > 1), splits=splits, prof=prof, clock_mhz=clock_mhz,
                               out_bytes=out_bytes, direct=direct,
                               overlap=out_bytes == 2 and not direct and splits == 1,
                               misaligned=plan_cost.misaligned_pitch(K))


def decode_shape(M: int, N: int, K: int) -> bool:
    """``use_decode`` for contiguous, aligned operands (a: (M, K) row-major, the weight K-contiguous), as the
    benchmarks that replay the router on records ask it. Contiguous operands with K % 8 != 0 may take the
    decode kernel too (``route`` weighs it against the engine kernel plus its copies, ``copies_s``); records
    before session 42 have only the engine kernel's times for them, so the replays leave them there."""
    return M <= decode.MAX_M and max(N, K) <= DECODE_MAX_WEIGHT_DIM and K % 8 == 0


def route(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, *, bias: torch.Tensor | None,
          activation: str | None, has_c: bool, plan=None, sm_count: int | Callable[[], int],
          capacity: dict[int, int] | Callable[[], dict[int, int]] | None = None,
          gpu: Callable[[], tuned.GpuKey | None] | None = None,
          memory_peak: float | Callable[[], float | None] | None = None,
          profile: DeviceProfile | None = None) -> Route:
    """Which kernel and plan ``prepare`` builds for these tensors (metadata only: meta tensors will do).
    The one place the choice is made (``gemmlab.plan`` and ``gemmlab.warm`` ask it too):

    1. ``plan`` forced: an (BN, splits) pair runs h11, a ``planner.Plan`` the engine kernel, "decode" the
       decode kernel (UnsupportedProblem where ``use_decode`` rules it out);
    2. where ``use_decode`` allows the decode kernel, it runs if its price (``decode.cost_s``) is at most
       the engine kernel's best plan's (the plan model's) and its plan keeps K whole (see ``DECODE_MAX_WEIGHT_DIM``);
       otherwise the call goes on to 3 and 4;
    3. a plan ``gemmlab tune hopper.h11_general`` saved for this shape on this GPU: h11;
    4. otherwise the plan model prices the engine kernel's best plan and h11's ``choose_plan`` plan
       (``h11_cost`` x the profile's ``h11_factor``, fitted to h11's broad-set records) and the cheaper
       runs; ties go to h11, the kernel with the longer record.

    sm_count: the GPU's SMs (or a function returning it); capacity: its cluster table (or a function
    returning it), which h11's plan and, on a GPU of other than the H200's 132 SMs, the engine kernel's plan
    (``plan_profile``) are sized by; gpu: a function returning its ``tuned.GpuKey`` (asked only for step 3);
    memory_peak: its memory's peak in bytes/s (or a function returning it; None: unknown, as the H200),
    which decides whether the engine kernel's plan may be stream-K (``devices.stream_k_offered``); profile:
    plan with this one instead (the benchmarks that replay the router on records under other constants,
    ``benchmarks/pick_vs_oracle.py``; sm_count, capacity and memory_peak then size h11's plan only)."""
    M, K = a.shape
    N = b.shape[1]
    if isinstance(plan, planner.Plan):
        return Route("engine", M, N, K, "forced", plan=plan)
    if isinstance(plan, str):
        if plan != "decode":
            raise UnsupportedProblem(f"unknown plan {plan!r}: 'decode', an h11 (BN, splits) or a planner.Plan")
        if not use_decode(a, b, out):
            why = decode.why_not(a, b, out) or "a weight dimension past DECODE_MAX_WEIGHT_DIM"
            raise UnsupportedProblem(f"the decode kernel cannot run this call: {why}")
        return Route("decode", M, N, K, "forced")
    if plan is not None:
        return Route("h11", M, N, K, "forced", h11=validate_plan(plan, K, capacity))
    if callable(sm_count):
        sm_count = sm_count()
    # The GPU's cluster table (asked once per GPU) where it has other than the H200's 132 SMs; a 132-SM GPU
    # plans with the H200's table, the one the model was fitted with.
    own = None if sm_count == H200.sm_count or capacity is None else _capacity_of(capacity)
    prof = profile or plan_profile(sm_count, own,
                                   stream_k_offered(memory_peak() if callable(memory_peak) else memory_peak))
    direct = not _tma_ok(out)
    new = None
    decode_s = copies = None
    if use_decode(a, b, out):
        new, new_s = _engine_plan(a, b, out, bias, has_c, activation, direct, prof)
        in_place = not decode.aligned(a, b)
        decode_s = decode.cost_s(M, N, K, sm_count, prof, aligned=not in_place)
        copies = copies_s(a, b, prof) if in_place else None
        if decode_runs(M, N, K, sm_count, decode_s, new_s, copies, prof=prof):
            return Route("decode", M, N, K, "decode priced", plan=new, decode_s=decode_s, engine_s=new_s,
                         copies_s=copies)
    h11 = tuned_plan(M, N, K, sm_count, capacity, gpu=gpu() if gpu else None)
    if h11 is not None:
        return Route("h11", M, N, K, "tuned", h11=h11, decode_s=decode_s)
    h11 = choose_plan(M, N, K, sm_count, capacity)
    if new is None:
        new, new_s = _engine_plan(a, b, out, bias, has_c, activation, direct, prof)
    h11_s = prof.h11_factor * h11_cost(M, N, K, prof=_weighing_profile(prof), plan=h11, out_bytes=out.element_size(),
                                       direct=direct)
    kernel = "engine" if new_s < h11_s else "h11"
    return Route(kernel, M, N, K, "model", plan=new, h11=h11, h11_s=h11_s, decode_s=decode_s, engine_s=new_s,
                 copies_s=copies)


def decode_runs(M: int, N: int, K: int, sm_count: int, decode_s: float, engine_s: float,
                copies: float | None = None, *, prof: DeviceProfile) -> bool:
    """``route``'s rule 2 for a shape ``use_decode`` allows: the decode kernel's price ``decode_s``
    (``decode.cost_s``, fitted to measured times) at most the engine kernel's ``engine_s`` taken at
    ``prof.decode_weighed_engine_share`` of itself (its weighed price runs over what its plans run), and a
    decode plan that keeps K whole (see ``DECODE_MAX_WEIGHT_DIM``). ``copies``: where the decode kernel reads
    rows TMA cannot (``decode.aligned`` false), what the engine kernel's operand copies add (``copies_s``);
    then its price with them is the bar, split or not (the split-K plans' 1.4-1.8x against the engine
    kernel's is less than a copy that moves the weight twice)."""
    engine_s *= prof.decode_weighed_engine_share
    if copies is not None:
        return decode_s <= engine_s + copies
    return decode_s <= engine_s and decode.plan(M, N, K, sm_count).splits == 1


def _engine_plan(a, b, out, bias, has_c: bool, activation, direct: bool,
                 prof: DeviceProfile) -> tuple[planner.Plan, float]:
    """The engine kernel's plan for these tensors' dtypes, layouts, epilogue and output, and its price
    for weighing it against the decode kernel and h11. Up to ``planner.SWAP_PREFER_M`` tokens, and past
    ``planner.SWAP_MAX_M`` where the padding rule ranks it first (up to ``SWAP_PAD_MAX_M``), the plan is the
    model's best swapped one (it runs faster than the model says, H200 records), priced as the best plain
    plan: the router's choice of kernel stays what the model's prices of plain plans decide. Past
    ``SWAP_PAD_MAX_M`` a swapped plan is first only where the model prices it lower (SWAP_WIDE): its price.
    The price is the model's before ``plan_cost.split_sync_s`` (``_weighing_profile``): the decode kernel's
    and h11's prices were fitted against it, and the small split-K plans that discount lets the engine
    kernel pick ran 6-11% slower than the decode kernel on the decode shapes it would move there
    (1x1536x7168 1.208x torch.mm against 1.338, 2x3072x3072 1.264 against 1.416; split_sync_probe.jsonl and
    the broad run be963b8)."""
    M, K = a.shape
    (a_mn, a_pitch), (b_mn, b_pitch) = _operand_layout(a, 1), _operand_layout(b, 0)
    kw = dict(dtype=_DT[a.dtype], out_dtype=_DT[out.dtype], bias_dtype=_DT[bias.dtype] if bias is not None else None,
              has_c=has_c, activation=activation, a_mn=a_mn, b_mn=b_mn, direct=direct, profile=prof,
              a_pitch=a_pitch, b_pitch=b_pitch)
    run = planner.plan(M, b.shape[1], K, **kw)
    weigh = _weighing_profile(prof)
    if weigh is not prof and (run.schedule == "split_k" or run.swap_ab or M <= decode.MAX_M):
        kw["profile"] = weigh  # the price as the router weighed it before the discount: that profile's pick
        first = planner.plan(M, b.shape[1], K, **kw)
    else:
        first = run
    by_rule = M <= planner.SWAP_PREFER_M or planner.SWAP_MAX_M < M <= planner.SWAP_PAD_MAX_M
    if first.swap_ab and by_rule:  # a rule's pick, not the model's
        return run, planner.plan(M, b.shape[1], K, swap_ab=False, **kw).predicted_s
    return run, first.predicted_s


_WEIGHING: dict = {}


def _weighing_profile(prof: DeviceProfile) -> DeviceProfile:
    """``prof`` without ``plan_cost.split_sync_s``'s discount for small split-K partials (every partial pays
    ``cluster_sync_s``): what ``route`` weighs the engine kernel's price by (``_engine_plan``). One object per
    profile, so that the planner's cache keeps its plans."""
    if prof.cluster_sync_small_s == prof.cluster_sync_s:
        return prof
    hit = _WEIGHING.get(id(prof))
    if hit is None or hit[0] is not prof:
        hit = _WEIGHING[id(prof)] = (prof, dataclasses.replace(prof, cluster_sync_small_s=prof.cluster_sync_s))
    return hit[1]


_DT = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def plan(M: int, N: int, K: int, *, dtype=torch.bfloat16, out_dtype=None, bias_dtype=None, has_c: bool = False,
         activation: str | None = None, b_mn: bool = False, sm_count: int | None = None) -> Route:
    """What ``gemmlab.matmul`` runs for a (M, K) row-major A and a (K, N) B (``b_mn``: B row-major, N
    contiguous; default: K-contiguous, as ``w.t()`` of an nn.Linear weight), contiguous output of
    ``out_dtype`` (default: dtype), and the epilogue given: a ``Route`` that names the kernel and plan.
    sm_count: the GPU's (default: the visible GPU's, its memory's peak too, else the H200's 132). Needs no
    GPU."""
    for name, n in (("M", M), ("N", N), ("K", K)):
        if operator.index(n) < 1:
            raise ValueError(f"{name} must be >= 1, got {n}")
    memory_peak = None
    if sm_count is None and torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
        sm_count, memory_peak = _sm_count(device), _memory_peak(device)
    elif sm_count is None:
        sm_count = H200.sm_count
    out_dtype = out_dtype or dtype
    a = torch.empty((M, K), dtype=dtype, device="meta")
    b = torch.empty((K, N), dtype=dtype, device="meta") if b_mn else torch.empty((N, K), dtype=dtype, device="meta").t()
    out = torch.empty((M, N), dtype=out_dtype, device="meta")
    bias = torch.empty(N, dtype=bias_dtype, device="meta") if bias_dtype is not None else None
    return route(a, b, out, bias=bias, activation=activation, has_c=has_c, sm_count=sm_count,
                 memory_peak=memory_peak)


def _operand_mn(x: torch.Tensor, k_dim: int) -> bool:
    """Whether TMA reads the operand MN-major (``_operand_plan``'s choice, from metadata alone)."""
    return _operand_layout(x, k_dim)[0]


def _operand_layout(x: torch.Tensor, k_dim: int) -> tuple[bool, int | None]:
    """``_operand_plan``'s choice from metadata alone: whether TMA reads the operand MN-major, and the
    elements between the rows it reads where it reads ``x`` itself (None where it reads a copy, whose rows
    are 32-byte aligned): what ``planner.candidates`` judges the rows' alignment by (a_pitch / b_pitch)."""
    k_major = x.t() if k_dim == 0 else x
    mn_major = x if k_dim == 0 else x.t()
    if k_major.stride(1) == 1 and _tma_ok(k_major):
        return False, k_major.stride(0)
    if mn_major.stride(1) == 1 and _tma_ok(mn_major):
        return True, mn_major.stride(0)
    return mn_major.stride(1) == 1 and k_major.stride(1) != 1, None


class _OperandCopy:
    """An operand TMA cannot read as it is (a leading dimension or base not 16-byte aligned): copied on
    every call into a buffer with 32-byte aligned rows (a view of the copy space made once, or a fresh
    one: ``_OperandCopies``), by ``pad_copy_operands`` where the view has unit column stride and 2- or
    4-byte elements (``unit``), else by torch's copy."""

    def __init__(self, view: torch.Tensor):
        self.rows, self.cols = view.shape
        self.dtype, self.device = view.dtype, view.device
        self.es = view.element_size()
        self.unit = view.stride(1) == 1 and self.es in (2, 4)
        self.vec = rows_16b(view)  # 16-byte loads
        self.lds = view.stride(0)
        self.ldd = _aligned_empty(1, self.cols, self.dtype, "meta").stride(0)
        self.size, self.stride = (self.rows, self.cols), (self.ldd, 1)

    def fresh(self) -> torch.Tensor:
        """A new (rows, cols) buffer with rows ldd elements apart (``_aligned_empty``'s layout)."""
        return torch.empty_strided(self.size, self.stride, dtype=self.dtype, device=self.device)


class _OperandCopies:
    """The operand copies of one prepared GEMM launch (``_OperandCopy`` for A, B or both, None where the
    operand is read as it is), made on every call: the unit-stride ones in one launch of
    ``pad_copy_operands`` (kernels/engine/pad_copy.cu: both operands' copies in one grid, launched with
    PDL so the GEMM after it is scheduled as its last blocks copy), the others by torch's copy.

    ``kept``: the caller launches the GEMM that reads the copies right after this call, in the same thread
    (``Engine2Launch.run``, ``H11Launch.run``). The copies then go into the copy space of that (device,
    stream, thread) (``copy_space``) through views made once, not into two fresh allocations a call (2.5-5
    us of host time each, H200 host), where both fit in ``COPY_SPACE_MAX_BYTES`` and no graph is being
    captured. Each call's copy kernel waits for the kernel before it (``pdl_wait``; torch's copy waits
    anyway), so it cannot overwrite what the previous GEMM on the stream still reads."""

    def __init__(self, copy_a: _OperandCopy | None, copy_b: _OperandCopy | None, *, kept: bool = False):
        self.a, self.b = copy_a, copy_b
        units = [i for i, c in enumerate((copy_a, copy_b)) if c is not None and c.unit]
        self.torch_copies = [i for i, c in enumerate((copy_a, copy_b)) if c is not None and not c.unit]
        # A and B share one dtype (ops._validate), so one launch takes both jobs
        self.launch = _CopyLaunch([(copy_a, copy_b)[i] for i in units], units) if units else None
        first = copy_a or copy_b
        self.device = first.device
        self.offsets = (0, _space_bytes(copy_a))  # where A's and B's copies start in the copy space
        self.nbytes = self.offsets[1] + _space_bytes(copy_b)
        self.kept = kept and self.nbytes <= COPY_SPACE_MAX_BYTES
        # Without torch's copies, only addresses are read (the pad copy's sources, the GEMM's operands), and
        # a transposed view has its tensor's address: the callers may pass the tensors, not views of them.
        self.addresses_only = not self.torch_copies
        self._views: dict[tuple, tuple] = {}  # (stream, thread) -> (the space, the two views of it)

    def __call__(self, va: torch.Tensor, vb: torch.Tensor, stream: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The tensors TMA reads: va / vb where they need no copy, else aligned copies of them. With
        ``addresses_only``, va / vb may be the operands themselves rather than the views TMA reads."""
        srcs = (va, vb)
        dsts = None
        if self.kept and not (self.device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
            key = (stream, threading.get_ident())
            space = copy_space(self.device, stream, self.nbytes)
            kept = self._views.get(key)
            if kept is None or kept[0] is not space:
                if len(self._views) >= _COPY_KEYS_MAX:
                    self._views.clear()
                kept = self._views[key] = (space, self._carve(space, va, vb))
            dsts = kept[1]
            if self.a is None or self.b is None:  # the operand read as it is changes from call to call
                dsts = (va, dsts[1]) if self.a is None else (dsts[0], vb)
        if dsts is None:
            dsts = (va if self.a is None else self.a.fresh(), vb if self.b is None else self.b.fresh())
        for i in self.torch_copies:
            dsts[i].copy_(srcs[i])
        if self.launch is not None:
            self.launch(srcs, dsts, stream)
        return dsts

    def _carve(self, space: torch.Tensor, va: torch.Tensor, vb: torch.Tensor) -> tuple:
        """Views of ``space`` laid out as ``_OperandCopy.fresh`` lays a copy out (va / vb where none)."""
        views = []
        for c, v, at in zip((self.a, self.b), (va, vb), self.offsets):
            views.append(v if c is None else space[at:at + _space_bytes(c)].view(c.dtype).as_strided(c.size, c.stride))
        return tuple(views)


def _copied(launch, a: torch.Tensor, b: torch.Tensor, stream: int) -> tuple[torch.Tensor, torch.Tensor]:
    """What a prepared launch (``Engine2Launch``, ``H11Launch``: ``copies``, ``a_view``, ``b_view``) reads
    for the kernel's A and B: a and b themselves where nothing is copied, else ``copies``' result."""
    c = launch.copies
    if c is None:
        return a, b
    if c.addresses_only:
        return c(a, b, stream)
    return c(launch.a_view(a), launch.b_view(b), stream)


COPY_SPACE_MAX_BYTES = 64 * 2**20  # both copies of a call at most this big go into the copy space
_COPY_KEYS_MAX = 16  # (device, stream, thread) keys kept before starting over (threads come and go)
_COPY_SPACE: dict[tuple, torch.Tensor] = {}


def _space_bytes(c: _OperandCopy | None) -> int:
    """Bytes a copy takes in the copy space: its rows ldd elements apart, rounded up to 256."""
    return 0 if c is None else math.ceil(c.rows * c.ldd * c.es / 256) * 256


def copy_space(device: torch.device, stream: int, nbytes: int) -> torch.Tensor:
    """The bytes (uint8, at least ``nbytes``) that prepared launches on ``stream`` (a raw handle: torch's
    current stream on ``device``, as every prepared launch is run, so that torch's allocator ties the space
    to it) of ``device`` copy operands into from this thread (``_OperandCopies``' ``kept``). A space that must
    grow is replaced by one twice as big (at most ``COPY_SPACE_MAX_BYTES``); the old one lives on in the
    views made of it until their calls make new ones, and then goes back to torch's allocator, which
    gives it out again only in that stream's order. One thread's launches on one stream run in the order
    they are made; another thread's get a space of their own, so no copy of theirs can fall between one
    call's copy and its GEMM."""
    key = (device, stream, threading.get_ident())
    space = _COPY_SPACE.get(key)
    if space is None or space.numel() < nbytes:
        if space is None and len(_COPY_SPACE) >= _COPY_KEYS_MAX:
            _COPY_SPACE.clear()
        size = max(nbytes, min(2 * space.numel(), COPY_SPACE_MAX_BYTES) if space is not None else 0)
        space = _COPY_SPACE[key] = torch.empty(size, dtype=torch.uint8, device=device)
    return space


# pad_copy_operands' parameters: A's job (src, lds, dst, ldd, rows, cols, blocks), then B's (no blocks).
_COPY_PARAMS = ("ptr", "i64", "ptr", "i64", "i64", "i32", "i32", "ptr", "i64", "ptr", "i64", "i64", "i32")


def _copy_blocks(rows: int, cols: int, es: int, sm_count: int) -> int:
    """Blocks of 256 threads for a pad copy: one 16-byte chunk a thread, at most 8 blocks an SM."""
    return max(1, min(math.ceil(rows * math.ceil(cols / (16 // es)) / 256), sm_count * 8))


class _CopyLaunch:
    """``pad_copy_operands`` prepared for one or two ``_OperandCopy`` jobs (one dtype), the copies of operands
    ``slots`` (0: A, 1: B) of ``_OperandCopies``. One job: B's job repeats A's with no rows."""

    def __init__(self, jobs: list[_OperandCopy], slots: list[int]):
        self.first, self.second = slots[0], slots[-1]
        a, b = jobs[0], jobs[-1]
        expr = f"pad_copy_operands<{a.es}, {a.vec}, {b.vec}>"
        compiled = compile_kernel(PAD_COPY_SOURCE, expr, arch="sm_90a", name=f"engine.{expr}")
        sms = _sm_count(a.device)
        blocks = [_copy_blocks(j.rows, j.cols, j.es, sms) for j in jobs]
        L = self.launcher = Launcher(compiled, _COPY_PARAMS, grid=sum(blocks), block=256,
                                     device_index=_index(a.device), pdl=True)
        for base, j in ((0, a), (7, b)):
            L.set_i64(base + 1, j.lds)
            L.set_i64(base + 3, j.ldd)
            L.set_i64(base + 4, j.rows if base == 0 or len(jobs) == 2 else 0)
            L.set_i32(base + 5, j.cols)
        L.set_i32(6, blocks[0])

    def __call__(self, srcs: tuple, dsts: tuple, stream: int) -> None:
        """srcs / dsts: (A's, B's) source views and aligned destinations; this launch's slots are copied."""
        L, i, j = self.launcher, self.first, self.second
        with L.lock:
            L.set_ptr(0, srcs[i].data_ptr())
            L.set_ptr(2, dsts[i].data_ptr())
            L.set_ptr(7, srcs[j].data_ptr())
            L.set_ptr(9, dsts[j].data_ptr())
            L.launch(stream)


class _PadCopy:
    """``pad_copy`` prepared for one (shape, strides, alignment) of source and destination."""

    def __init__(self, src: torch.Tensor, dst: torch.Tensor):
        es = src.element_size()
        expr = f"pad_copy<{es}, {rows_16b(src)}, {rows_16b(dst)}>"
        compiled = compile_kernel(PAD_COPY_SOURCE, expr, arch="sm_90a", name=f"engine.{expr}")
        rows, cols = src.shape
        blocks = _copy_blocks(rows, cols, es, _sm_count(src.device))
        self.launcher = Launcher(compiled, ("ptr", "i64", "ptr", "i64", "i64", "i32"), grid=blocks, block=256,
                                 device_index=_index(src.device))
        self.launcher.set_args((src, src.stride(0), dst, dst.stride(0), rows, cols))

    def __call__(self, src: torch.Tensor, dst: torch.Tensor, stream: int) -> None:
        L = self.launcher
        with L.lock:
            L.set_ptr(0, src.data_ptr())
            L.set_ptr(2, dst.data_ptr())
            L.launch(stream)


# h11's kernel parameters, in order (hopper_h11 in kernels/hopper/h11_general.cu).
_H11_PARAMS = ("tmap", "tmap", "tmap", "tmap", "ptr", "i32", "i32", "i32", "f32", "f32", "ptr", "i64", "i64",
               "ptr", "i32", "i32", "ptr", "i64")
_A, _A_HALF, _B, _C, _ALPHA, _BETA, _CIN, _BIAS, _OUT = 0, 1, 2, 3, 8, 9, 10, 13, 16


class H11Launch:
    """One h11 launch, decided and built once (``prepare``): the instantiation, the descriptors (whose
    addresses follow the tensors passed to ``run``), the tile order and the launch shape."""

    def __init__(self, a, b, out, *, bias, activation, has_c, c, plan):
        M, K = a.shape
        N = b.shape[1]
        dev = _index(a.device)
        ta, a_mn, self.copy_a = _operand_plan(a, 1)
        tb, b_mn, self.copy_b = _operand_plan(b, 0)
        self.copies = _OperandCopies(self.copy_a, self.copy_b, kept=True) if self.copy_a or self.copy_b else None
        self.a_view, self.b_view = _view_fn(a_mn, 1), _view_fn(b_mn, 0)
        # An output TMA cannot write (rows not 16-byte aligned) is stored by the consumers from the epilogue's
        # slab, row by row (DIRECT). At 4095^3 that cost 33 us over a TMA store, against 51 us for an aligned
        # buffer plus a copy (benchmarks/unaligned_breakdown.py, sha 2244cdf).
        self.direct = direct = not _tma_ok(out)
        has_bias = bias is not None
        self.has_c, self.has_bias = has_c, has_bias
        epi = epi_bits(has_bias, has_c, activation) | (DIRECT if direct else 0)
        sm = _sm_count(a.device)
        bn, splits = self.plan = plan
        q = _qsize(bn, a.element_size(), split=splits > 1)
        t_in, t_out, tbias = ctypes(a.dtype, out.dtype, bias.dtype if has_bias else None)
        tiles_m, tiles_n = math.ceil(M / BM), math.ceil(N / bn)
        tiles = tiles_m * tiles_n
        # The overlapped epilogue (stores under the next tile's k-steps) needs a 16-bit TMA-stored output and
        # whole tiles (no split-K fixup).
        overlap = out.element_size() == 2 and not direct and splits == 1
        expr = (f"hopper_h11<{t_in}, {t_out}, {tbias}, {bn}, {q}, {int(a_mn)}, "
                f"{int(b_mn)}, {epi}, {int(splits > 1)}, {int(overlap)}>")
        self.compiled = compile_kernel(SOURCE, expr, arch="sm_90a", name=f"hopper.h11_general[{expr[11:-1]}]")
        smem = smem_bytes(bn, q, a.element_size(), split=splits > 1)
        # Split-K: one CTA per (tile, split), a tile's splits one cluster.
        grid, cluster = (tiles * splits, splits) if splits > 1 else (min(sm, tiles), None)
        L = self.launcher = Launcher(self.compiled, _H11_PARAMS, grid=grid, block=384, smem=smem, cluster=cluster,
                                     device_index=dev)
        self.order = device_order_table("hilbert", tiles_m, tiles_n, 8, a.device)
        cin = c if has_c else out
        a_rows = a_rows_loaded(M, a_mn)
        for i, v in ((4, self.order), (10, cin), (13, bias if has_bias else out), (16, out)):
            L.set_ptr(i, v.data_ptr())
        for i, v in ((5, M), (6, N), (7, K), (14, splits), (15, a_rows)):
            L.set_i32(i, v)
        for i, v in ((11, cin.stride(0)), (12, cin.stride(1)), (17, out.stride(0))):
            L.set_i64(i, v)
        # K-major A: a 128-row box, and a shorter one (a_rows_loaded) for tiles whose second half lies past M.
        # MN-major A: 64 x 64 boxes (the 128-byte swizzle's widest), two per tile or one.
        pa, pb = ta.data_ptr(), tb.data_ptr()
        self.map_a = MapSlot(L, _A, pa, *ta.shape, ta.stride(0), ta.dtype, (BK, 64) if a_mn else (BM, BK))
        self.map_a_half = self.map_a if a_mn else MapSlot(L, _A_HALF, pa, *ta.shape, ta.stride(0), ta.dtype,
                                                          (a_rows, BK))
        L.set_map(_A_HALF, self.map_a_half.tmap)
        self.map_b = MapSlot(L, _B, pb, *tb.shape, tb.stride(0), tb.dtype, (BK, 64) if b_mn else (bn, BK))
        piece = 32 if out.element_size() == 4 else 64
        # DIRECT never touches the C map: it gets A's.
        self.map_c = None if direct else MapSlot(L, _C, out.data_ptr(), M, N, out.stride(0), out.dtype, (64, piece))
        if direct:
            L.set_map(_C, self.map_a.tmap)

    def run(self, stream: int, a, b, out, bias, c, alpha: float, beta: float) -> None:
        ta, tb = _copied(self, a, b, stream)
        L = self.launcher
        with L.lock:
            pa = ta.data_ptr()
            self.map_a.point_at(pa)
            if self.map_a_half is not self.map_a:
                self.map_a_half.point_at(pa)
            self.map_b.point_at(tb.data_ptr())
            po = out.data_ptr()
            if self.map_c is not None:
                self.map_c.point_at(po)
            L.set_f32(_ALPHA, alpha)
            L.set_f32(_BETA, beta)
            L.set_ptr(_CIN, c.data_ptr() if self.has_c else po)
            L.set_ptr(_BIAS, bias.data_ptr() if self.has_bias else po)
            L.set_ptr(_OUT, po)
            L.launch(stream)


class OutputMaps:
    """The two output descriptors of the engine kernels (``gemm.cu`` and ``gemm_fp8.cu``), following
    ``out``'s address: the full store piece's box and the tail piece's (else the first map again). A
    DIRECT plan never touches them: both parameters get ``stand_in`` (A's ``MapSlot``), and nothing
    follows ``out``."""

    __slots__ = ("c", "tail")

    def __init__(self, launcher: Launcher, i_c: int, i_tail: int, out: torch.Tensor, boxes, direct: bool,
                 stand_in: MapSlot):
        """``boxes``: (full piece's box, tail piece's box or None, the tail's swizzle bytes), as
        ``planner.Plan.store_boxes`` gives them (``store_boxes`` below for a plain row-major store)."""
        self.c = self.tail = None
        if direct:
            launcher.set_map(i_c, stand_in.tmap)
            launcher.set_map(i_tail, stand_in.tmap)
            return
        M, N = out.shape
        box, tail, tail_swizzle = boxes
        self.c = MapSlot(launcher, i_c, out.data_ptr(), M, N, out.stride(0), out.dtype, box)
        if tail:
            self.tail = MapSlot(launcher, i_tail, out.data_ptr(), M, N, out.stride(0), out.dtype, tail,
                                swizzle_bytes=tail_swizzle)
        else:
            launcher.set_map(i_tail, self.c.tmap)

    def point_at(self, ptr: int) -> None:
        if self.c is not None:
            self.c.point_at(ptr)
            if self.tail is not None:
                self.tail.point_at(ptr)


def store_boxes(bn: int, out: torch.Tensor) -> tuple:
    """A row-major tile store's boxes over ``out``: 64 x piece (piece: 32 fp32 or 64 16-bit columns, one
    128-byte swizzle row) and, where ``bn`` is no multiple of piece, an unswizzled 64 x (bn % piece) tail."""
    piece = 32 if out.element_size() == 4 else 64
    return (64, piece), ((64, bn % piece) if bn % piece else None), 0


def point_maps(launch, pa: int, pb: int, po: int) -> None:
    """Point a prepared engine-kernel launch's operand descriptors (``map_a``, ``map_a_short``, ``map_b``,
    ``map_b_short``, ``maps_c``: ``Engine2Launch``'s and ``engine2.Fp8Launch``'s) at A, B and the output's
    addresses."""
    launch.map_a.point_at(pa)
    if launch.map_a_short is not launch.map_a:
        launch.map_a_short.point_at(pa)
    launch.map_b.point_at(pb)
    if launch.map_b_short is not launch.map_b:
        launch.map_b_short.point_at(pb)
    launch.maps_c.point_at(po)


# The engine kernel's parameters, in order (engine_gemm in kernels/engine/gemm.cu).
_E2_PARAMS = ("tmap", "tmap", "tmap", "tmap", "tmap", "ptr", "i32", "i32", "i32", "f32", "f32", "ptr", "i64", "i64",
              "ptr", "ptr", "i64", "i32", "i32", "i32", "i32", "ptr", "ptr", "tmap", "i32")
_E2_A, _E2_A_SHORT, _E2_B, _E2_C, _E2_C_TAIL, _E2_B_SHORT = 0, 1, 2, 3, 4, 23
_E2_ALPHA, _E2_BETA, _E2_CIN, _E2_BIAS, _E2_OUT, _E2_WS, _E2_FLAGS = 9, 10, 11, 14, 15, 21, 22


class Engine2Launch:
    """One launch of the engine kernel (``kernels/engine/gemm.cu``) for a ``planner.Plan``, built once as
    ``H11Launch`` is: the instantiation, descriptors that follow the tensors passed to ``run``, the tile
    order and the launch shape; a stream-K plan also finds its workspace per stream (``stream_k_workspace``)."""

    def __init__(self, a, b, out, *, bias, c, plan: planner.Plan):
        p = self.plan = plan
        if (a.shape[0], b.shape[1], a.shape[1]) != (p.M, p.N, p.K):
            raise UnsupportedProblem(f"plan is for {p.M}x{p.N}x{p.K}, the operands are "
                                     f"{a.shape[0]}x{b.shape[1]}x{a.shape[1]}")
        # Swap AB: the kernel's A is the weight (b^T, N x K) and its B the tokens (a^T, K x M); ``run``
        # swaps the two tensors (their addresses are all it reads) and the copies' views transpose first.
        self.swap_ab = p.swap_ab
        ka, kb = kernel_operands(p, a, b)
        M, K = ka.shape
        N = kb.shape[1]
        ta, a_mn, self.copy_a = _operand_plan(ka, 1)
        tb, b_mn, self.copy_b = _operand_plan(kb, 0)
        self.copies = _OperandCopies(self.copy_a, self.copy_b, kept=True) if self.copy_a or self.copy_b else None
        self.direct = direct = not _tma_ok(out)
        if (a_mn, b_mn, direct) != (p.kernel_a_mn, p.kernel_b_mn, p.direct):
            raise UnsupportedProblem(f"plan is for a_mn={p.a_mn}, b_mn={p.b_mn}, direct={p.direct}; the tensors "
                                     f"give {b_mn if p.swap_ab else a_mn}, {a_mn if p.swap_ab else b_mn}, {direct}")
        if (bias is not None) != (p.bias_dtype is not None) or (c is not None) != p.has_c:
            raise UnsupportedProblem("the plan's epilogue (bias, beta * C) does not match the arguments")
        self.a_view, self.b_view = _view_fn(a_mn, 1), _view_fn(b_mn, 0)
        if p.swap_ab:
            fa, fb = self.a_view, self.b_view
            self.a_view, self.b_view = (lambda x: fa(x.t())), (lambda x: fb(x.t()))
        self.has_c, self.has_bias = p.has_c, bias is not None
        self.dev = dev = _index(a.device)
        self.compiled = compile_kernel(planner.SOURCE, p.name_expression, arch="sm_90a", name=p.compiled_name)
        la = p.launch_args()
        L = self.launcher = Launcher(self.compiled, _E2_PARAMS, grid=la["grid"], block=la["block"], smem=la["smem"],
                                     cluster=la["cluster"], device_index=dev, pdl=True)
        self.order = device_order_table("hilbert", p.tiles_m, p.tiles_n, 8, a.device, pair_m=p.mcast)
        cin = c if p.has_c else out
        for i, v in ((5, self.order), (_E2_CIN, cin), (_E2_BIAS, bias if bias is not None else out), (_E2_OUT, out),
                     (_E2_WS, out), (_E2_FLAGS, out)):
            L.set_ptr(i, v.data_ptr())
        for i, v in ((6, M), (7, N), (8, K), (17, p.a_rows), (18, la["splits"]), (19, la["sk_tiles"]),
                     (20, la["sk_ctas"]), (24, p.b_rows)):
            L.set_i32(i, v)
        for i, v in zip((12, 13, 16), (*c_strides(p, cin), out.stride(0))):
            L.set_i64(i, v)
        pa, pb = ta.data_ptr(), tb.data_ptr()
        self.map_a = MapSlot(L, _E2_A, pa, *ta.shape, ta.stride(0), ta.dtype, (BK, 64) if a_mn else (p.bm, BK))
        self.map_a_short = self.map_a if a_mn else MapSlot(L, _E2_A_SHORT, pa, *ta.shape, ta.stride(0), ta.dtype,
                                                           (p.a_rows, BK))
        L.set_map(_E2_A_SHORT, self.map_a_short.tmap)
        self.map_b = MapSlot(L, _E2_B, pb, *tb.shape, tb.stride(0), tb.dtype, (BK, 64) if b_mn else (p.b_box_rows, BK))
        # K-major B: the last column of tiles loads the columns it has (Plan.b_rows; mainloop.cuh's BEdge).
        self.map_b_short = self.map_b if b_mn or p.b_rows == p.b_box_rows else MapSlot(
            L, _E2_B_SHORT, pb, *tb.shape, tb.stride(0), tb.dtype, (p.b_rows, BK))
        L.set_map(_E2_B_SHORT, self.map_b_short.tmap)
        self.maps_c = OutputMaps(L, _E2_C, _E2_C_TAIL, out, p.store_boxes(), direct, self.map_a)
        self.stream_k = p.schedule in planner.STREAMED
        if self.stream_k:  # grown now, before any graph capture of a later call could need it to grow
            stream_k_workspace(p, dev, raw_stream(dev))

    def run(self, stream: int, a, b, out, bias, c, alpha: float, beta: float) -> None:
        if self.swap_ab:
            a, b = b, a
        ta, tb = _copied(self, a, b, stream)
        ws = stream_k_workspace(self.plan, self.dev, stream) if self.stream_k else None
        L = self.launcher
        with L.lock:
            po = out.data_ptr()
            point_maps(self, ta.data_ptr(), tb.data_ptr(), po)
            L.set_f32(_E2_ALPHA, alpha)
            L.set_f32(_E2_BETA, beta)
            L.set_ptr(_E2_CIN, c.data_ptr() if self.has_c else po)
            L.set_ptr(_E2_BIAS, bias.data_ptr() if self.has_bias else po)
            L.set_ptr(_E2_OUT, po)
            if ws is not None:
                L.set_ptr(_E2_WS, ws[0].data_ptr())
                L.set_ptr(_E2_FLAGS, ws[1].data_ptr())
            L.launch(stream)


def kernel_operands(p: planner.Plan, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's A (rows x K) and B (K x columns) for plan ``p``: a (M, K) and b (K, N), or, swapped
    (out^T = W @ A^T), the weight b^T (N x K) and the tokens a^T (K x M)."""
    return (b.t(), a.t()) if p.swap_ab else (a, b)


def c_strides(p: planner.Plan, c: torch.Tensor) -> tuple[int, int]:
    """(ldc_row, ldc_col): the strides of C (M x N) along the kernel's tile rows and columns."""
    return (c.stride(1), c.stride(0)) if p.swap_ab else (c.stride(0), c.stride(1))


_WORKSPACES: dict = {}
_RETIRED: list = []  # replaced buffers, kept alive: CUDA graphs captured earlier still hold their addresses
# Flags buffers allocated during a graph capture ((device, stream) keys): their memory holds what the graph
# pool held until something zeroes it. Eager launches zero them once; a capture zeroes them once per capture
# sequence (its first stream-K launch), not per launch: the kernel leaves its flags at 0.
_DIRTY_FLAGS: set = set()
_ZEROED_IN: set = set()  # (key, capture id)


def _capture_id(stream: int) -> int | None:
    """The id of the capture sequence ``stream`` (a raw handle) is in, or None (not capturing, or the
    driver could not say)."""
    try:
        from cuda.bindings import driver

        res = driver.cuStreamGetCaptureInfo(driver.CUstream(stream))
        if res[0] != driver.CUresult.CUDA_SUCCESS or \
                res[1] != driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE:
            return None
        return int(res[2])
    except Exception:  # noqa: BLE001 - no answer: the caller zeroes as if each launch were a new capture
        return None


def stream_k_workspace(p: planner.Plan, device_index: int, stream: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The partial slots (fp32) and flags (int32, zero between launches: the kernel leaves every flag it
    uses at 0) of a stream-K or global split-K plan ``p`` on ``stream`` (a raw handle) of GPU
    ``device_index``. Kept per (device, stream) and grown as needed; launches on one stream run one after
    the other, so they can share it.

    Graphs: a buffer that grows is retired, never freed (a graph captured with it still writes there: on
    the H200 a freed workspace under an earlier graph was an illegal address at its replay). Flags
    allocated during a capture start as whatever the graph pool held: that capture's graph zeroes them
    (torch.zeros), every later capture zeroes them once (its first launch: a graph captured later may be
    replayed first) and the next eager launch zeroes them once. Flags allocated outside any capture are
    never zeroed again (before, each captured launch zeroed them: a fill kernel per launch in every graph).
    ``Engine2Launch`` grows the buffers when it is prepared, so a capture of a call prepared on the same
    stream allocates nothing."""
    key = (device_index, stream)
    ws, flags = _WORKSPACES.get(key, (None, None))
    need = max(1, p.workspace_floats)
    device = torch.device("cuda", device_index)
    capturing = torch.cuda.is_current_stream_capturing()
    if ws is None or ws.numel() < need:
        if ws is not None:
            _RETIRED.append(ws)
        ws = torch.empty(need, dtype=torch.float32, device=device)
    if flags is None or flags.numel() < 2 * max(1, p.sk_ctas):
        if flags is not None:
            _RETIRED.append(flags)
        flags = torch.zeros(2 * max(256, p.sk_ctas), dtype=torch.int32, device=device)
        _DIRTY_FLAGS.discard(key)
        if capturing:
            _DIRTY_FLAGS.add(key)
            cid = _capture_id(stream)
            if cid is not None:
                _ZEROED_IN.add((key, cid))
    elif key in _DIRTY_FLAGS:
        if not capturing:
            flags.zero_()
            _DIRTY_FLAGS.discard(key)
        else:
            cid = _capture_id(stream)
            if cid is None or (key, cid) not in _ZEROED_IN:
                flags.zero_()
                if cid is not None:
                    _ZEROED_IN.add((key, cid))
    _WORKSPACES[key] = (ws, flags)
    return ws, flags


def _operand(x: torch.Tensor, k_dim: int) -> tuple[torch.Tensor, bool]:
    """The 2-D tensor TMA reads for one operand now (a copy where ``_operand_plan`` says one is needed,
    made on torch's current stream) and whether it is MN-major: for launchers that prepare nothing."""
    view, mn, copy = _operand_plan(x, k_dim)
    if copy is None:
        return view, mn
    return _OperandCopies(copy, None)(_view_fn(mn, k_dim)(x), None, raw_stream(_index(x.device)))[0], mn


def _view_fn(mn_major: bool, k_dim: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """The 2-D view TMA reads of an operand: (MN, K) when K-major, (K, MN) when MN-major; A is (M, K)
    (k_dim 1), B is (K, N) (k_dim 0)."""
    transposed = (k_dim == 0) != mn_major
    return (lambda x: x.t()) if transposed else (lambda x: x)


def _operand_plan(x: torch.Tensor, k_dim: int):
    """How TMA reads one operand: (a tensor with the shape and strides of what it reads, whether that is
    MN-major, and None or the ``_OperandCopy`` to run on every call). The view as it is where TMA can
    read it K-major or else MN-major (no copy for either); else a 32-byte aligned copy in whichever
    order is contiguous already (cheapest), else K-major.

    ``x`` is A (M, K) with k_dim=1, or B (K, N) with k_dim=0. K-major means K is the contiguous dimension."""
    k_major = x.t() if k_dim == 0 else x  # (MN, K) view
    mn_major = x if k_dim == 0 else x.t()  # (K, MN) view
    if k_major.stride(1) == 1 and _tma_ok(k_major):
        return k_major, False, None
    if mn_major.stride(1) == 1 and _tma_ok(mn_major):
        return mn_major, True, None
    view, mn = (mn_major, True) if mn_major.stride(1) == 1 and k_major.stride(1) != 1 else (k_major, False)
    copy = _OperandCopy(view)
    return _aligned_empty(*view.shape, view.dtype, view.device), mn, copy
