// Fused epilogue math for the general kernel: alpha * acc + beta * C + bias, then an activation.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "ptx.cuh"

enum Activation { ACT_NONE = 0, ACT_RELU = 1, ACT_GELU = 2, ACT_GELU_TANH = 3, ACT_SILU = 4 };

template <int ACT>
__device__ __forceinline__ float activate(float v) {
    if constexpr (ACT == ACT_RELU) return fmaxf(v, 0.0f);
    if constexpr (ACT == ACT_GELU) return 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
    if constexpr (ACT == ACT_GELU_TANH) {
        const float u = 0.79788456080286536f * (v + 0.044715f * v * v * v);
        return 0.5f * v * (1.0f + tanhf(u));
    }
    // __fdividef: MUFU.RCP and a multiply instead of IEEE division's slow path (2 ulp; for v < -88
    // the denominator is inf and the result -0, where SiLU underflows anyway).
    if constexpr (ACT == ACT_SILU) return __fdividef(v, 1.0f + __expf(-v));
    return v;
}

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

// Two floats -> one 32-bit register of two 16-bit values (low half first), for stmatrix.
__device__ __forceinline__ u32 pack2(float lo, float hi, __nv_bfloat16*) { return pack_bf16x2(lo, hi); }
__device__ __forceinline__ u32 pack2(float lo, float hi, __half*) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<u32*>(&v);
}

template <typename TO>
__device__ __forceinline__ TO from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16(x); }
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half(x); }
