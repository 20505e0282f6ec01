"""Launch the engine kernel (``kernels/engine/gemm.cu``) with a ``gemmlab.planner.Plan``, outside ``engine.py``.

The unprepared path (cuda-core's launch, ~20 us of host time): the benchmark (``benchmarks/engine_broad.py``)
and the GPU tests (``tests/test_engine2_gpu.py``) run any plan through here. ``gemmlab.matmul`` runs the
engine kernel through ``engine.Engine2Launch`` (prepared once, ~5 us a call) where ``engine.route``
chooses it. ``gemm`` takes torch tensors, works out the operand layouts (no
copy for K- or MN-major operands with 16-byte aligned rows; others are copied as ``engine`` does), and
plans unless a plan is given; ``launch`` runs one plan. Everything the launch needs that depends on the
plan (template arguments, grid, cluster, shared memory, the short A box, the stream-K workspace) comes
from the ``Plan``.
"""

from __future__ import annotations

import numpy as np
import torch

from . import planner
from .engine import (OutputMaps, _index, _operand, _operand_layout, _tma_ok, c_strides, kernel_operands, point_maps,
                     store_boxes, stream_k_workspace)
from .errors import UnsupportedProblem
from .jit.compiler import compile_kernel
from .jit.launch import Launcher, MapSlot, tensor_map_2d
from .jit.launch import launch as _launch
from .schedule import device_order_table

_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def compile_plan(p: planner.Plan):
    """The compiled instantiation of ``p`` (cached in memory and on disk; works without a GPU)."""
    return compile_kernel(planner.SOURCE, p.name_expression, arch="sm_90a", name=p.compiled_name)


def plan_for(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, *, bias: torch.Tensor | None = None,
             activation: str | None = None, has_c: bool = False) -> planner.Plan:
    """The model's plan for ``out = act(alpha * a @ b + beta * c + bias)`` with these tensors' dtypes and
    layouts (a: (M, K), b: (K, N), out: (M, N))."""
    M, K = a.shape
    N = b.shape[1]
    (a_mn, a_pitch), (b_mn, b_pitch) = _operand_layout(a, 1), _operand_layout(b, 0)
    return planner.plan(M, N, K, dtype=_NAMES[a.dtype], out_dtype=_NAMES[out.dtype],
                        bias_dtype=_NAMES[bias.dtype] if bias is not None else None, has_c=has_c,
                        activation=activation, a_mn=a_mn, b_mn=b_mn, direct=not _tma_ok(out),
                        profile=_profile(a.device), a_pitch=a_pitch, b_pitch=b_pitch)


_PROFILES: dict[int, object] = {}


def _profile(device: torch.device):
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _PROFILES:
        _PROFILES[idx] = planner._profile(None, idx)
    return _PROFILES[idx]


def plan_order(p: planner.Plan, device) -> torch.Tensor:
    """The Hilbert tile order of ``p`` as a device table of (m << 16 | n), built once per grid (with B
    multicast, of tile pairs: ``schedule.paired_order``)."""
    return device_order_table("hilbert", p.tiles_m, p.tiles_n, 8, device, pair_m=p.mcast)


def workspace(p: planner.Plan, device) -> tuple[torch.Tensor, torch.Tensor]:
    """``engine.stream_k_workspace`` for torch's current stream of ``device``."""
    idx = device.index if device.index is not None else torch.cuda.current_device()
    return stream_k_workspace(p, idx, torch.cuda.current_stream(idx).cuda_stream)


def launch(p: planner.Plan, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, *, alpha: float = 1.0,
           beta: float = 0.0, c: torch.Tensor | None = None, bias: torch.Tensor | None = None) -> None:
    """Run plan ``p``: out = act(alpha * a @ b + beta * c + bias), act = ``p.activation``.

    a: (M, K), b: (K, N), bf16 or fp16 (``p.dtype``), any strides (copied if TMA cannot read them). out:
    (M, N) in ``p.out_dtype``, unit column stride; ``p.direct`` must say whether its rows are 16-byte
    aligned. c: (M, N) in out's dtype (``p.has_c``), bias: (N,) (``p.bias_dtype``). A swapped plan
    (``p.swap_ab``) runs out^T = b^T @ a^T: the same arguments, the kernel's operands exchanged."""
    if (a.shape[0], b.shape[1], a.shape[1]) != (p.M, p.N, p.K):
        raise UnsupportedProblem(f"plan is for {p.M}x{p.N}x{p.K}, the operands are "
                                 f"{a.shape[0]}x{b.shape[1]}x{a.shape[1]}")
    if p.direct == _tma_ok(out):
        raise UnsupportedProblem(f"plan says direct={p.direct}, but the output's rows are "
                                 f"{'' if _tma_ok(out) else 'not '}16-byte aligned")
    if (bias is not None) != (p.bias_dtype is not None) or (c is not None) != p.has_c:
        raise UnsupportedProblem("the plan's epilogue (bias, beta * C) does not match the arguments")
    ka, kb = kernel_operands(p, a, b)
    M, K = ka.shape  # the kernel's problem (N x M x K when swapped)
    N = kb.shape[1]
    ta, a_mn = _operand(ka, 1)
    tb, b_mn = _operand(kb, 0)
    if (a_mn, b_mn) != (p.kernel_a_mn, p.kernel_b_mn):
        raise UnsupportedProblem(f"plan is for a_mn={p.a_mn}, b_mn={p.b_mn}; the operands are "
                                 f"{b_mn if p.swap_ab else a_mn}, {a_mn if p.swap_ab else b_mn}")
    compiled = compile_plan(p)
    map_a = tensor_map_2d(ta, (planner.BK, 64) if a_mn else (p.bm, planner.BK))
    map_a_short = map_a if a_mn else tensor_map_2d(ta, (p.a_rows, planner.BK))
    map_b = tensor_map_2d(tb, (planner.BK, 64) if b_mn else (p.b_box_rows, planner.BK))
    map_b_short = map_b if b_mn or p.b_rows == p.b_box_rows else tensor_map_2d(tb, (p.b_rows, planner.BK))
    box, tail, tail_swizzle = p.store_boxes()
    map_c = map_a if p.direct else tensor_map_2d(out, box)  # DIRECT never touches the C maps
    map_c_tail = tensor_map_2d(out, tail, swizzle_bytes=tail_swizzle) if tail and not p.direct else map_c
    order = plan_order(p, a.device)
    ws, flags = workspace(p, a.device) if p.schedule in planner.STREAMED else (out, out)
    cin = c if c is not None else out
    ldc_row, ldc_col = c_strides(p, cin)
    la = p.launch_args()
    args = (map_a, map_a_short, map_b, map_c, map_c_tail, order, np.int32(M), np.int32(N), np.int32(K),
            np.float32(alpha), np.float32(beta), cin, np.int64(ldc_row), np.int64(ldc_col),
            bias if bias is not None else out, out, np.int64(out.stride(0)), np.int32(p.a_rows),
            np.int32(la["splits"]), np.int32(la["sk_tiles"]), np.int32(la["sk_ctas"]), ws, flags, map_b_short,
            np.int32(p.b_rows))
    _launch(compiled, grid=la["grid"], block=la["block"], smem=la["smem"], args=args, cluster=la["cluster"])


def gemm(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, *, alpha: float = 1.0, beta: float = 0.0,
         c: torch.Tensor | None = None, bias: torch.Tensor | None = None, activation: str | None = None,
         plan: planner.Plan | None = None) -> planner.Plan:
    """out = act(alpha * a @ b + beta * c + bias) with the model's plan (or ``plan``); returns the plan run."""
    has_c = c is not None and beta != 0.0
    p = plan or plan_for(a, b, out, bias=bias, activation=activation, has_c=has_c)
    launch(p, a, b, out, alpha=alpha, beta=beta, c=c if has_c else None, bias=bias)
    return p


def sass_expect(p: planner.Plan):
    """What the SASS of ``p``'s instantiation must show: wgmma (its shape: ``hgmma_shapes``), TMA loads,
    no local memory; TMA stores (and stmatrix for 16-bit output) unless DIRECT or split-K; split-K's
    cluster barriers, and its pushed slices' bulk copies with no GPU-wide fence (``Plan.split_push``) or
    the pulled form's fence; B multicast's multicast loads and cluster barriers; stream-K's flag release (RED);
    global split-K's bulk copies to and from the workspace (``Plan.gsk_bulk``); with ``Plan.evict_weight``
    TMA loads with an L2 cache policy (the weight's) and without (the tokens'), else none with one;
    no GPU-wide fence inside a loop for data-parallel plans (split-K's cluster barrier and stream-K's
    release are one, once per unit); programmatic dependent launch's wait and trigger; where the plan reads
    its warpgroup index uniformly (``Plan.uniform_wg``), the k-loop's wgmma descriptors in uniform registers
    (no R2UR in it)."""
    from .sass import PDL_OPCODES, SassExpect

    contains = [r"^HGMMA", r"^UTMALDG", *PDL_OPCODES]
    absent = [r"^HMMA"]
    if p.schedule == "split_k":
        contains += [r"^UCGABAR_ARV", r"^UCGABAR_WAIT"]
        absent += [r"^UTMASTG"]
        # pushed: the slices go out by bulk copies between CTAs, and no barrier with release semantics
        # (MEMBAR.ALL.GPU) is left (the pulled form has one before its reads)
        contains += [r"^UBLKCP\.S\.S"] if p.split_push else [r"^MEMBAR\.ALL\.GPU"]
        absent += [r"^MEMBAR\.ALL\.GPU"] if p.split_push else [r"^UBLKCP"]
    elif p.direct:
        absent += [r"^UTMASTG"]
    else:
        contains += [r"^UTMASTG"] + ([r"^STSM"] if p.out_dtype != "fp32" else [])
    if p.schedule in planner.STREAMED:
        contains += [r"^RED"]
    if p.gsk_bulk:  # global split-K's slices out to the workspace and back in by bulk copies
        contains += [r"^UBLKCP\.G\.S", r"^UBLKCP\.S\.G"]
    elif p.schedule == "split_k_global":  # the thread-store form: none (the Python mirror of GSK_BULK)
        absent += [r"^UBLKCP"]
    if p.mcast > 1:  # B multicast: half of B's box to both CTAs, the cluster barriers at start and end
        contains += [r"^UTMALDG\.2D\.MULTICAST", r"^UCGABAR_ARV", r"^UCGABAR_WAIT"]
    if p.prefetch:  # the L2 prefetch of the boxes further on
        contains += [r"^UTMAPF"]
    if p.consumers > 1:
        contains += [r"^USETMAXREG"]
    # evict-first weight loads: the weight's TMA loads carry an L2 cache policy (desc[UR..]), the tokens' none
    policy = (r"^UTMALDG", r"desc\[")
    operands = {"contains_operands": (policy, (r"^UTMALDG", r"^(?!.*desc\[)"))} if p.evict_weight else {
        "absent_operands": (policy,)}
    return SassExpect(contains=tuple(contains), absent=tuple(absent), no_local_memory=True, **operands,
                      loop_absent=(r"^MEMBAR\.ALL\.GPU",) if p.schedule in ("data_parallel", "pingpong") else (),
                      wgmma_loop_absent=(r"^R2UR",) if p.uniform_wg else ())


def hgmma_shapes(compiled) -> set[str]:
    """The wgmma shapes in a compiled kernel's SASS, e.g. {"64x256x16.F32.BF16"} (fp16 operands print
    no type suffix: "64x256x16.F32")."""
    import re

    from .sass import disassemble

    return set(re.findall(r"HGMMA\.(\d+x\d+x\d+\.F32(?:\.BF16)?)\b", disassemble(compiled.cubin, compiled.mangled_name)))


# FP8 (kernels/engine/gemm_fp8.cu) ------------------------------------------------------------------------

def compile_fp8_plan(p: planner.Fp8Plan):
    """The compiled instantiation of an FP8 plan (cached in memory and on disk; works without a GPU)."""
    return compile_kernel(planner.FP8_SOURCE, p.name_expression, arch="sm_90a", name=p.compiled_name)


def launch_fp8(p: planner.Fp8Plan, a: torch.Tensor, w: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
               out: torch.Tensor, *, bias: torch.Tensor | None = None) -> None:
    """Run FP8 plan ``p``: out = act(a @ w.T x scales + bias), act = ``p.activation``.

    a: (M, K) and w: (N, K), torch.float8_e4m3fn, unit inner stride, rows 16-byte aligned (K-major both:
    the fp8 wgmma reads no MN-major operand). scale_a / scale_b: fp32; ``p.scale == "tensor"``: one
    element each; "block": (M, K / 128) and (ceil(N / 128), K / 128), any strides. out: (M, N) in
    ``p.out_dtype``, unit column stride, ``p.direct`` saying whether its rows are 16-byte aligned. bias:
    (N,) in ``p.bias_dtype``. Checks only what the plan fixes; ``gemmlab.fp8`` validates user input."""
    M, K = a.shape
    N = w.shape[0]
    if (M, N, K) != (p.M, p.N, p.K) or w.shape[1] != K:
        raise UnsupportedProblem(f"plan is for {p.M}x{p.N}x{p.K}, the operands are {M}x{N}x{K}")
    if p.direct == _tma_ok(out):
        raise UnsupportedProblem(f"plan says direct={p.direct}, but the output's rows are "
                                 f"{'' if _tma_ok(out) else 'not '}16-byte aligned")
    if (bias is not None) != (p.bias_dtype is not None):
        raise UnsupportedProblem("the plan's epilogue (bias) does not match the arguments")
    compiled = compile_fp8_plan(p)
    ta, tw = a.view(torch.uint8), w.view(torch.uint8)  # TMA moves bytes; the wgmma reads them as e4m3
    map_a = tensor_map_2d(ta, (p.bm, planner.FP8_BK))
    map_a_short = tensor_map_2d(ta, (p.a_rows, planner.FP8_BK)) if p.a_rows != p.bm else map_a
    map_b = tensor_map_2d(tw, (p.bn, planner.FP8_BK))
    piece = 32 if out.element_size() == 4 else 64
    tail = p.bn % piece
    map_c = map_a if p.direct else tensor_map_2d(out, (64, piece))
    map_c_tail = tensor_map_2d(out, (64, tail), swizzle_bytes=0) if tail and not p.direct else map_c
    order = device_order_table("hilbert", p.tiles_m, p.tiles_n, 8, a.device)
    if p.scale == "block":  # per k-step one TMA box of each scale tensor's (K / 128, rows) view
        map_sa = tensor_map_2d(block_scales_mn_major(scale_a), (1, p.bm), swizzle_bytes=0)
        map_sb = tensor_map_2d(block_scales_mn_major(scale_b), (1, 8), swizzle_bytes=0)
    else:
        map_sa = map_sb = map_a
    la = p.launch_args()
    args = (map_a, map_a_short, map_b, map_c, map_c_tail, map_sa, map_sb, order, np.int32(M), np.int32(N),
            np.int32(K), scale_a, scale_b, bias if bias is not None else out, out, np.int64(out.stride(0)),
            np.int32(p.a_rows))
    _launch(compiled, grid=la["grid"], block=la["block"], smem=la["smem"], args=args, cluster=None)


def block_scales_mn_major(scale: torch.Tensor) -> torch.Tensor:
    """Block scales, (R, K / 128) (A's rows or B's 128-column blocks), as the (K / 128, R) view the
    kernel's TMA reads: unit stride along R, 16-byte aligned rows. Scales already stored that way
    (``fp8.quantize_blocks`` makes them so; DeepGEMM and ``torch._scaled_mm`` keep activation scales
    MN-major too) are used in place; others are copied once per call into a padded buffer (one small
    copy kernel)."""
    M, KB = scale.shape
    # In place: unit stride along M, 16-byte aligned start and rows (one k-block: the row is all of it).
    pitch_ok = scale.stride(1) % 4 == 0 if KB > 1 else M % 4 == 0
    if scale.stride(0) == 1 and pitch_ok and scale.data_ptr() % 16 == 0:
        return scale.t() if KB > 1 else scale.reshape(1, M)
    buf = torch.empty((KB, (M + 3) // 4 * 4), dtype=torch.float32, device=scale.device)[:, :M]
    return buf.copy_(scale.t())


def sass_expect_fp8(p: planner.Fp8Plan):
    """What the SASS of an FP8 plan must show: FP8 wgmma (QGMMA; its shape: ``qgmma_shapes``), TMA
    loads, no bf16 wgmma or mma.sync, no local memory; TMA stores (stmatrix for 16-bit output) unless
    DIRECT; setmaxnreg with two consumers; programmatic dependent launch's wait and trigger. Block scales
    ride the ring by TMA: no cp.async (LDGSTS)."""
    from .sass import PDL_OPCODES, SassExpect

    contains = [r"^QGMMA", r"^UTMALDG", *PDL_OPCODES]
    absent = [r"^HGMMA", r"^HMMA", r"^LDGSTS"]
    if p.direct:
        absent += [r"^UTMASTG"]
    else:
        contains += [r"^UTMASTG"] + ([r"^STSM"] if p.out_dtype != "fp32" else [])
    if p.consumers > 1:
        contains += [r"^USETMAXREG"]
    return SassExpect(contains=tuple(contains), absent=tuple(absent), no_local_memory=True,
                      loop_absent=(r"^MEMBAR\.ALL\.GPU",))


def qgmma_shapes(compiled) -> set[str]:
    """The FP8 wgmma shapes in a compiled kernel's SASS: nvdisasm prints wgmma.mma_async m64nNk32 .e4m3
    as e.g. "QGMMA.64x128x32.F32.E4M3.E4M3"; returned as {"64x128x32.F32.E4M3.E4M3"}."""
    import re

    from .sass import disassemble

    text = disassemble(compiled.cubin, compiled.mangled_name)
    return set(re.findall(r"QGMMA\.(\d+x\d+x\d+\.F32\.E4M3\.E4M3)\b", text))


# The FP8 kernel's parameters, in order (engine_gemm_fp8 in kernels/engine/gemm_fp8.cu), for Fp8Launch.
FP8_PARAMS = ("tmap", "tmap", "tmap", "tmap", "tmap", "tmap", "tmap", "ptr", "i32", "i32", "i32", "ptr", "ptr", "ptr",
              "ptr", "i64", "i32")
_F8_A, _F8_A_SHORT, _F8_B, _F8_C, _F8_C_TAIL, _F8_SA_MAP, _F8_SB_MAP = range(7)
_F8_SA, _F8_SB, _F8_BIAS, _F8_OUT = 11, 12, 13, 14


def scale_map(launcher: Launcher, index: int, scale: torch.Tensor, view: torch.Tensor,
              box: tuple[int, int]) -> tuple[MapSlot, bool]:
    """Parameter ``index``: the descriptor of block scales' MN-major ``view`` (``block_scales_mn_major``'s
    or ``grouped.scale_rows_mn_major``'s of ``scale``), and whether that view is ``scale`` itself (else
    the prepared launch re-lays it every call)."""
    slot = MapSlot(launcher, index, view.data_ptr(), *view.shape, view.stride(0), torch.float32, box,
                   swizzle_bytes=0)
    return slot, view.data_ptr() == scale.data_ptr()


def scale_views(launch, relay, scale_a: torch.Tensor, scale_b: torch.Tensor) -> tuple | None:
    """A block-scaled prepared launch's (``block``) scale views for this call: each scale itself where
    read in place (``sa_in_place`` / ``sb_in_place``), else ``relay``'s copy of it; None without block
    scales. The caller keeps them until the launch is enqueued."""
    if not launch.block:
        return None
    return (scale_a if launch.sa_in_place else relay(scale_a), scale_b if launch.sb_in_place else relay(scale_b))


def point_scale_maps(launch, views: tuple | None) -> None:
    """Point the launch's block-scale descriptors (``map_sa``, ``map_sb``) at ``scale_views``' views."""
    if views is not None:
        launch.map_sa.point_at(views[0].data_ptr())
        launch.map_sb.point_at(views[1].data_ptr())


class Fp8Launch:
    """``launch_fp8`` prepared once, as ``engine.Engine2Launch`` is for the bf16 kernel: the instantiation,
    the parameter block, descriptors that follow the tensors passed to ``run`` (address replacement,
    only when an address changed) and the tile order. ``gemmlab.scaled_mm`` keeps one per metadata key.

    Built from tensors with the metadata of every later call's (shapes, strides, dtypes, device, 16-byte
    alignment of the addresses; the caller keys on them), arguments as ``launch_fp8``'s. Block scales are
    read where they are when ``block_scales_mn_major`` takes them in place; otherwise each ``run`` re-lays
    them into a buffer from torch's allocator (stream-ordered, and a CUDA graph's pool during capture, so
    calls on other streams and graphs never share it; the allocator hands the same block back call after
    call, so the descriptor's address rarely changes)."""

    def __init__(self, p: planner.Fp8Plan, a: torch.Tensor, w: torch.Tensor, scale_a: torch.Tensor,
                 scale_b: torch.Tensor, out: torch.Tensor, *, bias: torch.Tensor | None):
        M, K = a.shape
        N = w.shape[0]
        if (M, N, K) != (p.M, p.N, p.K) or w.shape[1] != K:
            raise UnsupportedProblem(f"plan is for {p.M}x{p.N}x{p.K}, the operands are {M}x{N}x{K}")
        if p.direct == _tma_ok(out) or (bias is not None) != (p.bias_dtype is not None):
            raise UnsupportedProblem(f"plan {p!r} does not match the output's alignment or the bias")
        self.plan = p
        self.has_bias = bias is not None
        self.block = p.scale == "block"
        dev = self.dev = _index(a.device)
        la = p.launch_args()
        L = self.launcher = Launcher(compile_fp8_plan(p), FP8_PARAMS, grid=la["grid"], block=la["block"],
                                     smem=la["smem"], cluster=la["cluster"], device_index=dev, pdl=True)
        self.order = device_order_table("hilbert", p.tiles_m, p.tiles_n, 8, a.device)
        L.set_ptr(7, self.order.data_ptr())
        for i, v in ((8, M), (9, N), (10, K), (16, p.a_rows)):
            L.set_i32(i, v)
        L.set_i64(15, out.stride(0))
        u8 = torch.uint8  # TMA moves bytes; the wgmma reads them as e4m3
        self.map_a = MapSlot(L, _F8_A, a.data_ptr(), M, K, a.stride(0), u8, (p.bm, planner.FP8_BK))
        self.map_a_short = self.map_a if p.a_rows == p.bm else MapSlot(L, _F8_A_SHORT, a.data_ptr(), M, K, a.stride(0),
                                                                     u8, (p.a_rows, planner.FP8_BK))
        L.set_map(_F8_A_SHORT, self.map_a_short.tmap)
        self.map_b = MapSlot(L, _F8_B, w.data_ptr(), N, K, w.stride(0), u8, (p.bn, planner.FP8_BK))
        self.map_b_short = self.map_b  # the FP8 kernel loads whole B boxes (no short one)
        self.maps_c = OutputMaps(L, _F8_C, _F8_C_TAIL, out, store_boxes(p.bn, out), p.direct, self.map_a)
        self.map_sa = self.map_sb = None
        if self.block:  # per k-step one TMA box of each scale tensor's (K / 128, rows) view
            self.map_sa, self.sa_in_place = self._scale_map(_F8_SA_MAP, scale_a, (1, p.bm))
            self.map_sb, self.sb_in_place = self._scale_map(_F8_SB_MAP, scale_b, (1, 8))
        else:
            L.set_map(_F8_SA_MAP, self.map_a.tmap)
            L.set_map(_F8_SB_MAP, self.map_a.tmap)

    def _scale_map(self, index: int, scale: torch.Tensor, box: tuple[int, int]) -> tuple[MapSlot, bool]:
        return scale_map(self.launcher, index, scale, block_scales_mn_major(scale), box)

    def run(self, stream: int, a: torch.Tensor, w: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
            out: torch.Tensor, bias: torch.Tensor | None) -> None:
        """Launch on ``stream`` (a raw handle) for tensors with the metadata this launch was built for;
        ``w`` is the (N, K) weight or ``b = w.t()`` (only its address is read)."""
        views = scale_views(self, block_scales_mn_major, scale_a, scale_b)  # kept alive until enqueued
        L = self.launcher
        with L.lock:
            po = out.data_ptr()
            point_maps(self, a.data_ptr(), w.data_ptr(), po)
            point_scale_maps(self, views)
            L.set_ptr(_F8_SA, scale_a.data_ptr())
            L.set_ptr(_F8_SB, scale_b.data_ptr())
            L.set_ptr(_F8_BIAS, bias.data_ptr() if self.has_bias else po)
            L.set_ptr(_F8_OUT, po)
            L.launch(stream)
