"""The sanitizer's driver (``tests/test_sanitizer_gpu.py``'s DRIVER) on the host, with the GPU stubbed
(``test_fuzzing.HostOnly``): every forced plan it asks for exists and matches its tensors (Engine2Launch's
checks, TMA's rules), every route it names is the kernel that is prepared, and it reaches its end. Run
under compute-sanitizer on a GPU, the same script checks the kernels' memory accesses and races."""

import collections

import torch

from test_fuzzing import HostOnly
from test_sanitizer_gpu import DRIVER


def test_sanitizer_driver_covers_every_route_on_the_host(monkeypatch):
    import types

    from gemmlab import decode, engine

    HostOnly(monkeypatch)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: types.SimpleNamespace(multi_processor_count=132))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    ran = collections.Counter()
    gemm = engine.gemm

    def gemm_then_reference(a, b, out, *, bias=None, activation=None, alpha=1.0, beta=0.0, c=None, plan=None):
        """The real host path (prepared, launch recorded), then the result the kernel would have stored."""
        has_c = c is not None and beta != 0.0
        call = engine.prepare(a, b, out, bias=bias, activation=activation, has_c=has_c, c=c if has_c else None,
                              plan=plan)
        kind = type(call).__name__
        if isinstance(call, engine.Engine2Launch):
            kind += f" {call.plan.schedule} bm={call.plan.bm}" + (" direct" if call.plan.direct else "")
        ran[kind] += 1
        gemm(a, b, out, bias=bias, activation=activation, alpha=alpha, beta=beta, c=c, plan=plan)
        ref = alpha * (a.double() @ b.double()) + (beta * c.double() if has_c else 0.0)
        ref = ref + (bias.double() if bias is not None else 0.0)
        act = {None: lambda x: x, "relu": torch.relu, "silu": lambda x: x * torch.sigmoid(x)}[activation]
        out.copy_(act(ref))

    monkeypatch.setattr(engine, "gemm", gemm_then_reference)
    run_variant = decode.run_variant

    def run_variant_then_reference(a, b, out, variant=None, *, split=None):
        """A forced decode variant's host path, then its result (the strided split-K launches)."""
        run_variant(a, b, out, variant, split=split)
        ran[f"DecodeLaunch strided={variant.strided} nt={decode.token_tiles(a.shape[0])}"] += 1
        out.copy_(a.double() @ b.double())

    monkeypatch.setattr(decode, "run_variant", run_variant_then_reference)
    printed = []
    script = DRIVER.replace('device="cuda"', 'device="cpu"')
    exec(compile(script, "DRIVER", "exec"), {"__name__": "driver", "print": lambda *a, **k: printed.append(a[0])})
    assert printed[-1] == "all routes ran"
    assert {"H11Launch", "DecodeLaunch"} <= set(ran)
    engine_kinds = {k for k in ran if k.startswith("Engine2Launch")}
    for want in ("data_parallel bm=64", "data_parallel bm=128", "data_parallel bm=256", "split_k bm=64",
                 "split_k bm=128", "stream_k bm=64", "stream_k bm=128"):
        assert f"Engine2Launch {want}" in engine_kinds, (want, engine_kinds)
    assert {s for s in ("data_parallel", "split_k", "stream_k")
            if any(k.startswith(f"Engine2Launch {s}") and k.endswith("direct") for k in engine_kinds)} == \
        {"data_parallel", "split_k", "stream_k"}
    assert any("hybrid" in line for line in printed) and decode.plan(16, 256, 8192, 132).splits > 1
    assert {f"DecodeLaunch strided=True nt={nt}" for nt in (1, 2, 4)} <= set(ran)
