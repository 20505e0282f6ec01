"""Clear errors for bad input and for a missing GPU (these run everywhere)."""

import pytest
import torch

from gemmlab import registry
from gemmlab.errors import NoGPUError, UnsupportedProblem
from gemmlab.jit.launch import require_gpu


def test_cpu_tensors_refused_with_a_clear_message():
    spec = registry.get("k01")
    a, b, c = (torch.rand(8, 8) for _ in range(3))
    with pytest.raises(UnsupportedProblem, match="must be a CUDA tensor"):
        spec.run(a, b, c)


def test_unsupported_shape_refused():
    spec = registry.get("h01")
    a = torch.empty(100, 64, dtype=torch.bfloat16)
    b = torch.empty(128, 64, dtype=torch.bfloat16)
    c = torch.empty(100, 128, dtype=torch.bfloat16)
    with pytest.raises(UnsupportedProblem, match="M % 64"):
        spec.run(a, b, c)


def test_zero_size_refused():
    spec = registry.get("k01")
    with pytest.raises(UnsupportedProblem, match=">= 1"):
        spec.run(torch.empty(0, 4), torch.empty(4, 4), torch.empty(0, 4))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_no_gpu_error_is_clear():
    with pytest.raises(NoGPUError, match="needs an NVIDIA GPU"):
        require_gpu("a test")
    from gemmlab.gpu import gpu_info

    with pytest.raises(NoGPUError):
        gpu_info()
