import os
import tempfile

import pytest
import torch

# Tests never touch the user's cache: every session compiles into its own folder.
os.environ.setdefault("GEMMLAB_CACHE_DIR", tempfile.mkdtemp(prefix="gemmlab-test-cache-"))


def _has_gpu() -> bool:
    return torch.cuda.is_available()


def _has_hopper() -> bool:
    return _has_gpu() and torch.cuda.get_device_capability() >= (9, 0)


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs an NVIDIA GPU")
    skip_hopper = pytest.mark.skip(reason="needs a Hopper (sm_90) GPU")
    # Long CPU sweeps (every instantiation the planner may pick) run only when asked for: -m slow.
    skip_slow = None if "slow" in (config.getoption("markexpr") or "") else pytest.mark.skip(reason="slow: -m slow")
    for item in items:
        if skip_slow is not None and "slow" in item.keywords:
            item.add_marker(skip_slow)
        if "gpu" in item.keywords and not _has_gpu():
            item.add_marker(skip_gpu)
        elif "hopper" in item.keywords and not _has_hopper():
            item.add_marker(skip_hopper)


@pytest.fixture
def on_cpu(monkeypatch):
    """The real gemmlab.matmul implementation on CPU tensors, with a fake engine and fake fp32 step
    (tests/fakes.py); yields the fakes (``.engine``, ``.sgemm``)."""
    import fakes

    yield fakes.install(monkeypatch)
    fakes.forget()
