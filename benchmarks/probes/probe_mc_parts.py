"""Probe: which part of B multicast costs time on aligned rows. The engine kernel's multicast plans are timed
in three builds (PROBE_MC_VARIANT), each against the same tile without multicast and torch.mm (graph replay,
interleaved; one process a build, so the ratios to torch compare across builds):
  mc      the kernel as it is: clusters of two, each CTA loads half of B and multicasts it, releases to both;
  nocast  clusters of two and releases to both (the CTAs' k-loops in lockstep), but each CTA loads all of
          its B itself, as without multicast: the protocol's cost without the multicast delivery;
  indep   clusters of two launched, but each CTA loads its own B and releases only its own ring: what the
          cluster launch and its two cluster barriers cost alone;
  launch  indep without the cluster barriers: the cluster launch alone;
  mcrelax mc with the closing cluster barriers relaxed;
  mcstatic mc with the cluster shape compiled into the kernel (__cluster_dims__) and no launch attribute
          (the plain plans then run as compiled clusters of one).
PROBE_CLUSTER_POLICY=1 / 2: the clustered kernels launched with the spread / load-balancing cluster
scheduling policy (a function attribute). PROBE_GRIDS: the multicast plans on smaller persistent grids too
(below). PROBE_SWAP_ORDER=1 (launch build only): the multicast plans take
the Hilbert order of tiles, the others the order of pairs, to tell the cluster launch from the tile order.
The builds patch a copy of the kernel sources (gemmlab.jit.compiler.KERNEL_ROOT), not the package.
Multicast plans also run with deeper rings where shared memory allows."""
import dataclasses, os, shutil, sys, tempfile
from pathlib import Path
import torch
sys.path.insert(0, "benchmarks")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gemmlab import planner  # noqa: E402
from gemmlab.jit import compiler  # noqa: E402
from plans_vs_torch import shapes_from_env  # noqa: E402

SHAPES = [(200, 4096, 4096), (128, 4096, 4096), (1000, 1152, 6912), (1536, 1024, 4096), (200, 8192, 5376),
          (256, 5120, 5120), (4096, 4096, 4096), (3000, 3000, 3000)]
SHAPES = shapes_from_env(SHAPES)  # PROBE_SHAPES="M,N,K;..." in its place
MULTICAST = "tma_load_2d_multicast(b + r * SHARE * BK, tmB, bar, kt * BK, n0 + r * SHARE, (1u << Tr::MCAST) - 1);"
# B's tensor map has boxes of BN / MCAST rows: a CTA loading all of B itself loads every share.
OWN_LOADS = ("(void)r; for (int h = 0; h < Tr::MCAST; ++h) "
             "tma_load_2d(b + h * SHARE * BK, tmB, bar, kt * BK, n0 + h * SHARE);")
PATCHES = {
    "mc": [],
    "nocast": [("common/mainloop.cuh", MULTICAST, OWN_LOADS)],
    "indep": [("common/mainloop.cuh", MULTICAST, OWN_LOADS),
              ("common/mainloop.cuh", "ring.template release<Tr::MCAST>(prev);", "ring.template release<1>(prev);"),
              ("engine/gemm.cu", "ring.init(Tr::SLOT_READERS * Tr::MCAST);", "ring.init(Tr::SLOT_READERS);")],
}
# launch: as indep, without the two cluster barriers (nothing crosses CTAs any more): the cluster launch alone.
PATCHES["launch"] = PATCHES["indep"] + [
    ("engine/gemm.cu", "        cluster_sync();\n    } else {", "        __syncthreads();\n    } else {"),
    ("engine/gemm.cu", "if constexpr (Tr::MCAST > 1) cluster_sync();", "if constexpr (Tr::MCAST > 1) {}")]
# racy: multicast loads as shipped, but each producer waits for its own consumer's release only (the
# peer's releases go nowhere): a data race by design (a multicast may overwrite a slot the peer still
# reads), results may be wrong; it times the multicast delivery without the pair's coupled releases.
PATCHES["racy"] = [
    ("common/mainloop.cuh", "ring.template release<Tr::MCAST>(prev);", "ring.template release<1>(prev);"),
    ("engine/gemm.cu", "ring.init(Tr::SLOT_READERS * Tr::MCAST);", "ring.init(Tr::SLOT_READERS);")]
# mcfirst: each k-step's B copy (the multicast half) issued before A's, so the peer's half leaves sooner.
_A_LOADS = ("        if constexpr (Tr::A_MN) {  // A stored (K, M): 64 x 64 boxes at (m, k)\n"
            "            for (int i = 0; i < a_boxes; ++i) tma_load_2d(a + i * 64 * BK, tmA, bar, m0 + 64 * i, kt * BK);\n"
            "        } else {  // A stored (M, K)\n"
            "            tma_load_2d(a, whole ? tmA : tmA_short, bar, kt * BK, m0);\n"
            "        }\n")
_B_END = "            tma_load_2d(b, b_map, bar, kt * BK, n0);\n        }\n"
PATCHES["mcfirst"] = [("common/mainloop.cuh", _A_LOADS, ""), ("common/mainloop.cuh", _B_END, _B_END + _A_LOADS)]
# mc2prod: a second producer thread (the producer warpgroup's thread 32) issues the multicast B copies, on
# the same ring (it waits on "empty" as thread 0 does; its copies may complete bytes on "full" before thread
# 0's expect_tx: the tx-count may go below zero, the phase needs thread 0's arrival), so the one thread's
# multicast issue no longer holds the A loads and the next acquire. Correct results expected.
_MC_LINE = ("            tma_load_2d_multicast(b + r * SHARE * BK, tmB, bar, kt * BK, n0 + r * SHARE, "
            "(1u << Tr::MCAST) - 1);\n")
_MC_B_ONLY = """
template <class Tr>
__device__ __forceinline__ void produce_mcast_b(Ring<Tr::STAGES>& ring, RingCursor& cur, typename Tr::T* sB,
                                                const CUtensorMap* tmB, int n0, int k_begin, int k_end) {
    constexpr int SHARE = Tr::BN / Tr::MCAST;
    const int r = (int)cluster_ctarank();
    for (int kt = k_begin; kt < k_end; ++kt) {
        mbar_wait_parity(&ring.empty[cur.stage], cur.phase ^ 1);
        tma_load_2d_multicast(sB + cur.stage * Tr::BN * Tr::BK + r * SHARE * Tr::BK, tmB, &ring.full[cur.stage],
                              kt * Tr::BK, n0 + r * SHARE, (1u << Tr::MCAST) - 1);
        cur.template advance<Tr::STAGES>();
    }
}
"""
_PRODUCER = "        if (t == 0) {\n            RingCursor cur;\n"
_SECOND = """        if constexpr (Tr::MCAST > 1) {
            if (t == 32) {
                RingCursor cur;
                while (sched.next(u)) produce_mcast_b<Tr>(ring, cur, sB, &tmB, (order[u.tile] & 0xffff) * BN, u.k_begin, u.k_end);
            }
        }
"""
PATCHES["mc2prod"] = [
    ("common/mainloop.cuh", _MC_LINE, "            (void)r; (void)SHARE;\n"),
    ("common/mainloop.cuh", "// Before pdl_wait (the kernel before may still be running)", _MC_B_ONLY.lstrip("\n")
     + "\n// Before pdl_wait (the kernel before may still be running)"),
    ("engine/gemm.cu", _PRODUCER, _SECOND + _PRODUCER)]
# mcstatic: the cluster shape compiled into the kernel (__cluster_dims__, PTX .reqnctapercluster) instead of
# the launch attribute, and the launches carrying none (main): multicast plans as clusters of two, the plain
# ones as clusters of one. Whether a clustered launch's cost (session 28: a cluster of one 0.957 -> 0.740 at
# 512x1024x8192 64 x 64) follows the launch attribute or the cluster launch as such. Not for split-K plans
# (their cluster shape is the launch's splits, not a template argument).
KERNEL_HEAD = "template <class Tr>\n__global__ void __launch_bounds__(Tr::THREADS, 1)\nengine_gemm("


def static_cluster(size: str) -> list:
    """The engine kernel declared with a compile-time cluster shape of ``size`` CTAs (a C++ expression)."""
    return [("engine/gemm.cu", KERNEL_HEAD, KERNEL_HEAD.replace(
        "__launch_bounds__(Tr::THREADS, 1)", f"__launch_bounds__(Tr::THREADS, 1) __cluster_dims__({size}, 1, 1)"))]


PATCHES["mcstatic"] = static_cluster("Tr::MCAST")
# mcrelax: multicast as it is, the closing cluster barrier without release semantics (no MEMBAR.GPU before it).
PATCHES["mcrelax"] = [("engine/gemm.cu", "if constexpr (Tr::MCAST > 1) cluster_sync();",
                       "if constexpr (Tr::MCAST > 1) cluster_sync_relaxed();")]


DEEPER = os.environ.get("PROBE_DEEPER", "1") == "1"
# PROBE_GRIDS="120,96": each multicast plan also on persistent grids of that many CTAs (even, fewer than its
# own), i.e. fewer pairs than the GPU holds at once, in case a clustered grid waits for SMs the grid before
# it still holds.
GRIDS = [int(g) for g in os.environ.get("PROBE_GRIDS", "").split(",") if g]


def patched_root(variant: str) -> Path:
    root = Path(tempfile.mkdtemp(prefix=f"kern-{variant}-")) / "kernels"
    shutil.copytree(Path(compiler.__file__).resolve().parent.parent / "kernels", root)
    for rel, old, new in PATCHES[variant]:
        text = (root / rel).read_text()
        n = text.count(old)
        assert n >= 1, (rel, old)
        (root / rel).write_text(text.replace(old, new))
    return root


def traced_runs(engine2, p, a, w, o, buf, launches: int = 30, warmup: int = 10) -> list:
    """Launch plan ``p`` (a @ w.t() into o) eagerly ``launches`` times, zeroing the patched kernel's trace
    buffer ``buf`` before each; the buffer after each launch past ``warmup``, on the host."""
    runs = []
    for i in range(launches):
        buf.zero_()
        engine2.launch(p, a, w.t(), o)
        torch.cuda.synchronize()
        if i >= warmup:
            runs.append(buf.cpu())
    return runs


def timeline_mark(cond: str, e: int) -> str:
    """kernels/common/timeline.cuh's mark of event ``e`` where ``cond`` holds, as source text to patch in."""
    return f"TIMELINE_MARK({cond}, {e});"


def mark_between(rel: str, head: str, tail: str, cond: str, e: int, indent: str) -> tuple:
    """A patch of ``rel`` putting event ``e``'s mark (where ``cond`` holds) on its own line, indented by
    ``indent``, between the source texts ``head`` and ``tail`` (which occur together there)."""
    return rel, head + tail, head + indent + timeline_mark(cond, e) + "\n" + tail


def timeline_common_patches(addr: int, events: int) -> list:
    """The marks every engine-kernel timeline probe patches in: the trace buffer at ``addr`` with ``events``
    events a CTA, the CTA's entry (0), consumer 0's k-loop done (3), its exit (1) and its first k-step
    landed (2)."""
    gemm, loop = "engine/gemm.cu", "common/mainloop.cuh"
    return [
        ("common/timeline.cuh", "#define TIMELINE_EVENTS 8", f"#define TIMELINE_EVENTS {events}"),
        (gemm, '#include "common/gemm_traits.cuh"',
         f'#define TIMELINE_BUF {addr:#x}ull\n#include "common/timeline.cuh"\n#include "common/gemm_traits.cuh"'),
        mark_between(gemm, "t = threadIdx.x % 128;\n", "", "threadIdx.x == 0", 0, "    "),
        mark_between(gemm, "u.k_begin, u.k_end, rows);\n", "", "wg == 1 && t == 0", 3, " " * 8),
        mark_between(gemm, "", "    if (!Tr::DIRECT && t == 0) tma_store_wait_all<0>();", "wg == 1 && t == 0", 1, "    "),
        mark_between(loop, "        ring.wait_full(cur);\n", "        // This consumer's rows",
                     "consumer == 0 && t == 0 && kt == k_begin", 2, " " * 8)]


def traced_plan(engine2, p, M: int, N: int, K: int, buf, events: int) -> tuple[list, float]:
    """``traced_runs`` of plan ``p`` on fresh bf16 operands of M x N x K (out poisoned with NaN): the runs'
    traces as (CTAs of the grid, events, 3) float64 tensors, and the result's error against an fp32
    product (relative Frobenius)."""
    a = torch.randn(M, K, device="cuda").bfloat16()
    w = torch.randn(N, K, device="cuda").bfloat16()
    o = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    ref = a.float() @ w.float().t()
    runs = [r.view(132, events, 3)[: p.grid].double() for r in traced_runs(engine2, p, a, w, o, buf)]
    return runs, ((o.float() - ref).norm() / ref.norm()).item()


def median(xs):
    return sorted(xs)[len(xs) // 2]


def timeline_stats(runs, phases: dict) -> tuple[dict, list]:
    """From traced runs (per run a (CTAs, events, 3) tensor of %globaltimer ns, clock64, %smid; event 0 the
    entry, 1 the exit, 3 the k-loop's end): each CTA's SM clock (median over CTAs, per run), the length of
    each phase (name: (first event, last event)) in us at the CTA's own clock (median over CTAs, then over
    runs), the span of the launch and the spread of the CTAs' starts and k-loop ends (us). Returns (record
    fields, per-run clocks in MHz)."""
    mhz = [(((r[:, 1, 1] - r[:, 0, 1]) / (r[:, 1, 0] - r[:, 0, 0])) * 1e3).median().item() for r in runs]
    rec = {"cta_sm_mhz": median(mhz)}
    for name, (e0, e1) in phases.items():
        rec[name + "_us"] = median([((r[:, e1, 1] - r[:, e0, 1]) / mz).median().item() for r, mz in zip(runs, mhz)])
    rec["span_us"] = median([((r[:, 1, 0].max() - r[:, 0, 0].min()) / 1e3).item() for r in runs])
    rec["start_spread_us"] = median([((r[:, 0, 0].max() - r[:, 0, 0].min()) / 1e3).item() for r in runs])
    rec["kloop_end_spread_us"] = median([((r[:, 3, 0].max() - r[:, 3, 0].min()) / 1e3).item() for r in runs])
    return rec, mhz


def timeline_head(rec: dict, k_steps: int) -> str:
    """The part of a timeline probe's line every probe prints: span, spreads, the CTA's entry to its
    k-loop's end."""
    return (f"span {rec['span_us']:.2f} us (starts spread {rec['start_spread_us']:.2f}, k-loop ends spread "
            f"{rec['kloop_end_spread_us']:.2f}); CTA {rec['cta_us']:.2f} = first data {rec['first_data_us']:.2f}"
            f" + k-loop {rec['k_loop_us']:.2f} ({k_steps} k-steps)")


def timeline_tail(rec: dict, err: float) -> str:
    """The line's end: the exit, the CTAs' clock and the result's error."""
    return f" + exit {rec['exit_us']:.2f} at {rec['cta_sm_mhz']:.0f} MHz (err {err:.1e})"


def spread_pairs(table, clusters: int, pair: int, groups: int):
    """The order table with each wave's pairs permuted: a clustered launch places consecutive clusters on
    consecutive SMs of one GPC (probe_cluster_timeline.py), a plain one spreads consecutive CTAs over the
    GPCs. Cluster c of a wave takes the pair at the rank of (c % groups, c // groups), so that the clusters
    one GPC holds take pairs from `groups` places of the order, and pairs next in the order go to
    different GPCs."""
    pairs = table.view(-1, pair)
    out = pairs.clone()
    for w0 in range(0, pairs.shape[0], clusters):
        n = min(clusters, pairs.shape[0] - w0)
        rank = sorted(range(n), key=lambda c: (c % groups, c // groups))
        pos = [0] * n
        for r, c in enumerate(rank):
            pos[c] = r
        out[w0:w0 + n] = pairs[w0:w0 + n][torch.tensor(pos, device=table.device)]
    return out.view(-1).contiguous()


def set_cluster_policy(plans, policy: int) -> None:
    """The clustered plans' kernels get CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE = ``policy``
    (0 default, 1 spread: "spread the blocks within a cluster to the SMs", 2 load balancing): a preference
    the driver may ignore, read at each launch of the function."""
    from cuda.bindings import driver
    from gemmlab import engine2
    from gemmlab.jit.launch import prepare
    dev = torch.cuda.current_device()
    attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE
    for p in plans:
        if p.cluster < 2:
            continue
        handle = prepare(engine2.compile_plan(p), p.smem_bytes, dev).handle
        if isinstance(handle, driver.CUkernel):
            (err,) = driver.cuKernelSetAttribute(attr, policy, handle, driver.CUdevice(dev))
        else:
            (err,) = driver.cuFuncSetAttribute(handle, attr, policy)
        assert err == driver.CUresult.CUDA_SUCCESS, err


def patched_engine(variant: str, patches: dict):
    """A probe's build ``variant`` of ``patches`` ({variant: [(file, old, new)]}): the patched copy of the
    kernel sources made the compiler's root, then (root, gemmlab.engine2, the visible GPU's profile)."""
    PATCHES.setdefault(variant, patches[variant])
    compiler.KERNEL_ROOT = root = patched_root(variant)
    from gemmlab import engine2
    return root, engine2, engine2._profile(torch.device("cuda"))


def plans_for(M, N, K, prof):
    cands = planner.candidates(M, N, K, profile=prof, mcast=True)
    out, seen = {}, set()
    for c in cands:
        if c.mcast < 2 or (c.bm, c.bn) in seen or len(seen) == 2:
            continue
        seen.add((c.bm, c.bn))
        dp = [d for d in cands if d.mcast == 1 and d.schedule == "data_parallel" and (d.bm, d.bn) == (c.bm, c.bn)]
        if dp:
            out[f"dp {c.bm}x{c.bn}/{dp[0].stages}"] = dp[0]
        out[f"mc {c.bm}x{c.bn}/{c.stages}"] = c
        for g in GRIDS:
            if g % c.mcast == 0 and g < c.grid:
                out[f"mc {c.bm}x{c.bn}/{c.stages} grid {g}"] = dataclasses.replace(c, grid=g)
        for st in (c.stages + 2, c.stages + 4) if DEEPER else ():
            q = dataclasses.replace(c, stages=st)
            if q.smem_bytes <= planner.SMEM_LIMIT:
                out[f"mc {c.bm}x{c.bn}/{st}"] = q
    return out


def _use_root(root: str) -> None:
    compiler.KERNEL_ROOT = Path(root)


def _compile(p) -> None:
    from gemmlab import engine2
    engine2.compile_plan(p)


def precompile(plans, root: Path, workers: int = 16) -> None:
    """engine_broad.precompile with the patched sources in the workers too."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    unique = {p.name_expression: p for p in plans}
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                             initializer=_use_root, initargs=(str(root),)) as pool:
        list(pool.map(_compile, unique.values()))


def main():
    variant = os.environ.get("PROBE_MC_VARIANT", "mc")
    root = patched_root(variant)
    compiler.KERNEL_ROOT = root
    from gemmlab import engine2
    if os.environ.get("PROBE_SWAP_ORDER") == "1":  # only sound with the launch build: nothing crosses CTAs
        assert variant == "launch"
        from gemmlab.schedule import device_order_table

        def swapped_order(p, device):  # multicast plans in Hilbert order of tiles, the others in pairs
            if p.mcast > 1:
                return device_order_table("hilbert", p.tiles_m, p.tiles_n, 8, device)
            pair = 2 if p.tiles_m % 2 == 0 else 1
            return device_order_table("hilbert", p.tiles_m, p.tiles_n, 8, device, pair_m=pair)
        engine2.plan_order = swapped_order
        variant += "-swapped-order"
    if os.environ.get("PROBE_SPREAD"):  # multicast plans: a wave's pairs spread over the GPCs (see spread_pairs)
        groups = int(os.environ["PROBE_SPREAD"])
        plain_order = engine2.plan_order

        spread = {}  # built once, before the graph captures (a host-to-device copy cannot be captured)

        def spread_order(p, device):
            t = plain_order(p, device)
            if p.mcast < 2:
                return t
            key = (t.data_ptr(), p.grid)
            if key not in spread:
                spread[key] = spread_pairs(t, p.grid // p.mcast, p.mcast, groups)
            return spread[key]
        engine2.plan_order = spread_order
        variant += f"-spread{groups}"
    if variant == "mcstatic":  # the compiled cluster shape: launches carry no cluster attribute
        inner = engine2._launch
        engine2._launch = lambda compiled, **kw: inner(compiled, **{**kw, "cluster": None})
    prof = engine2._profile(torch.device("cuda"))
    plans = {s: plans_for(*s, prof) for s in SHAPES}
    precompile([p for d in plans.values() for p in d.values()], root)
    if os.environ.get("PROBE_CLUSTER_POLICY"):  # 1: spread, 2: load balancing (set_cluster_policy)
        set_cluster_policy([p for d in plans.values() for p in d.values()], int(os.environ["PROBE_CLUSTER_POLICY"]))
        variant += f"-policy{os.environ['PROBE_CLUSTER_POLICY']}"
    time_all(plans, f"mc-parts-{variant}", sys.argv[1])


def time_all(plans: dict, suite: str, path: str) -> None:
    """Each shape's plans ({(M, N, K): {name: plan}}, compiled) against torch.mm by plain launches, one
    record a shape appended to ``path``."""
    from gemmlab.gpu import gpu_info
    from plans_vs_torch import report, time_plans
    with open(path, "a") as out:
        for (M, N, K), vs in plans.items():
            report(out, suite, M, N, K, vs, time_plans(M, N, K, vs, prepared=False), gpu_info().name)


if __name__ == "__main__":
    main()
