"""How the engine's kernels are told their fused epilogue and their element types.

``out = act(alpha * acc + beta * C + bias)`` is chosen at compile time: a bit field ``EPI`` (bit 0 bias,
bit 1 C, bits 2-4 the activation code of ``kernels/common/epilogue.cuh``, bit 5 h11's DIRECT stores) and
the C++ names of the input, output and bias types, all template arguments of the kernels.
"""

from __future__ import annotations

import torch

ACTIVATIONS = {None: 0, "relu": 1, "gelu": 2, "gelu_tanh": 3, "silu": 4}  # epilogue.cuh's codes
CTYPES = {torch.bfloat16: "__nv_bfloat16", torch.float16: "__half", torch.float32: "float"}
DIRECT = 1 << 5  # h11: stores row by row from the slab (rows TMA cannot write)


def epi_bits(has_bias: bool, has_c: bool, activation: str | None) -> int:
    """The EPI template argument for an epilogue (DIRECT not included)."""
    return int(has_bias) | (int(has_c) << 1) | (ACTIVATIONS[activation] << 2)


def ctypes(in_dtype: torch.dtype, out_dtype: torch.dtype, bias_dtype: torch.dtype | None) -> tuple[str, str, str]:
    """The C++ names of the input, output and bias types (``float`` where there is no bias)."""
    return CTYPES[in_dtype], CTYPES[out_dtype], CTYPES[bias_dtype] if bias_dtype is not None else "float"
