// Everything fixed when the FP8 engine kernel (engine/gemm_fp8.cu) is instantiated, by name: the FP8
// sibling of GemmTraits. gemmlab.planner.Fp8Plan writes the template arguments. The names the shared
// parts read (T, BM, BN, BK, STAGES, A_MN, B_MN, B_STAGE, MCAST, PREFETCH for mainloop.cuh's producer; TO, TBIAS,
// HAS_BIAS, HAS_C, ACT, DIRECT, PIECE, FULL_PIECES, TAIL, SLAB_BYTES for epilogue_store.cuh) mean what
// they mean in GemmTraits.
#pragma once
#include "ptx.cuh"
#include "tile_scheduler.cuh"

// How the fp8 operands are scaled back: one fp32 scalar each (applied once, in the epilogue), or
// DeepSeek-style blocks (A: one scale per row and 128 of K; B: one per 128 x 128 block), applied to each
// 128-deep partial sum when it is promoted into the fp32 accumulators.
enum Fp8ScaleMode { SCALE_TENSOR = 0, SCALE_BLOCK = 1 };

__host__ __device__ constexpr int gcd_int(int a, int b) { return b == 0 ? a : gcd_int(b, a % b); }

template <typename TOut, typename TBias,  // output and bias element types
          int kBM, int kBN, int kStages,  // tile (rows x columns) and ring depth
          int kScale,                     // Fp8ScaleMode
          int kPromote,                   // k-steps (of 128) per promotion; 0: once, at the end of the tile
          bool kBias, int kAct,           // epilogue: + bias[n], activation
          bool kDirect,                   // output rows not 16-byte aligned: threads store
          int kPartSplit = 1>             // wgmma partial sums over BN / kPartSplit columns at a time
struct Fp8GemmTraits {
    using T = unsigned char;  // e4m3 bytes: only the wgmma reads them as numbers
    using TO = TOut;
    using TBIAS = TBias;
    // One k-step is one 128-byte swizzle row: 128 e4m3 values, four k32 wgmmas, one scale block.
    static constexpr int BM = kBM, BN = kBN, BK = 128, STAGES = kStages;
    static constexpr bool A_MN = false, B_MN = false;  // fp8 wgmma: both operands K-major
    static constexpr bool HAS_BIAS = kBias, HAS_C = false, DIRECT = kDirect;
    static constexpr int ACT = kAct, SCHEDULE = DATA_PARALLEL, SCALE = kScale, PROMOTE = kPromote;
    static constexpr int MCAST = 1;  // no B multicast (GemmTraits::MCAST)
    static constexpr int PREFETCH = 0;  // no L2 prefetch (GemmTraits::PREFETCH)
    // The warpgroup index read warp-uniformly with a plain 16-bit epilogue, as GemmTraits::UNIFORM_WG.
    static constexpr bool UNIFORM_WG = !kBias && kAct == 0 && !kDirect && sizeof(TOut) == 2;

    static constexpr int CONSUMERS = BM == 64 ? 1 : 2;
    static constexpr int MI = BM / (64 * CONSUMERS);  // m64 blocks per consumer
    static constexpr int THREADS = 128 * (CONSUMERS + 1);
    // GemmTraits' names for the cooperative consumers (no ping-pong, no column split): each consumer reads
    // every slot and holds MI blocks of 64 rows x all BN columns, from block consumer x MI.
    static constexpr bool PING_PONG = false;
    static constexpr int SLOT_READERS = CONSUMERS, CN = BN;
    __device__ static constexpr int first_block(int consumer) { return consumer * MI; }
    // Split promotion (mainloop_fp8.cuh): `acc` covers the tile's BN columns, `part` (the wgmmas' partial
    // sums) only PART_N = BN / PART_SPLIT of them; per k-step the consumer runs the wgmmas of each column
    // part in turn, waits, and promotes that part. Two parts keep a 64 x 256 consumer tile in 128 + 64
    // registers (two full sets would be 256: no room for anything else); the price is one more wgmma drain
    // per k-step, which the other consumer's wgmmas cover.
    static constexpr int PART_SPLIT = kPartSplit, PART_N = BN / kPartSplit;
    // Two consumers: setmaxnreg moves the producer's registers to them. The registers come from the CTA's
    // own pool (PTX ISA "setmaxnreg": setmaxnreg.inc blocks until the pool has them), i.e. the launch's
    // LAUNCH_REGS (168 a thread at 384 threads): PRODUCER + 2 x CONSUMER <= 3 x 168 = 504, else the
    // consumers wait forever. 40 / 232 as the bf16 kernel, unless a consumer's register sets (BN / 2 +
    // PART_N / 2 per m64 block) and what it holds besides (block scales: ~16 registers, the next k-step's
    // scales among them; per-tensor ~8) pass 232: then 24 / 240 (the producer thread's loop uses R0-R4 and
    // uniform registers; 128 x 224 block: 236).
    static constexpr int LAUNCH_REGS = 65536 / THREADS / 8 * 8;
    static constexpr int PRODUCER_REGS = MI * (BN + PART_N) / 2 + (kScale == SCALE_BLOCK ? 16 : 8) > 232 ? 24 : 40;
    static constexpr int CONSUMER_REGS = PRODUCER_REGS == 24 ? 240 : 232;

    static constexpr u32 A_STAGE = BM * BK, B_STAGE = BN * BK;
    static constexpr u32 STAGE_BYTES = A_STAGE + B_STAGE;

    static constexpr int PIECE = sizeof(TO) == 4 ? 32 : 64;
    static constexpr int FULL_PIECES = BN / PIECE, TAIL = BN % PIECE;
    static constexpr u32 SLAB_BYTES = 64 * 128;
    static constexpr u32 SLABS_BYTES = CONSUMERS * 2 * SLAB_BYTES;

    // Block scales: how many B scale blocks (128 columns each) a tile's columns can touch. A tile starts
    // at a multiple of gcd(BN, 128) inside its first block (SB_PHASES such offsets): tiles of a width
    // that divides 128, or of a multiple of it, never straddle a block boundary at a varying column;
    // 192-wide ones start at 0 or 64 (two phases), 224-wide at 0, 96, 64 or 32 (four), others at any
    // multiple of 16 or 32. The consumers keep one copy of their k-loop per phase (fp8_promote.cuh).
    static constexpr int SB_STEP = gcd_int(BN, 128), SB_PHASES = 128 / SB_STEP;
    static constexpr bool SB_ALIGNED = 128 % BN == 0 || BN % 128 == 0;
    static constexpr int SB_BLOCKS = (128 - SB_STEP + BN + 127) / 128;
    // Block scales travel with the ring (fp8_promote.cuh): per stage a slot of the tile's BM row scales
    // and (from float BM on) a box of 8 column-block scales of that k-step, loaded by TMA, whose
    // shared-memory destination must be 128-byte aligned: slots of whole 32 floats.
    static constexpr int SCALE_SLOT = BM + 32;  // floats
    static constexpr int SB_AT = BM;            // B's box: floats from the slot's start (128-byte aligned)
    static constexpr u32 SCALE_BYTES = kScale == SCALE_BLOCK ? STAGES * SCALE_SLOT * 4 : 0;

    static_assert(BM == 64 || BM == 128 || BM == 256, "tile heights 64, 128, 256");
    static_assert(BN % 16 == 0 && BN >= 16 && BN <= 256, "tile widths: wgmma n in steps of 16 up to 256");
    static_assert(TAIL % 16 == 0, "tail pieces are whole 16-column stmatrix blocks");
    static_assert(kScale != SCALE_BLOCK || kPromote == 1, "block scales change every 128 of K: promote every k-step");
    static_assert(kPromote >= 0, "promotion interval");
    static_assert((kPartSplit == 1 || kPartSplit == 2) && PART_N % 16 == 0, "column parts: wgmma n in steps of 16");
    static_assert(kPartSplit == 1 || kPromote == 1, "split promotion: each part is promoted every k-step");
    static_assert(CONSUMERS == 1 || PRODUCER_REGS + CONSUMERS * CONSUMER_REGS <= (CONSUMERS + 1) * LAUNCH_REGS,
                  "setmaxnreg: the consumers take no more registers than the CTA was launched with");
    static_assert(SB_BLOCKS <= 4, "a tile's column-block scales fit the slot's box of 8 (from a multiple of 4)");
    static_assert(1024 + STAGES * STAGE_BYTES + SLABS_BYTES + SCALE_BYTES <= 227 * 1024 - 256, "shared memory");
};
