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
//    mma (DEPTH = 2: the next iteration's before this one's mmas), so a warp keeps 32 x 2U x 16 B (x RPW
//    row groups, x DEPTH) in flight. See "Variants" above engine_decode. W is streamed with ld.global.nc.L1::no_allocate
//    (read once: leave L1 to X); X is tiny and re-read by every warp of the CTA at the same k, so it goes
//    through L1 (ld.global.nc).
//  * Work split. A warp owns 16 RPW weight rows x one K piece (PIECE elements, a multiple of 32U). A CTA is
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
//  * Rows at any address (ALIGNED = false): W's and X's rows may start at any element (K odd, a sliced
//    view), so a lane's 16 bytes straddle two aligned 16-byte windows. The four lanes of a row need
//    consecutive 16-byte pieces, so lane q's second window is lane q + 1's first, and lane 3's is lane 0's
//    first of the next chunk: each lane loads the window its bytes start in for each of the U chunks, lane
//    0 also the one after the last chunk (``WRow``), and at use a shuffle hands every lane its second window
//    and the 16 bytes are cut out of the 32 (``cut_row``): U + 1 windows read and held for U used, not a
//    copy of W. X's rows are read the same way.
//
// Host-side contract (gemmlab/decode.py checks it): W and X K-contiguous, M <= 8 * NT, Out row-major with
// unit column stride; with ALIGNED also 16-byte aligned bases and rows and K % 8 == 0.
#include "common/epilogue.cuh"

// DECODE_TAIL_AHEAD (a probe's setting, 0 in the library): how many of the K tail's chunks issue their loads
// together (decode::tail_ahead below); 1 is the kernel before session 48 (one chunk's loads, then its mmas).
#ifndef DECODE_TAIL_AHEAD
#define DECODE_TAIL_AHEAD 0
#endif
#ifndef DECODE_PREFETCH_TAIL
#define DECODE_PREFETCH_TAIL 1
#endif

namespace decode {

constexpr int WARPS = 8;  // warps per CTA (RW row groups x KW k pieces)

// A weight element is read exactly once: bypass L1 so it keeps X (PTX ISA "ld", cache eviction priority
// / .L1::no_allocate; .nc: the data is read-only for the kernel's lifetime).
// DECODE_LOAD_HINT (a probe's setting, 0 in the library): 1 asks the L2 to fetch the 256 bytes around each
// load (.L2::256B: the next 128-byte line of a row arrives with this one). An evict-first policy on these
// loads (createpolicy, .L2::cache_hint) holds a 64-bit register and spills the 4-tile variant at its
// 128-register cap, so it is not offered to the probe.
#ifndef DECODE_LOAD_HINT
#define DECODE_LOAD_HINT 0
#endif
__device__ __forceinline__ uint4 ld_stream(const void* p) {
    uint4 v;
    if constexpr (DECODE_LOAD_HINT == 1) {
        asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
            : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
            : "l"(p));
    } else {
        asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
            : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
            : "l"(p));
    }
    return v;
}

// L2 prefetch (PTX ISA "prefetch"): starts the HBM read of a later chunk without holding registers.
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

// Activations: every warp of the CTA reads the same 16 bytes, so keep them in L1. (Staging X in shared
// memory instead would move the same bytes per mma through the same 128 B/clk L1/shared datapath, plus a
// barrier per chunk; RPW = 2 halves those bytes instead.)
__device__ __forceinline__ uint4 ld_shared_by_warps(const void* p) {
    uint4 v;
    asm("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

template <bool STREAM>
__device__ __forceinline__ uint4 ld16(const void* p) {
    return STREAM ? ld_stream(p) : ld_shared_by_warps(p);
}

// The 16 bytes at byte offset s (even, 0..14) of the 32 bytes lo, hi: two selects by 8 and 4 bytes, then
// one byte permute per word for the last 2.
__device__ __forceinline__ uint4 bytes_at(const uint4& lo, const uint4& hi, u32 s) {
    const u32 v[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    u32 a[6], b[5];
#pragma unroll
    for (int i = 0; i < 6; ++i) a[i] = (s & 8) ? v[i + 2] : v[i];
#pragma unroll
    for (int i = 0; i < 5; ++i) b[i] = (s & 4) ? a[i + 1] : a[i];
    const u32 sel = (s & 2) ? 0x5432u : 0x3210u;
    return make_uint4(__byte_perm(b[0], b[1], sel), __byte_perm(b[1], b[2], sel), __byte_perm(b[2], b[3], sel),
                      __byte_perm(b[3], b[4], sel));
}

// STRIDED: the physical weight row of virtual row v. Each 128-row block is transposed as 16 x 8: virtual rows
// 16 c .. 16 c + 15 (one warp's mma tile) are physical rows c, c + 8, ..., c + 120 (one residue class mod 8).
__device__ __forceinline__ int strided_row(int v) { return (v & ~127) | ((v & 15) << 3) | ((v >> 4) & 7); }

// What a lane holds of one row's U chunks (of W, or of X) while the loads are in flight. ALIGNED: its 16
// bytes of each chunk. Else the aligned 16-byte window each of them starts in (v[0 .. U-1]) and v[U]: in
// lane 0, if the row is off 16 bytes, the window after lane 3's last one (the next iteration's first; zero
// elsewhere). Every window loaded holds a byte the row's lanes need, so a read ends at most 15 bytes past
// the tensor's last element, inside that element's aligned 16-byte window: inside its allocation (torch's
// are whole 512-byte blocks; the GPU maps memory in pages of 64 KB or more).
template <bool ALIGNED, int U>
struct WRow {
    uint4 v[ALIGNED ? U : U + 1];
};

// ALIGNED = false: the windows of the U chunks of a row whose lane's first 16 bytes are at p.
template <bool STREAM, int U, typename T>
__device__ __forceinline__ void ld_windows(WRow<false, U>& w, const T* p, int q) {
    const unsigned long long a = reinterpret_cast<unsigned long long>(p);
    const uint4* base = reinterpret_cast<const uint4*>(a & ~15ull);  // a chunk is 64 bytes: 4 windows
#pragma unroll
    for (int u = 0; u < U; ++u) w.v[u] = ld16<STREAM>(base + 4 * u);
    w.v[U] = make_uint4(0, 0, 0, 0);
    if (q == 0 && (a & 15)) w.v[U] = ld16<STREAM>(base + 4 * U);
}

// Chunk u's 16 bytes of the lane from a WRow loaded at an address ``shift`` bytes past a 16-byte boundary
// (warp-uniform call: every lane shuffles). Lane q's second window is lane q + 1's first; lane 3's is lane
// 0's first of chunk u + 1 (v[U] after the last), so lane 0 offers that one and every lane reads lane
// (q + 1) mod 4's offer.
template <bool ALIGNED, int U>
__device__ __forceinline__ uint4 cut_row(const WRow<ALIGNED, U>& w, int u, u32 shift, int q) {
    if constexpr (ALIGNED) {
        return w.v[u];
    } else {
        const uint4 offer = q == 0 ? w.v[u + 1] : w.v[u];
        uint4 hi;
        hi.x = __shfl_sync(0xffffffffu, offer.x, q + 1, 4);
        hi.y = __shfl_sync(0xffffffffu, offer.y, q + 1, 4);
        hi.z = __shfl_sync(0xffffffffu, offer.z, q + 1, 4);
        hi.w = __shfl_sync(0xffffffffu, offer.w, q + 1, 4);
        return bytes_at(w.v[u], hi, shift);
    }
}

// The lane's elements lo .. n - 1 (0 <= lo, n <= 8) of the 8 at p, at any address, the others zero (the K
// tail: lo = 0; the first chunk of a STRIDED piece: lo > 0 drops the elements before k_begin). Each lane
// loads both its windows itself (only those holding one of its elements), no shuffles: lanes differ in lo
// and n.
template <bool STREAM>
__device__ __forceinline__ uint4 ld_range(const void* p, int lo, int n) {
    const unsigned long long a = reinterpret_cast<unsigned long long>(p);
    const u32 s = static_cast<u32>(a & 15);
    const uint4* base = reinterpret_cast<const uint4*>(a & ~15ull);
    const uint4 zero = make_uint4(0, 0, 0, 0);
    const bool any = n > lo;
    const uint4 w0 = (any && s + 2 * lo < 16) ? ld16<STREAM>(base) : zero;
    const uint4 w1 = (any && s + 2 * n > 16) ? ld16<STREAM>(base + 1) : zero;
    uint4 v = bytes_at(w0, w1, s);
    auto keep = [lo, n](u32 w, int i) {
        const u32 low = (2 * i >= lo && 2 * i < n) ? 0xffffu : 0u;
        const u32 high = (2 * i + 1 >= lo && 2 * i + 1 < n) ? 0xffff0000u : 0u;
        return w & (low | high);
    };
    v.x = keep(v.x, 0);
    v.y = keep(v.y, 1);
    v.z = keep(v.z, 2);
    v.w = keep(v.w, 3);
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

// CTAs per SM the register budget is sized for (ptxas caps registers from the second launch bound):
// three (<= 80 registers) for the lightest variant, one (<= 255) when a warp holds 64 token x 32 row
// accumulators (128 registers would spill), else two (<= 128). decode.py's Variant.min_blocks mirrors this.
constexpr __host__ __device__ int min_blocks(int nt, int rpw, int depth) {
    return (nt == 1 && rpw == 1 && depth == 1) ? 3 : (nt * rpw >= 16 ? 1 : 2);
}

// The K tail's chunks whose loads are in flight together (see the tail in engine_decode): a chunk holds NT +
// 2 RPW 16-byte loads (twice that unaligned, two windows each), on top of whatever the main loop left live.
// All four where the registers allow it without spilling (the aligned two-deep variants, 128 registers), two
// elsewhere, one where a warp holds 8 or more token x row-group tiles. Compiled for every variant without
// local memory (tests/test_decode.py); a rule of those compiles, not a register count.
constexpr __host__ __device__ int tail_ahead(int nt, int rpw, int depth, bool aligned) {
    if (DECODE_TAIL_AHEAD > 0) return DECODE_TAIL_AHEAD;
    return nt * rpw >= 8 ? 1 : (aligned && depth == 2 ? 4 : 2);
}

}  // namespace decode

// Variants (template parameters, chosen per NT by decode.default_variant; benchmarks/decode_variants.py
// times the others):
//  * U: 32-k chunks per iteration (2 U RPW 16-byte weight loads per lane and iteration).
//  * RPW: 16-row groups per warp. Each X fragment feeds RPW weight fragments, so a warp reads NT / (2 RPW)
//    bytes of X from L1 per weight byte instead of NT / 2 (at NT = 8, RPW = 2: 2x instead of 4x), and
//    keeps RPW times as many weight bytes in flight. Costs 4 NT RPW accumulator registers.
//  * DEPTH: 1 = an iteration's weight loads are issued, then its mmas run; 2 = the loads for the next
//    iteration are issued before this iteration's mmas (two register buffers, the loop unrolled by two
//    so no copies), so a warp always has a full iteration of weight loads in flight.
//  * PF: L2 prefetch distance, in iterations past the last one loaded into registers (0 = none).
//  * ALIGNED: the 16-byte contract (one 16-byte load a lane, row and chunk); false: rows at any address
//    (U + 1 windows a lane and row: ``WRow``).
//  * STRIDED (unaligned, RPW = 1 only): a warp's 16 rows are 8 apart (``strided_row``), so they share one
//    shift and its windows go to the mma as loaded; X is cut instead, one cut a token tile and chunk
//    rather than three. Its stores run 8 rows apart.
// The epilogue by name: HAS_BIAS, HAS_C (beta * C) and ACT (epilogue.cuh's activation code); SPLIT: split-K.
template <typename T, typename TO, typename TBIAS, int NT, int U, int RPW, int DEPTH, int PF, bool ALIGNED,
          bool STRIDED, bool HAS_BIAS, bool HAS_C, int ACT, bool SPLIT>
__global__ void __launch_bounds__(decode::WARPS * 32, decode::min_blocks(NT, RPW, DEPTH))
engine_decode(const T* __restrict__ W, long long ldw, const T* __restrict__ X, long long ldx, int M, int N, int K,
              int RW, int PIECE, float alpha, float beta, const TO* __restrict__ Cin, long long ldc_row,
              long long ldc_col, const TBIAS* __restrict__ bias, float* __restrict__ workspace,
              int* __restrict__ counters, TO* __restrict__ Out, long long ldo) {
    using namespace decode;
    static_assert(NT >= 1 && NT <= 8 && U >= 1 && (128 % (32 * U)) == 0, "NT token tiles of 8, U chunks of 32 k");
    static_assert(RPW == 1 || RPW == 2, "16 or 32 weight rows per warp");
    static_assert(DEPTH == 1 || DEPTH == 2, "one or two iterations of weight loads in flight");
    static_assert(!STRIDED || (!ALIGNED && RPW == 1), "strided rows: unaligned rows, one 16-row group a warp");
    constexpr int MP = NT * 8;        // tokens, padded
    constexpr int CHUNK = 32 * U;     // k per iteration of a warp
    constexpr int ROWS = 16 * RPW;    // weight rows per warp
    constexpr int TAIL_AHEAD = tail_ahead(NT, RPW, DEPTH, ALIGNED);  // K tail chunks loaded together
    // Per k piece of the CTA: MP token rows of (ROWS RW + 4) floats, KW pieces (the host sizes it:
    // decode.smem_bytes). The +4 pad puts the 8 rows x 4 token pairs a warp stores at once in 32
    // different banks (see the store below).
    extern __shared__ float red[];
    __shared__ int is_last;

    // Unaligned: the warp index through a shuffle from lane 0, so ptxas knows it is the same in every lane: the
    // loops and branches that depend on it are then uniform and the shuffles in them (``cut``) need no
    // divergent fallback path (BRA.DIV), which also left the k-loop without a single entry. (Aligned, the
    // same shuffle costs the 80-register NT = 1 variant a spill.)
    const int warp = ALIGNED ? threadIdx.x / 32 : __shfl_sync(0xffffffffu, threadIdx.x / 32, 0);
    const int lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
    const int KW = WARPS / RW, rows_cta = ROWS * RW, stride_m = rows_cta + 4;
    const int rg = warp % RW, ks = warp / RW;  // this warp's row group in the CTA and its k piece
    const int row0 = (blockIdx.x * RW + rg) * ROWS;
    const int piece = blockIdx.y * KW + ks;
    const int k_begin = min(K, piece * PIECE), k_end = min(K, k_begin + PIECE);

    pdl_wait();  // programmatic dependent launch: the previous kernel has completed (ptx.cuh)
    pdl_trigger_early();

    float acc[RPW][NT][4];
#pragma unroll
    for (int r = 0; r < RPW; ++r)
#pragma unroll
        for (int j = 0; j < NT; ++j) acc[r][j][0] = acc[r][j][1] = acc[r][j][2] = acc[r][j][3] = 0.0f;

    // STRIDED: the warp's virtual rows row0 .. row0 + 15 are the physical rows strided_row(row0 + i) =
    // 8 i + c of a 128-row block (one residue class c mod 8), which all start the same number of bytes past a
    // 16-byte boundary; the warp works if the class's first row is inside N.
    if ((STRIDED ? strided_row(row0) : row0) < N) {  // warp-uniform: a row group past N only contributes zeros
        // Rows past N (the last group of a ragged N) and tokens past M re-read the last valid row: the
        // loads stay in bounds and the results are never stored. w_lane[r][h]: rows row0 + 16 r + 8 h + g
        // (STRIDED: the physical rows strided_row of those).
        // Unaligned: the lane's rows are 8 ldw elements apart, so they all sit as far past a 16-byte boundary
        // as row row0 + g (at every k: k moves in 64-byte steps); a row past N re-reads row N - 1, cut at
        // this shift: garbage in a result row that is never stored. STRIDED: every row of the warp sits
        // ``w_shift`` past a boundary, so the warp reads each row from half_s elements before k (its windows,
        // as loaded, are the MMA's fragments) and X from the same k, cut at the difference.
        const T* w_lane[RPW][2];
        u32 w_shift = 0;
        int half_s = 0;  // STRIDED: elements the weight's windows start before k
        if constexpr (STRIDED) {
            w_shift = static_cast<u32>(reinterpret_cast<unsigned long long>(W + (long long)strided_row(row0) * ldw) & 15);
            half_s = static_cast<int>(w_shift / 2);
        }
#pragma unroll
        for (int r = 0; r < RPW; ++r)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int v = row0 + 16 * r + 8 * h + g;
                w_lane[r][h] = W + (long long)min(STRIDED ? strided_row(v) : v, N - 1) * ldw + 8 * q - half_s;
            }
        if constexpr (!ALIGNED && !STRIDED)
            w_shift = static_cast<u32>(reinterpret_cast<unsigned long long>(w_lane[0][0]) & 15);
        // Token rows as 32-bit offsets from one pointer (the host keeps M * ldx below 2^31): NT registers
        // instead of 2 NT for pointers.
        const T* x_lane = X + 8 * q;
        int x_row[NT];
#pragma unroll
        for (int j = 0; j < NT; ++j) x_row[j] = min(8 * j + g, M - 1) * (int)ldx;
        // (Unaligned: token rows 8 j + g are 8 ldx elements apart, so one shift serves them as w_shift does;
        // STRIDED: X is read from half_s elements before k, so its windows sit w_shift bytes earlier.)
        const u32 x_shift =
            static_cast<u32>(reinterpret_cast<unsigned long long>(x_lane + x_row[0]) - (STRIDED ? w_shift : 0)) & 15;

        using WRegs = WRow<ALIGNED || STRIDED, U>[RPW][2];
        auto load_w = [&](WRegs& w, int k) {
            if constexpr (ALIGNED) {
#pragma unroll
                for (int u = 0; u < U; ++u)
#pragma unroll
                    for (int r = 0; r < RPW; ++r)
#pragma unroll
                        for (int h = 0; h < 2; ++h) w[r][h].v[u] = ld_stream(w_lane[r][h] + k + 32 * u);
            } else if constexpr (STRIDED) {  // (a row past N is not on the class's boundary: align it down)
#pragma unroll
                for (int r = 0; r < RPW; ++r)
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const unsigned long long a = reinterpret_cast<unsigned long long>(w_lane[r][h] + k);
                        const uint4* base = reinterpret_cast<const uint4*>(a & ~15ull);
#pragma unroll
                        for (int u = 0; u < U; ++u) w[r][h].v[u] = ld_stream(base + 4 * u);
                    }
            } else {
#pragma unroll
                for (int r = 0; r < RPW; ++r)
#pragma unroll
                    for (int h = 0; h < 2; ++h) ld_windows<true>(w[r][h], w_lane[r][h] + k, q);
            }
        };
        // The 4 lanes of a row split its CHUNK k (2 CHUNK bytes): lane q asks for the 64-byte pieces
        // q, q + 4, ... (fewer than 4 pieces at U < 4: those lanes ask nothing).
        // With DECODE_PREFETCH_TAIL (1 in the library; 0 is the kernel before session 48) the K tail's chunk
        // too: a lane's piece if it starts before k_end (U <= 4: one piece a lane at most), so that the tail's
        // loads find the L2 warm as the main loop's do.
        auto prefetch_chunk = [&](int kp) {
            if (PF > 0 && (DECODE_PREFETCH_TAIL ? kp + 32 * q < k_end : kp + CHUNK <= k_end)) {
#pragma unroll
                for (int p = q; p < U; p += 4)
#pragma unroll
                    for (int r = 0; r < RPW; ++r)
#pragma unroll
                        for (int h = 0; h < 2; ++h) prefetch_l2(w_lane[r][h] - 8 * q + kp + 32 * p);
            }
        };
        auto compute = [&](const WRegs& w, int k) {
            // Unaligned, the activations' U chunks are loaded (from L1) as the weight's are, U + 1 windows.
            WRow<false, U> xw[ALIGNED ? 1 : NT];
            if constexpr (!ALIGNED) {
#pragma unroll
                for (int j = 0; j < NT; ++j) ld_windows<false>(xw[j], x_lane + x_row[j] + k - half_s, q);
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
                uint4 x[NT];
#pragma unroll
                for (int j = 0; j < NT; ++j) {
                    if constexpr (ALIGNED) x[j] = ld_shared_by_warps(x_lane + x_row[j] + k + 32 * u);
                    else x[j] = cut_row(xw[j], u, x_shift, q);
                }
#pragma unroll
                for (int r = 0; r < RPW; ++r) {
                    if constexpr (STRIDED) mma_chunk<T, NT>(acc[r], w[r][0].v[u], w[r][1].v[u], x);
                    else mma_chunk<T, NT>(acc[r], cut_row(w[r][0], u, w_shift, q), cut_row(w[r][1], u, w_shift, q), x);
                }
            }
        };
        // One 32-k chunk whose lane elements outside [lo, n) are zeroed in W and X (the K tail; STRIDED, also
        // the piece's first chunk, whose windows start half_s elements before k_begin): its loads
        // (``load_masked``), then its mmas (``mma_masked``), so that several chunks' loads can be in flight
        // at once. n <= lo loads nothing and leaves zeros.
        struct Masked {
            uint4 x[NT], wt[RPW], wb[RPW];
        };
        auto load_masked = [&](Masked& c, int k, int lo, int n) {
            const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                if constexpr (ALIGNED) c.x[j] = n > 0 ? ld_shared_by_warps(x_lane + x_row[j] + k) : zero;
                else c.x[j] = ld_range<false>(x_lane + x_row[j] + k - half_s, lo, n);
            }
#pragma unroll
            for (int r = 0; r < RPW; ++r) {
                if constexpr (ALIGNED) {
                    c.wt[r] = n > 0 ? ld_stream(w_lane[r][0] + k) : zero;
                    c.wb[r] = n > 0 ? ld_stream(w_lane[r][1] + k) : zero;
                } else {
                    c.wt[r] = ld_range<true>(w_lane[r][0] + k, lo, n);
                    c.wb[r] = ld_range<true>(w_lane[r][1] + k, lo, n);
                }
            }
        };
        auto mma_masked = [&](const Masked& c) {
#pragma unroll
            for (int r = 0; r < RPW; ++r) mma_chunk<T, NT>(acc[r], c.wt[r], c.wb[r], c.x);
        };

        int k = k_begin;
        // STRIDED: the lane's elements of the chunk at k are k - half_s + 8 q .. + 7. The first chunk holds
        // half_s elements before k_begin (another row's, or bytes before the tensor): masked.
        if (STRIDED && half_s > 0) {
            Masked c;
            load_masked(c, k, max(0, half_s - 8 * q), min(8, k_end - (k - half_s + 8 * q)));
            mma_masked(c);
            k += 32;
        }
        const int k_stop = k_end + half_s;  // a chunk at k ends at k - half_s + CHUNK
        if constexpr (DEPTH == 1) {
            for (; k + CHUNK <= k_stop; k += CHUNK) {
                WRegs w;
                load_w(w, k);  // all weight loads of the iteration before its first mma
                prefetch_chunk(k + PF * CHUNK);
                compute(w, k);
            }
        } else if (k + CHUNK <= k_stop) {
            // Two buffers, alternating; the loop body is unrolled by two so neither is ever copied.
            WRegs wa, wb;
            load_w(wa, k);
            while (true) {
                const bool more = k + 2 * CHUNK <= k_stop;  // warp-uniform
                if (more) load_w(wb, k + CHUNK);
                prefetch_chunk(k + (1 + PF) * CHUNK);
                compute(wa, k);
                k += CHUNK;
                if (!more) break;
                const bool more2 = k + 2 * CHUNK <= k_stop;
                if (more2) load_w(wa, k + CHUNK);
                prefetch_chunk(k + (1 + PF) * CHUNK);
                compute(wb, k);
                k += CHUNK;
                if (!more2) break;
            }
        }
        // Tail (K of the last piece not a multiple of CHUNK): up to CHUNK / 32 chunks of 32 k with the lane's
        // 8 k zeroed past k_end (ALIGNED: K % 8 == 0, so a lane's 8 k are all in or all out; else its first
        // n, ``ld_range``, in W and X both: past them a window holds the next row's bytes, any value). The
        // chunks go in groups of TAIL_AHEAD, each group's loads issued before the first of its mmas (a chunk
        // past k_stop loads nothing): one or two memory round trips for the tail, not one a chunk (a loop of
        // load-then-mma chunks took up to four, the floor of a short ragged K: docs/worklog.md, session 48).
        // Unrolled straight-line code, not a loop: the main loop stays the only one with HMMAs.
        constexpr int TAIL = CHUNK / 32;
#pragma unroll
        for (int t0 = 0; t0 < TAIL; t0 += TAIL_AHEAD) {
            if (k + 32 * t0 >= k_stop) break;  // warp-uniform
            Masked tail[TAIL_AHEAD];
#pragma unroll
            for (int t = 0; t < TAIL_AHEAD; ++t) {
                const int kt = k + 32 * (t0 + t);
                load_masked(tail[t], kt, 0, kt < k_stop ? min(8, k_end - (kt - half_s + 8 * q)) : 0);
            }
#pragma unroll
            for (int t = 0; t < TAIL_AHEAD; ++t)
                if (k + 32 * (t0 + t) < k_stop) mma_masked(tail[t]);
        }
    }

    // Fragments -> red[ks][token][row]. Lane (g, q) holds rows 16 r + g, 16 r + g + 8 and tokens 8j + 2q,
    // 8j + 2q + 1; stride_m = ROWS RW + 4 is 4 or 20 mod 32, so the 32 lanes' addresses differ by 8q + g
    // (mod 32 banks): no conflicts.
    float* mine = red + ks * MP * stride_m + ROWS * rg;
#pragma unroll
    for (int r = 0; r < RPW; ++r)
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            const int m = 8 * j + 2 * q, row = 16 * r + g;
            mine[m * stride_m + row] = acc[r][j][0];
            mine[(m + 1) * stride_m + row] = acc[r][j][1];
            mine[m * stride_m + row + 8] = acc[r][j][2];
            mine[(m + 1) * stride_m + row + 8] = acc[r][j][3];
        }
    __syncthreads();

    // Element i of the CTA's tile is token i / rows_cta, row i % rows_cta: consecutive threads walk N,
    // so the reads here, the workspace traffic and the output stores are all contiguous (STRIDED: the
    // stores, M x rows_cta elements a CTA, run 8 rows apart).
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
        const int m = i / rows_cta, n = STRIDED ? strided_row(n0 + i % rows_cta) : n0 + i % rows_cta;
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
    // Programmatic dependent launch: the next kernel may be scheduled once every CTA is here or gone. Not
    // earlier: several of these CTAs fit on an SM, so the next grid's CTAs, dispatched while CTAs of this
    // one still run, would pile onto the SMs already free instead of spreading over the GPU.
    pdl_trigger_late();
}
