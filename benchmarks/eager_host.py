"""What one eager ``gemmlab.matmul`` call costs its caller, against ``torch.mm`` (issue 13).

No CUDA graphs anywhere here: graph replay hides the host path, which is what this measures.

- per call and ``stack``: what ``gemmlab bench --suite matmul-eager`` measures (``gemmlab.bench.bench_eager``
  and ``bench_eager_stack``, timed with ``gemmlab.timer.eager_host_us`` / ``eager_wall_us``): the host time
  of a call with the GPU kept busy, the wall time of back-to-back calls on an idle GPU, and a Llama-2-7B
  layer's 32 projections through ``gemmlab.linear``.
- ``--breakdown``: the stages of gemmlab's path, each timed alone over many repetitions.
- ``--mechanisms``: the building blocks a launch can be made of (launch interfaces, stream lookup,
  descriptor encoding and address replacement, allocation, custom-op dispatch), each timed alone.
- ``--fp8``: ``gemmlab.scaled_mm`` per scale mode (per-tensor; 1 x 128 / 128 x 128 blocks with MN-major
  scales, read in place; the same with row-major scales, A's re-laid every call) against
  ``torch._scaled_mm`` and ``torch.mm``, host and wall (kind "fp8"); with ``--device cpu`` gemmlab's side
  alone, launches stubbed (the Python path of the prepared call, of the op, and of ``fp8.gemm``).
- ``--grouped``: ``gemmlab.grouped_mm`` per mode (bf16 contiguous and masked; e4m3 per-tensor, block scales
  MN-major and row-major) against ``torch._grouped_mm`` and a loop of ``torch.mm`` over the groups, host and
  wall (kind "grouped"); ``--device cpu`` as for ``--fp8`` (the prepared call, the op, ``grouped.run``).
- ``--linear``: a decoder's pattern (issue 17): ``gemmlab.patch``ed ``nn.Linear`` against ``nn.Linear`` on a
  3-D input, a fresh input tensor every call (new data pointers), the weight a Parameter: host time of a
  forward under inference_mode, of a forward with grad, and of forward + backward (dx and dW), GPU kept busy;
  then the backward alone on both sides and its stages (``_backward_stages``: its two GEMMs' kept calls, their
  launches, and the driver calls retried for a missing context in autograd's backward thread).
  With ``--device cpu`` (no GPU needed): gemmlab's side alone, the launches stubbed (tests/fakes.py's fake
  engine with a no-op launch), for the host path's Python cost, N = 64 (CPU allocations of the outputs and
  gradients, which torch's CPU allocator does not cache, stay small) and the minimum of 30 rounds of 100
  calls (a shared machine's noise only adds); torch's CPU side would compute, so it is not timed.

Every record carries the git sha, GPU, SM clock and both sides' numbers; they are appended as JSON lines
to ``--out`` (default ``benchmarks/results/eager.jsonl``).

    python benchmarks/eager_host.py [--breakdown] [--mechanisms] [--fp8|--grouped --no-calls] [--device cpu] [--out PATH]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import sys
import time
from pathlib import Path

import torch

# GEMMLAB_SRC: another checkout's src/ (e.g. the code before a change, to time both in one session).
sys.path.insert(0, os.environ.get("GEMMLAB_SRC") or str(Path(__file__).resolve().parents[1] / "src"))

import gemmlab  # noqa: E402
from gemmlab.bench import append_records, git_sha  # noqa: E402
from gemmlab.gpu import gpu_info, sample_clocks  # noqa: E402
from gemmlab.jit import launch  # noqa: E402


def _median_us(fn, reps: int, inner: int = 1) -> float:
    """Median over ``reps`` of the wall time of ``inner`` calls, per call, in microseconds."""
    xs = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        for _ in range(inner):
            fn()
        xs.append((time.perf_counter_ns() - t0) / inner / 1e3)
    return statistics.median(xs)


def _time_stages(stages: dict) -> dict[str, float]:
    """Each stage alone: 50 warm-up calls, then the median of 21 x 200 calls, in microseconds per call."""
    out = {}
    for name, fn in stages.items():
        for _ in range(50):
            fn()
        out[name] = _median_us(fn, reps=21, inner=200)
        torch.cuda.synchronize()
        print(f"  {name:<60} {out[name]:8.2f} us", flush=True)
    return out


def _common(kind: str) -> dict:
    info = gpu_info()
    return {"time": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "git_sha": git_sha(),
            "gpu": info.name, "driver": info.driver, "torch": info.torch, "suite": "eager", "kind": kind,
            "sm_clock_mhz": sample_clocks().sm_mhz, "pdl": launch.PDL}


def _rand(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape, device="cuda", dtype=dtype)


def per_call_records(dtype, reps: int, shapes=None, out: str | None = None) -> list[dict]:
    """``gemmlab bench --suite matmul-eager``'s per-call part (``gemmlab.bench.bench_eager``), or these
    (M, N, K) shapes; each record names the kernel ``gemmlab.plan`` says the call runs, and is appended to
    ``out`` (where given) as soon as it is measured: a run cut short keeps what it measured."""
    from gemmlab import bench
    from gemmlab.matmul_suites import EAGER

    recs = []
    cases = [(c.name, c.M, c.N, c.K) for c in EAGER] if not shapes else [(f"eager {m}x{n}x{k}", m, n, k)
                                                                           for m, n, k in shapes]
    for name, M, N, K in cases:
        extra = {"case": name}
        if hasattr(gemmlab.plan(1, 1, 1), "kernel"):  # a checkout whose gemmlab.plan reports the route
            extra["route"] = gemmlab.plan(M, N, K, dtype=dtype).kernel
        r = bench.bench_eager(M, N, K, dtype=dtype, reps=reps, extra=extra)
        if shapes:  # not the eager suite: kept out of the README's eager rows (readme_tables.eager_runs)
            r["kind"] = "per_call_shapes"
        recs.append(r)
        if out:
            append_records(out, [r])
        print(f"{dtype} {r['M']:>5} x {r['N']:>5} x {r['K']:>5}  host {r['host_us']:7.1f} us (torch "
              f"{r['baseline_host_us']:6.1f})  wall {r['wall_us']:7.1f} us (torch {r['baseline_wall_us']:6.1f})  "
              f"x{r['ratio']:.3f}  err {r['rel_error']:.1e}", flush=True)
    return recs


def stack_records(dtype, reps: int, out: str | None = None) -> list[dict]:
    """The 7B layer stack at batch 1 and 16 (``gemmlab.bench.bench_eager_stack``), each record appended to
    ``out`` (where given) as soon as it is measured."""
    from gemmlab import bench

    recs = []
    for M in (1, 16):
        r = bench.bench_eager_stack(M, dtype=dtype, reps=max(reps, 9))
        recs.append(r)
        if out:
            append_records(out, [r])
        print(f"stack {dtype} M={M}: {r['wall_us']:.1f} us/call (torch {r['baseline_wall_us']:.1f}) "
              f"x{r['ratio']:.3f}; host {r['host_us']:.1f} (torch {r['baseline_host_us']:.1f})", flush=True)
    return recs


def breakdown_records(M: int = 16, N: int = 4096, K: int = 4096) -> list[dict]:
    """gemmlab's eager path, stage by stage (the prepared-call path where it exists, else the path before
    it), the whole call and torch.mm beside it."""
    a, w = _rand(M, K), _rand(N, K)
    b = w.t()
    gemmlab.matmul(a, b)
    stages = {"gemmlab.matmul (whole call)": lambda: gemmlab.matmul(a, b),
              "torch.mm (whole call)": lambda: torch.mm(a, b)}
    from gemmlab import ops

    stages.update(_prepared_stages(a, b) if hasattr(ops, "_prepared") else _legacy_stages(a, b))
    return [dict(_common("breakdown"), M=M, N=N, K=K, stages=_time_stages(stages))]


def _prepared_stages(a, b) -> dict:
    """The stages of the eager path with prepared calls: the eligibility test, the key, the lookup, the
    output's allocation, the stream, and the prepared launch (addresses, descriptors, driver launch)."""
    from gemmlab import ops

    M, N = a.shape[0], b.shape[1]
    out = torch.empty(M, N, device="cuda", dtype=a.dtype)
    key = ops._call_key(a, b, None, None, 0.0, None, None, None)
    call = ops._CALLS.get(key)
    dev = a.get_device()
    return {
        "ops._eager (may the call skip the op?)": lambda: ops._eager(a, b, None, 1.0, 0.0, None, None),
        "ops._call_key": lambda: ops._call_key(a, b, None, None, 0.0, None, None, None),
        "ops._CALLS.get (lookup, plan-file watch)": lambda: ops._CALLS.get(key),
        "torch.empty (M, N)": lambda: torch.empty((M, N), dtype=a.dtype, device=a.device),
        "ops._stream (raw current stream)": lambda: ops._stream(dev),
        "prepared launch .run (addresses, scalars, driver launch)":
            lambda: call.launch.run(ops._stream(dev), a, b, out, None, None, 1.0, 0.0),
        "torch.ops.gemmlab.matmul (the op, as torch.compile calls it)":
            lambda: torch.ops.gemmlab.matmul(a, b, None, None, 1.0, 0.0, None, None),
    }


def _legacy_stages(a, b) -> dict:
    """The stages of the path before the fast path (sha 5b5f2aa): validation (run twice: by matmul and
    inside the op), the op's dispatch, the engine's per-call analysis, descriptors and the launch."""
    from gemmlab import autotune, decode, engine, ops
    from gemmlab.jit import launch as L

    M, K = a.shape
    N = b.shape[1]
    out = torch.empty(M, N, device="cuda", dtype=a.dtype)
    p = ops._validate(a, b, None, None, 1.0, 0.0, None, None)
    dev = a.device
    ta, _ = engine._operand(a, 1)
    tb, _ = engine._operand(b, 0)
    sm = engine._sm_count(dev)
    gpu = autotune.device_gpu(engine._index(dev))
    return {
        "ops._validate (runs twice per call)": lambda: ops._validate(a, b, None, None, 1.0, 0.0, None, None),
        "custom op: torch.ops.gemmlab.matmul (whole)": lambda: torch.ops.gemmlab.matmul(a, b, None, None, 1.0, 0.0, None, None),
        "ops._compute (engine path, preallocated out)": lambda: ops._compute(p, a, b, None, None, 1.0, 0.0, None, out),
        "torch.empty (M, N)": lambda: torch.empty((M, N), dtype=a.dtype, device=dev),
        "engine.hopper_available": lambda: engine.hopper_available(dev),
        "torch.cuda.device(dev) context": lambda: _enter_exit(ops._on_device(dev)),
        "engine.use_decode (decode.why_not)": lambda: engine.use_decode(a, b, out),
        "engine._operand x2": lambda: (engine._operand(a, 1), engine._operand(b, 0)),
        "engine.plan_for (tuned-plan lookup + choose_plan)": lambda: engine.plan_for(M, N, K, sm, None, gpu=gpu),
        **({"decode.plan (cached)": lambda: decode.plan(M, N, K, sm)} if M <= decode.MAX_M else {}),
        "autotune.device_gpu": lambda: autotune.device_gpu(engine._index(dev)),
        "tensor_map_2d (cache hit) x3": lambda: (L.tensor_map_2d(ta, (128, 64)), L.tensor_map_2d(tb, (128, 64)),
                                                 L.tensor_map_2d(out, (64, 64))),
        "jit.launch.current_device": lambda: L.current_device(),
        "jit.launch.torch_stream": lambda: L.torch_stream(),
    }


def _enter_exit(ctx) -> None:
    with ctx:
        pass


def mechanism_records() -> list[dict]:
    """The building blocks, each timed alone: which launch interface and which descriptor update to use."""
    import ctypes

    import numpy as np
    from cuda.bindings import driver

    from gemmlab import engine
    from gemmlab.jit import launch as L
    from gemmlab.jit.compiler import compile_kernel

    src = _rand(64, 64)
    dst = torch.empty_like(src)
    compiled = compile_kernel(engine.PAD_COPY_SOURCE, "pad_copy<2, 1, 1>", arch="sm_90a", name="pad_copy")
    kernel = L.prepare(compiled, 0, torch.cuda.current_device())
    args = (src, np.int64(64), dst, np.int64(64), np.int64(64), np.int32(64))
    # A packed parameter buffer: each argument at an 8-byte slot, and the array of pointers to the slots.
    vals = np.zeros(len(args), dtype=np.uint64)
    vals[0], vals[1], vals[2], vals[3], vals[4] = src.data_ptr(), 64, dst.data_ptr(), 64, 64
    vals.view(np.int32)[10] = 64
    ptrs = np.array([vals.ctypes.data + 8 * i for i in range(len(args))], dtype=np.uint64)
    ptrs_addr = ptrs.ctypes.data
    handle = kernel.handle
    stream_int = torch.cuda.current_stream().cuda_stream
    dev_idx = torch.cuda.current_device()

    def raw_launch():
        (err,) = driver.cuLaunchKernel(handle, 1, 1, 1, 256, 1, 1, 0, stream_int, ptrs_addr, 0)
        if err != driver.CUresult.CUDA_SUCCESS:
            raise RuntimeError(err)

    raw_launch()
    torch.cuda.synchronize()
    assert torch.equal(dst, src), "raw launch did not copy"

    tmap = L.tensor_map_2d(src, (64, 64))
    enc = _encode_map(driver, src)
    enc_ptr = enc.getPtr()

    @torch.library.custom_op("eagerbench::noop", mutates_args=())
    def noop(x: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(x)

    @noop.register_fake
    def _(x):
        return torch.empty_like(x)

    def fresh_map():
        L._TMA_CACHE.clear()
        L.tensor_map_2d(src, (64, 64))

    stages = {
        "cuda.core launch (jit.launch.launch, pad_copy)": lambda: L.launch(compiled, grid=1, block=256, args=args),
        "driver.cuLaunchKernel, packed params (pad_copy)": raw_launch,
        "torch.cuda.current_stream().cuda_stream": lambda: torch.cuda.current_stream().cuda_stream,
        "torch._C._cuda_getCurrentRawStream": lambda: torch._C._cuda_getCurrentRawStream(dev_idx),
        "torch.cuda.current_device": torch.cuda.current_device,
        "tensor.get_device()": src.get_device,
        "StridedMemoryView.as_tensor_map (fresh descriptor)": fresh_map,
        "driver.cuTensorMapEncodeTiled": lambda: _encode_map(driver, src),
        "driver.cuTensorMapReplaceAddress": lambda: driver.cuTensorMapReplaceAddress(enc, src.data_ptr()),
        "ctypes.memmove 128 B": lambda: ctypes.memmove(vals.ctypes.data, enc_ptr, 8),
        "torch.empty (16, 4096) bf16": lambda: torch.empty((16, 4096), dtype=torch.bfloat16, device="cuda"),
        "custom op dispatch (noop returning empty_like)": lambda: torch.ops.eagerbench.noop(src),
        "plain call (noop's body)": lambda: torch.empty_like(src),
        "torch.compiler.is_compiling()": torch.compiler.is_compiling,
        "torch.is_grad_enabled()": torch.is_grad_enabled,
    }
    del tmap
    return [dict(_common("mechanisms"), stages=_time_stages(stages))]


def _encode_map(driver, t):
    """A 2-D bf16 128B-swizzled descriptor through the driver directly (the same one cuda-core encodes)."""
    rows, cols = t.shape
    dt_ = driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
    err, m = driver.cuTensorMapEncodeTiled(
        dt_, 2, t.data_ptr(), [driver.cuuint64_t(cols), driver.cuuint64_t(rows)],
        [driver.cuuint64_t(t.stride(0) * 2)], [driver.cuuint32_t(64)] * 2, [driver.cuuint32_t(1)] * 2,
        driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
        driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(err)
    return m


LINEAR_CASES = (((16, 1, 2048), 2048), ((4, 1024, 2048), 5632))  # (x shape, N): llama-1b-ish decode, prefill
CPU_N, CPU_ROUNDS = 64, 30  # --device cpu: N for every case; rounds of 100 calls, the minimum kept


def _stub_device() -> None:
    """gemmlab's host path on CPU tensors with nothing launched: tests/fakes.py's fakes, a no-op launch."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    import fakes

    from gemmlab import ops

    class NoLaunch(fakes.FakeEngine):
        def prepare(self, a, b, out, *, bias, activation, has_c, c):
            class Launch:
                def run(self, stream, a, b, out, bias, c, alpha, beta):
                    pass
            return Launch()

    eng = NoLaunch()
    ops._check_device, ops._load_engine, ops._sm_count = (lambda d: None), (lambda: eng), (lambda d: 132)
    ops._stream, ops._fast_device = (lambda dev: 7), (lambda a: True)
    fakes.forget()


def linear_records(device: str, out: str, rounds: int = 7) -> list[dict]:
    """Host microseconds per call of a patched nn.Linear (and, on a GPU, of nn.Linear), interleaved. Each
    record is appended to ``out`` as soon as it is measured (a run cut short keeps what it measured)."""
    from gemmlab.timer import eager_host_us

    cpu = device == "cpu"
    if cpu:
        _stub_device()
    recs = []
    for shape, N in LINEAR_CASES:
        K = shape[-1]
        if cpu:  # the Python path does not depend on N; a small N keeps CPU allocations of (N, K) grads out
            N = CPU_N
        ref = torch.nn.Linear(K, N, bias=False, device=device, dtype=torch.bfloat16)
        ours = torch.nn.Linear(K, N, bias=False, device=device, dtype=torch.bfloat16)
        gemmlab.patch(ours)
        pool = [torch.randn(shape, device=device, dtype=torch.bfloat16) for _ in range(4)]
        pool_g = [t.clone().requires_grad_() for t in pool]
        g = torch.randn(*shape[:-1], N, device=device, dtype=torch.bfloat16)
        it = [0]

        def nxt(p):
            it[0] = (it[0] + 1) % len(p)
            return p[it[0]]

        def fwd_inference(m):
            with torch.inference_mode():
                return m(nxt(pool))

        def fwd_grad(m):
            return m(nxt(pool))

        def fwd_bwd(m):
            x = nxt(pool_g)
            x.grad = m.weight.grad = None
            m(x).backward(g)

        for kind, fn in (("inference_mode forward", fwd_inference), ("forward with grad", fwd_grad),
                         ("forward + backward (dx, dW)", fwd_bwd)):
            sides = {"gemmlab": lambda: fn(ours)} if cpu else {"gemmlab": lambda: fn(ours), "torch": lambda: fn(ref)}
            times = {k: [] for k in sides}
            for f in sides.values():  # warm: prepared calls, allocator, cuBLAS
                for _ in range(3):
                    f()
            for _ in range(rounds if not cpu else CPU_ROUNDS):
                for k, f in sides.items():
                    times[k].append(_median_us(f, reps=1, inner=100) if cpu else eager_host_us(f, calls=30, rounds=1))
            # CPU: the minimum (the shared development machine's noise only adds); GPU: the median of rounds
            host = {k: (min(v) if cpu else statistics.median(v)) for k, v in times.items()}
            rec = dict(_common("linear") if not cpu else {"time": dt.datetime.now(dt.timezone.utc).isoformat(
                timespec="seconds"), "git_sha": git_sha(), "gpu": None, "suite": "eager", "kind": "linear"},
                device="cpu-stub" if cpu else "cuda", x_shape=list(shape), N=N, K=K, step=kind,
                gemmlab_host_us=host["gemmlab"], torch_host_us=host.get("torch"),
                extra_host_us=None if cpu else host["gemmlab"] - host["torch"], rounds=rounds if not cpu else CPU_ROUNDS,
                stat="min" if cpu else "median")
            recs.append(rec)
            append_records(out, [rec])
            print(f"  x {str(shape):<16} N {N:>5} {kind:<30} gemmlab {host['gemmlab']:7.1f} us"
                  + ("" if cpu else f"  torch {host['torch']:7.1f} us  (+{rec['extra_host_us']:.1f})"), flush=True)
        if not cpu:
            recs.append(dict(_common("linear_stages"), x_shape=list(shape), N=N, K=K,
                             stages=_linear_stages(ref, ours, pool[0])))
            append_records(out, recs[-1:])
        stages = _backward_stages(ref, ours, pool_g, g, cpu)
        recs.append(dict(_common("linear_backward_stages") if not cpu else {
            "time": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "git_sha": git_sha(), "gpu": None,
            "suite": "eager", "kind": "linear_backward_stages"}, device="cpu-stub" if cpu else "cuda",
            x_shape=list(shape), N=N, K=K, stages=stages))
        append_records(out, recs[-1:])
    return recs


def _backward_alone_us(m, xs, g, cpu: bool, calls: int = 30, rounds: int = 7) -> float:
    """Host time of ``y.backward(g)`` alone (the forwards run before the clock starts), per call: each round
    builds ``calls`` graphs, gives the GPU a sleep kernel (as ``eager_host_us``), then runs their backwards
    (x's and the weight's gradients reset before each, inside the clock for both sides); median of rounds
    (CPU: minimum of CPU_ROUNDS)."""
    times = []
    for _ in range(rounds if not cpu else CPU_ROUNDS):
        pairs = [(xs[i % len(xs)], m(xs[i % len(xs)])) for i in range(calls)]
        if not cpu:
            torch.cuda.synchronize()
            torch.cuda._sleep(150_000_000)  # eager_host_us's default busy_cycles
        t0 = time.perf_counter_ns()
        for x, y in pairs:
            x.grad = m.weight.grad = None
            y.backward(g)
        times.append((time.perf_counter_ns() - t0) / calls / 1e3)
        if not cpu:
            torch.cuda.synchronize()
    return min(times) if cpu else statistics.median(times)


def _backward_stages(ref, ours, xs, g, cpu: bool) -> dict[str, float]:
    """Where a patched nn.Linear's backward spends host time: the backward alone on both sides, then its
    two GEMMs' kept prepared calls (``ops._Call.grads``) called from the main thread (autograd runs them in
    its device thread), each launch alone, and how many driver calls found no current context while the
    backwards ran (``jit.launch.CONTEXT_RETRIES``: a count that grows with the calls would mean the backward
    thread pays a context switch and a retry every time)."""
    from gemmlab import functional, ops
    from gemmlab.jit import launch as L
    from gemmlab.timer import eager_host_us

    w = ours.weight
    N, K = w.shape
    x = xs[0]
    for _ in range(3):
        x.grad = w.grad = None
        ours(x).backward(g)
    retries = getattr(L, "CONTEXT_RETRIES", 0)
    out = {"gemmlab backward alone": _backward_alone_us(ours, xs, g, cpu)}
    out["driver calls retried for a missing context, per backward"] = (getattr(L, "CONTEXT_RETRIES", 0) - retries) / (7 * 30)
    if cpu:  # (GEMMLAB_SRC: code from before the counter has none)
        out.pop("driver calls retried for a missing context, per backward")
    if not cpu:
        out["torch backward alone"] = _backward_alone_us(ref, xs, g, cpu)
    entry = ops._CALLS.get(functional._linear_key(x, w, None, None))
    x2, dz = x.detach().reshape(-1, K), g.reshape(-1, N)
    stages = {}
    for key, call in entry.call.grads.items():
        which = key[0]  # "a" (dX) or "b" (dW), then dz's metadata
        args = (dz, w.detach(), None) if which == "a" else (dz.t(), x2, None)
        name = "dX = dz @ w" if which == "a" else "dW = dz^T @ x"
        stages[f"{name}: kept prepared call (torch.empty + launch)"] = lambda c=call, a=args: c(*a, 1.0, 0.0, None, None)
        if call.launch is not None and not cpu:
            o = torch.empty(call.shape, dtype=call.p.out_dtype, device=x.device)
            stages[f"{name}: launch .run alone"] = (lambda c=call, a=args, o=o: c.launch.run(
                ops._stream(x.get_device()), a[0], a[1], o, None, None, 1.0, 0.0))
    for name, fn in stages.items():
        for _ in range(5):
            fn()
        out[name] = eager_host_us(fn, calls=50, rounds=5) if not cpu else _median_us(fn, reps=21, inner=200)
    for name, v in out.items():
        print(f"    {name:<62} {v:8.2f}" + ("" if "retried" in name else " us"), flush=True)
    return out


def _linear_stages(ref, ours, x) -> dict[str, float]:
    """The patched forward's pieces under inference_mode, each alone, host time with the GPU kept busy."""
    from gemmlab import functional, ops
    from gemmlab.timer import eager_host_us

    w = ours.weight
    N, K = w.shape
    with torch.inference_mode():
        ours(x)
        entry = ops._CALLS.get(functional._linear_key(x, w, None, None))
        x2 = x.reshape(-1, K)
        out = torch.empty(x2.shape[0], N, device=x.device, dtype=x.dtype)
        dev = x.get_device()
        stages = {
            "nn.Linear (torch), whole forward": lambda: ref(x),
            "F.linear (torch)": lambda: torch.nn.functional.linear(x, ref.weight),
            "torch.mm on the 2-D view": lambda: torch.mm(x2, ref.weight.t()),
            "gemmlab nn.Linear (patched), whole forward": lambda: ours(x),
            "functional._linear_fast (the fast path)": lambda: functional._linear_fast(x, w, None, None),
            "functional._linear_key + ops._CALLS.get": lambda: ops._CALLS.get(functional._linear_key(x, w, None, None)),
            "prepared call (torch.empty + launch)": lambda: entry.call(x2, w.t(), None, 1.0, 0.0, None, None),
            "launch .run alone (preallocated out)": lambda: entry.call.launch.run(ops._stream(dev), x2, w.t(), out, None,
                                                                                  None, 1.0, 0.0),
            "torch.empty (rows, N)": lambda: torch.empty((x2.shape[0], N), dtype=x.dtype, device=x.device),
        }
        out_us = {}
        for name, fn in stages.items():
            for _ in range(5):
                fn()
            out_us[name] = eager_host_us(fn, calls=50, rounds=5)
            print(f"    {name:<50} {out_us[name]:7.2f} us", flush=True)
    return out_us


FP8_SHAPES = ((16, 4096, 4096), (128, 4096, 4096), (2048, 4096, 4096))  # fp8_eager.jsonl's probe shapes


def _fp8_operands(M: int, N: int, K: int, device: str) -> dict:
    """e4m3 operands of (M, K) and (N, K), and scales per mode: "tensor" (0-dim), "block_mn" (1 x 128 /
    128 x 128, MN-major as ``fp8.quantize_blocks`` stores them: read in place), "block_row" (the same
    values row-major: A's re-laid on every call)."""
    from gemmlab import fp8

    x, w = torch.randn(M, K, device=device), torch.randn(N, K, device=device)
    (a, sa), (q, sb) = fp8.quantize_per_tensor(x), fp8.quantize_per_tensor(w)
    (ab, sab), (qb, sbb) = fp8.quantize_blocks(x, 1), fp8.quantize_blocks(w, 128)
    return {"tensor": (a, q.t(), sa, sb), "block_mn": (ab, qb.t(), sab, sbb),
            "block_row": (ab, qb.t(), sab.contiguous(), sbb.contiguous())}


def _stub_fp8() -> None:
    """``gemmlab.scaled_mm``'s host path on CPU tensors with nothing launched: the eager path taken (as
    for CUDA tensors), the prepared launch and ``launch_fp8`` no-ops (no descriptors, no driver)."""
    from gemmlab import engine2, fp8, ops

    class NoLaunch:
        def __init__(self, p, a, w, sa, sb, out, *, bias):
            pass

        def run(self, stream, a, b, sa, sb, out, bias):
            pass

    engine2.Fp8Launch, engine2.launch_fp8 = NoLaunch, (lambda *args, **kw: None)
    fp8._runs_here, ops._stream, ops._fast_device = (lambda a: True), (lambda dev: 7), (lambda a: True)


def fp8_records(device: str, out: str, reps: int) -> list[dict]:
    """Host (GPU kept busy) and wall (idle GPU, back to back) microseconds per eager call of
    ``gemmlab.scaled_mm`` per scale mode against ``torch._scaled_mm`` (per-tensor scales; on the H200's
    torch it takes no 1 x 128 / 128 x 128 blocks) and ``torch.mm`` in bf16, interleaved, the best turn of
    ``reps`` for host and the median for wall; then the op as torch.compile calls it and ``fp8.gemm``
    (validation and planning every call, the unprepared launch). ``device`` cpu: gemmlab's side alone
    with the launches stubbed (``_stub_fp8``), the minimum of CPU_ROUNDS rounds of 100 calls."""
    from gemmlab import fp8

    cpu = device == "cpu"
    if cpu:
        _stub_fp8()
    recs = []
    for M, N, K in FP8_SHAPES:
        ops_ = _fp8_operands(M, N, K, device)
        sides = {f"scaled_mm {mode}": (lambda t=t: gemmlab.scaled_mm(*t)) for mode, t in ops_.items()}
        a, b, sa, sb = ops_["tensor"]
        sides["op (torch.ops.gemmlab.scaled_mm) tensor"] = lambda: torch.ops.gemmlab.scaled_mm(a, b, sa, sb, None,
                                                                                                 None, None)
        sides["fp8.gemm tensor (validate, plan, unprepared launch)"] = lambda: fp8.gemm(a, b, sa, sb)
        if not cpu:
            abf, wbf = _rand(M, K), _rand(N, K)
            sides["torch._scaled_mm tensor"] = lambda: torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)
            sides["torch.mm bf16"] = lambda: torch.mm(abf, wbf.t())
        rec = dict(_head("fp8", cpu), M=M, N=N, K=K, **_time_sides(sides, cpu, reps))
        recs.append(rec)
        append_records(out, [rec])
        _print_sides(f"{M:>5} x {N} x {K}", rec)
    return recs


def _head(kind: str, cpu: bool) -> dict:
    """A record's head: ``_common``'s on a GPU, the time, sha and kind alone with the launches stubbed."""
    if not cpu:
        return _common(kind)
    return {"time": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "git_sha": git_sha(),
            "gpu": None, "suite": "eager", "kind": kind}


def _time_sides(sides: dict, cpu: bool, reps: int) -> dict:
    """Each side's host and wall microseconds per call, the sides interleaved: on a GPU ``reps`` turns of
    50 calls (host: the best turn, GPU kept busy; wall: the median turn, idle GPU, back to back); on CPU
    (launches stubbed) host alone, the minimum of CPU_ROUNDS rounds of 100 calls."""
    from gemmlab.timer import eager_host_us, eager_wall_us

    for f in sides.values():  # warm: prepared calls, compiles, cuBLAS
        for _ in range(3):
            f()
    host = {k: [] for k in sides}
    wall = {k: [] for k in sides}
    for _ in range(CPU_ROUNDS if cpu else reps):
        for k, f in sides.items():
            if cpu:
                host[k].append(_median_us(f, reps=1, inner=100))
            else:
                host[k].append(eager_host_us(f, calls=50, rounds=1))
                wall[k].append(eager_wall_us(f, calls=50, rounds=1))
    return dict(device="cpu-stub" if cpu else "cuda", stat="min host" if cpu else "min host, median wall",
                rounds=CPU_ROUNDS if cpu else reps, host_us={k: min(v) for k, v in host.items()},
                wall_us=None if cpu else {k: statistics.median(v) for k, v in wall.items()})


def _print_sides(case: str, rec: dict) -> None:
    for k, h in rec["host_us"].items():
        print(f"  {case}  {k:<55} host {h:7.1f} us" + (f"  wall {rec['wall_us'][k]:7.1f} us" if rec["wall_us"]
                                                         else ""), flush=True)


# (G experts, T tokens, N, K): 8 experts of a 1024-wide layer at 64 and 512 tokens (the worklog's CPU probe:
# 512 x 1024 x 1024), and Mixtral's gate/up projection at a decode batch of 64 tokens.
GROUPED_SHAPES = ((8, 64, 1024, 1024), (8, 512, 1024, 1024), (8, 64, 28672, 4096))


def _grouped_operands(G: int, T: int, N: int, K: int, device: str) -> dict:
    """grouped_mm's arguments per mode, T tokens spread evenly over G experts: bf16 contiguous (G + 1
    offsets) and masked ((G, T / G, K) slabs, counts), e4m3 per-tensor (a scale per expert) and block
    scales (MN-major as the quantizers store them, read in place; "block_row": a's row-major, re-laid
    every call), all contiguous."""
    from gemmlab import fp8

    x, w = torch.randn(T, K, device=device), torch.randn(G, N, K, device=device)
    offs = torch.arange(0, T + 1, T // G, dtype=torch.int32, device=device)
    counts = torch.full((G,), T // G, dtype=torch.int32, device=device)
    a, b = x.to(torch.bfloat16), w.to(torch.bfloat16)
    (q, sa), qs = fp8.quantize_per_tensor(x), [fp8.quantize_per_tensor(w[g]) for g in range(G)]
    qb, sb = torch.stack([t for t, _ in qs]), torch.stack([s.reshape(()) for _, s in qs])
    (qx, sax), (qw, sbw) = fp8.quantize_blocks(x, 1), fp8.quantize_expert_blocks(w, 128)
    return {"bf16 contiguous": dict(a=a, b=b, offsets=offs),
            "bf16 masked": dict(a=a.view(G, T // G, K), b=b, counts=counts),
            "e4m3 tensor": dict(a=q, b=qb, offsets=offs, scale_a=sa, scale_b=sb),
            "e4m3 block": dict(a=qx, b=qw, offsets=offs, scale_a=sax, scale_b=sbw),
            "e4m3 block_row": dict(a=qx, b=qw, offsets=offs, scale_a=sax.contiguous(), scale_b=sbw)}


def _stub_grouped() -> None:
    """``gemmlab.grouped_mm``'s host path on CPU tensors with nothing launched: the eager path taken (as for
    CUDA tensors), the prepared launch and ``grouped.launch`` no-ops (no descriptors, no driver). Works on a
    checkout from before the prepared launch too (GEMMLAB_SRC: its op and ``grouped.run`` alone)."""
    from gemmlab import grouped, ops

    class NoLaunch:
        def __init__(self, *args, **kw):
            pass

        def run(self, *args):
            pass

    grouped.GroupedLaunch, grouped.FitLaunch, grouped.launch = NoLaunch, NoLaunch, (lambda *args, **kw: None)
    grouped._runs_here, ops._stream, ops._fast_device = (lambda a: True), (lambda dev: 7), (lambda a: True)


def grouped_records(device: str, out: str, reps: int) -> list[dict]:
    """Host and wall microseconds per eager call of ``gemmlab.grouped_mm`` per mode (``_grouped_operands``)
    against ``torch._grouped_mm`` (bf16, the same groups as G ends, b as (G, K, N) views) and a loop of
    ``torch.mm`` over the groups (host-side bounds: no sync), interleaved (``_time_sides``); then the op as
    torch.compile calls it and ``grouped.run`` (validation and planning every call, the unprepared
    launch). ``device`` cpu: gemmlab's side alone, launches stubbed (``_stub_grouped``)."""
    from gemmlab import grouped

    cpu = device == "cpu"
    if cpu:
        _stub_grouped()
    recs = []
    for G, T, N, K in GROUPED_SHAPES:
        if cpu and N * K > 4096 * 4096:  # the host path does not depend on the size; CPU memory does
            continue
        ops_ = _grouped_operands(G, T, N, K, device)
        sides = {f"grouped_mm {mode}": (lambda kw=kw: gemmlab.grouped_mm(**kw)) for mode, kw in ops_.items()}
        c = ops_["bf16 contiguous"]
        a, b, offs = c["a"], c["b"], c["offsets"]
        sides["op (torch.ops.gemmlab.grouped_mm) bf16"] = lambda: torch.ops.gemmlab.grouped_mm(a, b, offs, None, None)
        sides["grouped.run bf16 (validate, plan, unprepared launch)"] = lambda: grouped.run(a, b, offs)
        if not cpu:
            ends, bt, bounds = offs[1:].contiguous(), b.transpose(-2, -1), offs.tolist()
            sides["torch._grouped_mm bf16"] = lambda: torch._grouped_mm(a, bt, ends)
            sides["torch.mm loop bf16"] = lambda: [torch.mm(a[bounds[g]:bounds[g + 1]], b[g].t()) for g in range(G)]
        rec = dict(_head("grouped", cpu), G=G, T=T, N=N, K=K, **_time_sides(sides, cpu, reps))
        recs.append(rec)
        append_records(out, [rec])
        _print_sides(f"{G} x {T} x {N} x {K}", rec)
    return recs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="benchmarks/results/eager.jsonl")
    ap.add_argument("--breakdown", action="store_true", help="time gemmlab's path stage by stage")
    ap.add_argument("--mechanisms", action="store_true", help="time the launch building blocks")
    ap.add_argument("--linear", action="store_true", help="patched nn.Linear vs nn.Linear, a decoder's pattern")
    ap.add_argument("--fp8", action="store_true", help="gemmlab.scaled_mm per scale mode vs torch._scaled_mm")
    ap.add_argument("--grouped", action="store_true", help="gemmlab.grouped_mm per mode vs torch._grouped_mm")
    ap.add_argument("--device", default="cuda", help="cpu: --linear's / --fp8's / --grouped's gemmlab side, "
                    "launches stubbed")
    ap.add_argument("--no-calls", action="store_true", help="skip the per-call and stack measurements")
    ap.add_argument("--stack-only", action="store_true", help="of the per-call and stack measurements, the stack only")
    ap.add_argument("--dtypes", default="bfloat16,float16")
    ap.add_argument("--reps", type=int, default=5,
                    help="interleaved turns per shape (host: the best turn; wall and ratio: the median turn; "
                         "the stack takes at least 9)")
    ap.add_argument("--shapes", default=None, help="M,N,K;M,N,K: per-call records of these shapes instead of "
                    "the eager suite's (no stack)")
    args = ap.parse_args(argv)
    recs = []
    if args.linear:
        print(f"== linear ({args.device})", flush=True)
        linear_records(args.device, args.out)  # (appended as measured)
    if args.fp8:
        print(f"== fp8 ({args.device})", flush=True)
        fp8_records(args.device, args.out, args.reps)  # (appended as measured)
    if args.grouped:
        print(f"== grouped ({args.device})", flush=True)
        grouped_records(args.device, args.out, args.reps)  # (appended as measured)
    if args.mechanisms:
        print("== mechanisms", flush=True)
        recs += mechanism_records()
    if args.breakdown:
        print("== breakdown (M=16, N=4096, K=4096)", flush=True)
        recs += breakdown_records()
        print("== breakdown (M=2048, N=4096, K=4096)", flush=True)
        recs += breakdown_records(2048, 4096, 4096)
    append_records(args.out, recs)
    if not args.no_calls:  # appended record by record: a run cut short keeps what it measured
        for name in args.dtypes.split(","):
            dtype = getattr(torch, name)
            shapes = [tuple(int(x) for x in s.split(",")) for s in args.shapes.split(";")] if args.shapes else None
            if not args.stack_only:
                print(f"== per call, {name}", flush=True)
                per_call_records(dtype, args.reps, shapes, args.out)
            if not shapes:
                print(f"== stack, {name}", flush=True)
                stack_records(dtype, args.reps, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
