"""Every registered kernel against a float64 reference on the GPU: fresh random inputs, poisoned output."""

import pytest
import torch

from gemmlab import registry
from gemmlab.bench import poison_, rel_error

pytestmark = pytest.mark.gpu

SHAPES = {
    "sgemm": [(1, 1, 1), (17, 33, 65), (64, 64, 64), (128, 256, 96), (255, 257, 129), (1000, 1001, 999),
              (4095, 4097, 1023)],
    "hopper": [(128, 256, 64), (512, 512, 512), (1024, 2048, 768), (2048, 1024, 4096), (3072, 3072, 256),
               (4096, 4096, 1024)],
}


def _cases():
    for spec in registry.all_kernels():
        for shape in SHAPES[spec.ladder]:
            yield pytest.param(spec, shape, id=f"{spec.name}-{'x'.join(map(str, shape))}")


@pytest.mark.parametrize("spec,shape", list(_cases()))
def test_kernel_matches_float64_reference(spec, shape):
    if spec.arch.startswith("sm_90") and torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("needs sm_90")
    M, N, K = shape
    why = spec.why_unsupported(M, N, K)
    if why:
        pytest.skip(why)
    lad = registry.ladders()[spec.ladder]
    a, b, c = lad.make_inputs(M, N, K, "cuda")
    alpha, beta = (1.0, 0.0) if spec.ladder == "hopper" else (0.75, -0.5)
    out = c.clone()
    if beta == 0.0:
        poison_(out)
    spec.run(a, b, out, alpha=alpha, beta=beta)
    torch.cuda.synchronize()
    ref = lad.reference(a, b, c, alpha, beta)
    err = rel_error(out, ref)
    assert err <= lad.rel_tolerance, f"{spec.name} {shape}: relative error {err:.3e}"


@pytest.mark.parametrize("spec", registry.all_kernels("sgemm"), ids=lambda s: s.name)
def test_sgemm_beta_zero_ignores_poisoned_c(spec):
    M, N, K = 67, 45, 33
    a, b, c = registry.ladders()["sgemm"].make_inputs(M, N, K, "cuda")
    poison_(c)
    spec.run(a, b, c, alpha=1.0, beta=0.0)
    torch.cuda.synchronize()
    assert rel_error(c, a.double() @ b.double()) <= 1e-5


def _config_cases(limit: int = 12):
    shapes = {"sgemm": (255, 257, 129), "hopper": (1024, 2048, 768)}
    for spec in registry.all_kernels():
        cfgs = spec.configs()
        step = max(1, len(cfgs) // limit)
        for cfg in cfgs[::step][:limit]:
            tag = ",".join(f"{k}={v}" for k, v in cfg.items())
            yield pytest.param(spec, cfg, shapes[spec.ladder], id=f"{spec.name}[{tag}]")


@pytest.mark.parametrize("spec,cfg,shape", list(_config_cases()))
def test_every_config_matches_reference(spec, cfg, shape):
    """Each step's tunable configs (up to 12 of them, evenly spread) on one shape."""
    if spec.arch.startswith("sm_90") and torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("needs sm_90")
    M, N, K = shape
    why = spec.why_unsupported(M, N, K, cfg)
    if why:
        pytest.skip(why)
    lad = registry.ladders()[spec.ladder]
    a, b, c = lad.make_inputs(M, N, K, "cuda")
    out = poison_(torch.empty_like(c))
    spec.run(a, b, out, config=cfg)
    torch.cuda.synchronize()
    err = rel_error(out, lad.reference(a, b, c, 1.0, 0.0))
    assert err <= lad.rel_tolerance, f"{spec.name} {cfg}: relative error {err:.3e}"
