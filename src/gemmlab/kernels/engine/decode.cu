// engine.decode: the small-M (decode) kernel behind gemmlab.matmul, for M <= 64 tokens.
//
// Decode is memory-bound: every weight byte is read once and used M times, so the kernel's only job is
// to keep enough weight loads in flight to saturate HBM, and to waste nothing around them.
//
//  * Swapped operands. out^T (N x M) = W (N x K) . X^T with mma.sync m16n8k16: the weight is the MMA's
//    16-row A operand (nothing wasted for any M) and the tokens are its 8-column B operand (M padded to
//    NT x 8 tokens, NT = 1, 2, 4 or 8).
//  * No shared memory for W: loads go straight from global memory into fragments. A dot product does
//    not care in which order k is summed, so k is permuted the same way for W and X: lane (g, q)
//    (g = lane / 4, q = lane % 4) loads 16 bytes (8 consecutive k) at k offset 8q of weight rows g and
//    g + 8 and of token g. In m16n8k16 that lane holds A(row g/g+8, k 2q,2q+1,2q+8,2q+9) and
//    B(k same, column g), so values 0-3 of the 8 feed one mma (slots 2q,2q+1 then 2q+8,2q+9) and values
//    4-7 the next: a warp covers 16 rows x 32 k with every 64-byte row segment fully used.
//    (tests/test_decode.py emulates this mapping in numpy.)
//  * Memory-level parallelism: U such 32-k chunks per iteration, all 2U weight loads issued before any
//    mma, so a warp keeps 32 x 2U x 16 B in flight. W is streamed with ld.global.nc.L1::no_allocate
//    (read once: leave L1 to X); X is tiny and re-read by every warp of the CTA at the same k, so it goes
//    through L1 (ld.global.nc).
//  * Work split. A warp owns 16 weight rows x one K piece (PIECE elements, a multiple of 32U). A CTA is
//    8 warps = RW row groups x KW = 8 / RW pieces (RW is a run-time argument); blockIdx.y adds more K
//    pieces (split-K across CTAs) so that small N still gives every SM several warps.
//  * Deterministic reduction. Warps of a CTA add their fragments through shared memory in a fixed order.
//    With split-K (SPLIT=1, gridDim.y > 1) each CTA writes its fp32 partial (M x rows) to its own
//    workspace slot; a counter per row block tells the last CTA to arrive, which adds all slots in slot
//    order (so the result does not depend on arrival order), runs the epilogue, and puts the counter back
//    to zero for the next launch (the host zeroes counters once, at allocation).
//  * Epilogue as in hopper/h11_general.cu: out = act(alpha * acc + beta * C + bias), fp32 math, stored
//    as TO. The out^T tile is transposed on the way through shared memory, so stores run along N.
//
// Host-side contract (gemmlab/decode.py checks it): W and X K-contiguous with 16-byte aligned base and
// rows, K % 8 == 0, M <= 8 * NT, Out row-major with unit column stride.
#include "common/epilogue.cuh"

namespace decode {

constexpr int WARPS = 8;  // warps per CTA (RW row groups x KW k pieces)

// A weight element is read exactly once: bypass L1 so it keeps X (PTX ISA "ld", cache eviction priority
// / .L1::no_allocate; .nc: the data is read-only for the kernel's lifetime).
__device__ __forceinline__ uint4 ld_stream(const void* p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}

// L2 prefetch (PTX ISA "prefetch"): starts the HBM read of a later chunk without holding registers.
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

// Activations: every warp of the CTA reads the same 16 bytes, so keep them in L1.
__device__ __forceinline__ uint4 ld_shared_by_warps(const void* p) {
    uint4 v;
    asm("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

// PTX ISA "Warp-level matrix multiply-accumulate instructions", mma.m16n8k16 with f32 accumulators.
template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1);
template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0,
                                                         u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma_16816<__half>(float (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// One 32-k chunk for all NT token tiles: w_top / w_bot are the lane's 8 k of rows g and g + 8, x[j] its
// 8 k of token 8j + g. Values 0-3 go to the first mma, 4-7 to the second (see the header).
template <typename T, int NT>
__device__ __forceinline__ void mma_chunk(float (&acc)[NT][4], const uint4& w_top, const uint4& w_bot,
                                          const uint4 (&x)[NT]) {
#pragma unroll
    for (int j = 0; j < NT; ++j) {
        mma_16816<T>(acc[j], w_top.x, w_bot.x, w_top.y, w_bot.y, x[j].x, x[j].y);
        mma_16816<T>(acc[j], w_top.z, w_bot.z, w_top.w, w_bot.w, x[j].z, x[j].w);
    }
}

}  // namespace decode

// Register budget (ptxas caps registers from the second launch bound): NT = 1 runs three CTAs per SM
// (<= 80 registers), NT >= 2 two (<= 128); the host picks U = 2 for NT = 8 (32 accumulators + 32
// activation registers per chunk leave no room for four chunks of weights). Checked in
// tests/test_decode.py: no local memory in any instantiation.
template <typename T, typename TO, typename TBIAS, int NT, int U, int EPI, int SPLIT>
__global__ void __launch_bounds__(decode::WARPS * 32, NT >= 2 ? 2 : 3)
engine_decode(const T* __restrict__ W, long long ldw, const T* __restrict__ X, long long ldx, int M, int N, int K,
              int RW, int PIECE, float alpha, float beta, const TO* __restrict__ Cin, long long ldc_row,
              long long ldc_col, const TBIAS* __restrict__ bias, float* __restrict__ workspace,
              int* __restrict__ counters, TO* __restrict__ Out, long long ldo) {
    using namespace decode;
    static_assert(NT >= 1 && NT <= 8 && U >= 1, "NT token tiles of 8, U chunks of 32 k per iteration");
    constexpr int MP = NT * 8;        // tokens, padded
    constexpr int CHUNK = 32 * U;     // k per iteration of a warp
    constexpr bool HAS_BIAS = EPI & 1, HAS_C = EPI & 2;
    constexpr int ACT = (EPI >> 2) & 7;
    // Per k piece of the CTA: MP token rows of (16 RW + 4) floats. The +4 pad puts the 8 rows x 4
    // token pairs a warp stores at once in 32 different banks (see the store below); the largest case
    // is RW = 1: 8 x MP x 20, RW = 8: 1 x MP x 132.
    __shared__ float red[WARPS * MP * 20];
    __shared__ int is_last;

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
    const int KW = WARPS / RW, rows_cta = 16 * RW, stride_m = rows_cta + 4;
    const int rg = warp % RW, ks = warp / RW;  // this warp's row group in the CTA and its k piece
    const int row0 = (blockIdx.x * RW + rg) * 16;
    const int piece = blockIdx.y * KW + ks;
    const int k_begin = min(K, piece * PIECE), k_end = min(K, k_begin + PIECE);

    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;

    if (row0 < N) {  // warp-uniform: a row group past N only contributes zeros
        // Rows past N (the last group of a ragged N) and tokens past M re-read the last valid row: the
        // loads stay in bounds and the results are never stored.
        const T* w_top = W + (long long)min(row0 + g, N - 1) * ldw + 8 * q;
        const T* w_bot = W + (long long)min(row0 + g + 8, N - 1) * ldw + 8 * q;
        // Token rows as 32-bit offsets from one pointer (the host keeps M * ldx below 2^31): NT registers
        // instead of 2 NT for pointers, which is what keeps NT = 8 out of local memory.
        const T* x_lane = X + 8 * q;
        int x_row[NT];
#pragma unroll
        for (int j = 0; j < NT; ++j) x_row[j] = min(8 * j + g, M - 1) * (int)ldx;

        int k = k_begin;
        for (; k + CHUNK <= k_end; k += CHUNK) {
            // Ask L2 for the next chunk first. Under register pressure (NT >= 2) ptxas interleaves this
            // chunk's weight loads with the mmas, so a lane may wait on its first loads before issuing the
            // rest; the prefetch keeps the next chunk on its way from HBM regardless, without registers.
            // The 4 lanes of a row split its next 2 x CHUNK bytes: lane q takes bytes [64 q', ...) for
            // q' = q and q + 4 (U = 4: 256 bytes per row, one 64-byte piece per prefetch).
            if (k + 2 * CHUNK <= k_end) {
#pragma unroll
                for (int p = q; p < U; p += 4) {
                    prefetch_l2(w_top - 8 * q + k + CHUNK + 32 * p);
                    prefetch_l2(w_bot - 8 * q + k + CHUNK + 32 * p);
                }
            }
            uint4 wt[U], wb[U];
#pragma unroll
            for (int u = 0; u < U; ++u) {  // all 2U weight loads first (when registers allow: see above)
                wt[u] = ld_stream(w_top + k + 32 * u);
                wb[u] = ld_stream(w_bot + k + 32 * u);
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
                uint4 x[NT];
#pragma unroll
                for (int j = 0; j < NT; ++j) x[j] = ld_shared_by_warps(x_lane + x_row[j] + k + 32 * u);
                mma_chunk<T, NT>(acc, wt[u], wb[u], x);
            }
        }
        // Tail (K of the last piece not a multiple of CHUNK): 32-k chunks with the lane's 8 k zeroed
        // past k_end (K % 8 == 0, so a lane's 8 k are all in or all out).
        for (; k < k_end; k += 32) {
            const bool in = k + 8 * q < k_end;
            const uint4 zero = make_uint4(0, 0, 0, 0);
            const uint4 wt = in ? ld_stream(w_top + k) : zero;
            const uint4 wb = in ? ld_stream(w_bot + k) : zero;
            uint4 x[NT];
#pragma unroll
            for (int j = 0; j < NT; ++j) x[j] = in ? ld_shared_by_warps(x_lane + x_row[j] + k) : zero;
            mma_chunk<T, NT>(acc, wt, wb, x);
        }
    }

    // Fragments -> red[ks][token][row]. Lane (g, q) holds rows g, g + 8 and tokens 8j + 2q, 8j + 2q + 1;
    // with stride_m = 16 RW + 4 the 32 lanes' addresses differ by 8q + g (mod 32 banks): no conflicts.
    float* mine = red + ks * MP * stride_m + 16 * rg;
#pragma unroll
    for (int j = 0; j < NT; ++j) {
        const int m = 8 * j + 2 * q;
        mine[m * stride_m + g] = acc[j][0];
        mine[(m + 1) * stride_m + g] = acc[j][1];
        mine[m * stride_m + g + 8] = acc[j][2];
        mine[(m + 1) * stride_m + g + 8] = acc[j][3];
    }
    __syncthreads();

    // Element i of the CTA's tile is token i / rows_cta, row i % rows_cta: consecutive threads walk N,
    // so the reads here, the workspace traffic and the output stores are all contiguous.
    const int elems = M * rows_cta;
    const int n0 = blockIdx.x * rows_cta;
    auto cta_sum = [&](int i) {  // the KW pieces of this CTA, in piece order
        const int m = i / rows_cta, r = i % rows_cta;
        float v = 0.0f;
        for (int s = 0; s < KW; ++s) v += red[(s * MP + m) * stride_m + r];
        return v;
    };

    const float* slots = nullptr;  // split-K: every CTA's partial of this row block
    if constexpr (SPLIT) {
        if (gridDim.y > 1) {
            float* block_slots = workspace + (size_t)blockIdx.x * gridDim.y * elems;
            for (int i = threadIdx.x; i < elems; i += blockDim.x)
                __stcg(block_slots + (size_t)blockIdx.y * elems + i, cta_sum(i));
            __threadfence();  // this CTA's partial is visible device-wide before the counter moves
            __syncthreads();
            if (threadIdx.x == 0) {
                const int arrived = atomicAdd(counters + blockIdx.x, 1);
                is_last = arrived == (int)gridDim.y - 1;
                if (is_last) counters[blockIdx.x] = 0;  // every CTA of the block has arrived: ready for the next launch
            }
            __syncthreads();
            if (!is_last) return;
            __threadfence();  // pairs with the writers' fences: their partials are read after the counter
            slots = block_slots;
        }
    }

    for (int i = threadIdx.x; i < elems; i += blockDim.x) {
        const int m = i / rows_cta, n = n0 + i % rows_cta;
        float v;
        if (SPLIT && slots != nullptr) {
            v = 0.0f;
            for (int s = 0; s < (int)gridDim.y; ++s) v += __ldcg(slots + (size_t)s * elems + i);  // L2: other SMs wrote them
        } else {
            v = cta_sum(i);
        }
        if (n >= N) continue;
        float x = alpha * v;
        if constexpr (HAS_C) x += beta * to_float(Cin[m * ldc_row + n * ldc_col]);
        if constexpr (HAS_BIAS) x += to_float(bias[n]);
        Out[m * ldo + n] = from_float<TO>(activate<ACT>(x));
    }
}
