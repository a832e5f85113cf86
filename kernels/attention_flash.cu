// Fused attention on tensor cores (FlashAttention-2's schedule) with head_dim 16, 32,
// 48 or 64 and no dropout: the same computation, arguments and outputs as
// attention_forward/_backward_dq/_backward_dkdv in kernels/attention.cu, which serve
// every other call (dropout, larger heads) and are these kernels' reference in the
// tests. Not compiled as it is: source.rs builds one module per dtype from sections:
// `common`, then `half` (float16, bfloat16: source.rs defines FL_TYPE as f16 or bf16)
// or `tf32` (float32), then `kernels`, with every `_DT(` renamed `_<dtype>(`. A section
// defines the element type FL_ELEM, the shared-row padding FL_PAD, a warp's A operand
// FL_A, and the operations the kernels use: fl_load_a, fl_store, fl_scores and
// fl_accumulate. Needs sm_80 (mma.sync, ldmatrix).
//
// The products run as warp-wide mma.sync instructions (float accumulators). A block of
// 8 warps owns 128 rows of one batch-head (16 rows a warp, held in registers as the
// instruction's A operand) and streams the other operand through shared memory
// FL_TILE rows at a time (64 for half types, 32 for float32), the next tile loading (cp.async) while this one computes:
//
// - forward: 128 query rows; key and value tiles stream; per tile S = Q Kᵀ, the online
//   softmax of FlashAttention (running max and sum, the accumulator rescaled when the
//   max grows), then O += P V with P rounded to the 16-bit type. Writes O and the row's
//   log-sum-exp, never the scores.
// - dq: 128 query rows; key and value tiles stream; P = exp(S - lse) recomputed,
//   dP = dO Vᵀ, dS = P (dP - delta), dQ += dS K.
// - dkdv: 128 key rows; query, output-gradient, lse and delta tiles stream; Pᵀ and dPᵀ
//   recomputed as K Qᵀ and V dOᵀ, dV += Pᵀ dO, dK += dSᵀ Q.
// Splitting dq from dk/dv recomputes S once more than FlashAttention-2's single pass but
// needs no atomics: each gradient row is written by one warp, deterministically.
//
// Half fragments (PTX ISA, "Matrix fragments for mma.m16n8k16"): lane = 4 g + t. A 16x16 A
// operand gives a lane rows g and g + 8, columns 2t, 2t + 1, 2t + 8, 2t + 9; an 8-column
// accumulator tile gives it the same rows, columns 2t and 2t + 1. So the accumulators of
// two adjacent 8-column tiles, rounded and packed in pairs, are the A operand of the next
// product (FlashAttention-2's register reuse). B operands come from shared memory by
// ldmatrix: `fl_ld_b_rows` when B[k][n] is tile[n][k] (keys as columns of Qᵀ-like
// products), `fl_ld_b_trans` when B[k][n] is tile[k][n]. Shared rows are padded by 8
// elements so that the 8 rows one ldmatrix reads fall in different banks.
//
// Scores are kept in base 2: s · scale · log2(e), so exp is one ex2 instruction; the
// log-sum-exp is stored in base e, as the other kernels store it.

// BEGIN common
#define FL_ROWS 128   // rows a block owns: 16 per warp, 8 warps (the launcher's 256 threads)

#define FL_STR2(x) #x
#define FL_STR(x) FL_STR2(x)

__device__ __forceinline__ float fl_neg_inf() { return __uint_as_float(0xff800000u); }

// this = sum over the four lanes of a fragment row (lanes 4g .. 4g + 3).
__device__ __forceinline__ float fl_quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    v += __shfl_xor_sync(0xffffffffu, v, 2);
    return v;
}

__device__ __forceinline__ float fl_quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
    return v;
}

__device__ __forceinline__ unsigned long long fl_min(unsigned long long a, unsigned long long b) {
    return a < b ? a : b;
}

__device__ __forceinline__ unsigned long long fl_base(unsigned long long bh,
                                                      unsigned long long heads,
                                                      unsigned long long sb,
                                                      unsigned long long sh) {
    return (bh / heads) * sb + (bh % heads) * sh;
}

__device__ __forceinline__ unsigned fl_shared_address(const void* p) {
    unsigned long long a;
    asm("cvta.to.shared.u64 %0, %1;" : "=l"(a) : "l"(p));
    return (unsigned)a;
}

// END common

// BEGIN half
// Operands of 16-bit elements (FL_TYPE: bf16 or f16), products of 16 along the
// contracted dimension.
#define FL_ELEM unsigned short
#define FL_PAD 8  // elements of padding per shared row: 16 bytes
#define FL_TILE 64    // rows of each streamed tile
#define FL_STAGES 2  // streamed tiles in flight: the next loads while this one computes
#define FL_A(name) unsigned name[D / 16][4]  // a warp's A operand, packed pairs

// Two floats rounded to the 16-bit type and packed, `lo` in the low half (the lower
// column of a fragment pair).
__device__ __forceinline__ unsigned fl_pack(float lo, float hi) {
    unsigned r;
    asm("cvt.rn." FL_STR(FL_TYPE) "x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// c += a · b for one 16x8 tile (a: 16x16, b: 16x8).
__device__ __forceinline__ void fl_mma(float* c, const unsigned* a, unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32." FL_STR(FL_TYPE) "." FL_STR(FL_TYPE)
        ".f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four 8x8 matrices from shared memory; lane L gives the address of row L % 8 of
// matrix L / 8.
__device__ __forceinline__ void fl_ldsm4(unsigned* r, const unsigned short* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(fl_shared_address(p)));
}

__device__ __forceinline__ void fl_ldsm4_trans(unsigned* r, const unsigned short* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(fl_shared_address(p)));
}

// B operands of two adjacent 8-column tiles (columns n0.., n0 + 8..) at rows k0..k0 + 15
// where B[k][n] = tile[n][k]: r[0], r[1] for the first tile, r[2], r[3] for the second.
template <int S>
__device__ __forceinline__ void fl_ld_b_rows(unsigned* r, unsigned short (*tile)[S],
                                             int n0, int k0) {
    int lane = threadIdx.x % 32;
    fl_ldsm4(r, &tile[n0 + (lane & 7) + (lane >> 4) * 8][k0 + ((lane >> 3) & 1) * 8]);
}

// The same where B[k][n] = tile[k][n].
template <int S>
__device__ __forceinline__ void fl_ld_b_trans(unsigned* r, unsigned short (*tile)[S],
                                              int k0, int n0) {
    int lane = threadIdx.x % 32;
    fl_ldsm4_trans(r, &tile[k0 + (lane & 7) + ((lane >> 3) & 1) * 8][n0 + (lane >> 4) * 8]);
}

// The A operands of a warp's 16 rows [r0, r0 + 16) of a [T, D] operand (row stride st),
// read straight from global memory (once per block); rows past t are zero.
template <int D>
__device__ __forceinline__ void fl_load_a(unsigned (*a)[4], const unsigned short* base,
                                          unsigned long long st, unsigned long long r0,
                                          unsigned long long t) {
    int lane = threadIdx.x % 32, g = lane / 4, c = 2 * (lane % 4);
    unsigned long long ra = r0 + g, rb = r0 + g + 8;
#pragma unroll
    for (int ks = 0; ks < D / 16; ks++) {
        int k0 = ks * 16 + c;
        a[ks][0] = ra < t ? *(const unsigned*)(base + ra * st + k0) : 0u;
        a[ks][1] = rb < t ? *(const unsigned*)(base + rb * st + k0) : 0u;
        a[ks][2] = ra < t ? *(const unsigned*)(base + ra * st + k0 + 8) : 0u;
        a[ks][3] = rb < t ? *(const unsigned*)(base + rb * st + k0 + 8) : 0u;
    }
}

// The accumulators of a warp's 16 rows [r0, r0 + 16), times `scale`, stored as the
// 16-bit type in rows below t of a [T, D] operand.
template <int D>
__device__ __forceinline__ void fl_store(float (*acc)[4], unsigned short* base,
                                         unsigned long long st, unsigned long long r0,
                                         unsigned long long t, float scale_a, float scale_b) {
    int lane = threadIdx.x % 32, g = lane / 4, c = 2 * (lane % 4);
    unsigned long long ra = r0 + g, rb = r0 + g + 8;
#pragma unroll
    for (int nt = 0; nt < D / 8; nt++) {
        if (ra < t)
            *(unsigned*)(base + ra * st + nt * 8 + c) =
                fl_pack(acc[nt][0] * scale_a, acc[nt][1] * scale_a);
        if (rb < t)
            *(unsigned*)(base + rb * st + nt * 8 + c) =
                fl_pack(acc[nt][2] * scale_b, acc[nt][3] * scale_b);
    }
}

// S (16 rows x FL_TILE columns, 8-column tiles) = A Bᵀ-like product of a warp's A
// operand (D / 16 steps) with a shared tile whose rows are the columns of S.
template <int D>
__device__ __forceinline__ void fl_scores(float (*s)[4], unsigned (*a)[4],
                                          unsigned short (*tile)[D + FL_PAD]) {
#pragma unroll
    for (int nt = 0; nt < FL_TILE / 8; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < D / 16; ks++) {
#pragma unroll
        for (int np = 0; np < FL_TILE / 16; np++) {
            unsigned b[4];
            fl_ld_b_rows<D + FL_PAD>(b, tile, np * 16, ks * 16);
            fl_mma(s[2 * np], a[ks], b[0], b[1]);
            fl_mma(s[2 * np + 1], a[ks], b[2], b[3]);
        }
    }
}

// acc (16 rows x D) += P (16 rows x FL_TILE, the accumulators of fl_scores, rounded)
// times a shared tile of FL_TILE rows x D.
template <int D>
__device__ __forceinline__ void fl_accumulate(float (*acc)[4], float (*p)[4],
                                              unsigned short (*tile)[D + FL_PAD]) {
#pragma unroll
    for (int kk = 0; kk < FL_TILE / 16; kk++) {
        unsigned a[4] = {fl_pack(p[2 * kk][0], p[2 * kk][1]), fl_pack(p[2 * kk][2], p[2 * kk][3]),
                         fl_pack(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                         fl_pack(p[2 * kk + 1][2], p[2 * kk + 1][3])};
#pragma unroll
        for (int dp = 0; dp < D / 16; dp++) {
            unsigned b[4];
            fl_ld_b_trans<D + FL_PAD>(b, tile, kk * 16, dp * 16);
            fl_mma(acc[2 * dp], a, b[0], b[1]);
            fl_mma(acc[2 * dp + 1], a, b[2], b[3]);
        }
    }
}

// END half

// BEGIN tf32
// Float32 operands on tensor cores by 3xTF32 (as PyTorch's memory-efficient kernel on
// sm_80 and later, CUTLASS's OpMultiplyAddFastF32): each operand x splits into big =
// x rounded to TF32 (10-bit mantissa) and small = the rest rounded again, and a b is
// summed as a_small b_big + a_big b_small + a_big b_big; the dropped a_small b_small is
// below float32's rounding. Products of 8 along the contracted dimension
// (mma.sync m16n8k8): lane 4 g + t holds A at rows g, g + 8, columns t, t + 4, and B at
// rows t, t + 4, column g. The accumulators give a lane columns 2t, 2t + 1 instead, so
// the product with P takes the keys of each 8-key step in the order 0, 2, 4, 6, 1, 3,
// 5, 7 (a sum does not care), and reads the value rows in that order. Padding of 4
// floats per shared row keeps both access patterns free of bank conflicts.
#define FL_ELEM float
#define FL_PAD 4
// Tiles of 32 rows, so that two stages of float rows fit the 48 KiB of static shared
// memory (two of 64 would not).
#define FL_TILE 32
#define FL_STAGES 2
#define FL_A(name) float name[D / 8][4]  // a warp's A operand, as floats

__device__ __forceinline__ void fl_split(float x, unsigned& big, unsigned& small) {
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(big) : "f"(x));
    float rest = x - __uint_as_float(big);
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(small) : "f"(rest));
}

__device__ __forceinline__ void fl_split4(const float* a, unsigned* big, unsigned* small) {
#pragma unroll
    for (int i = 0; i < 4; i++) fl_split(a[i], big[i], small[i]);
}

__device__ __forceinline__ void fl_mma_tf32(float* c, const unsigned* a, unsigned b0,
                                            unsigned b1) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// c += a b for one 16x8 tile (a split already, b = (b0, b1) as floats), the small
// terms first.
__device__ __forceinline__ void fl_mma3(float* c, const unsigned* a_big, const unsigned* a_small,
                                        float b0, float b1) {
    unsigned b0_big, b0_small, b1_big, b1_small;
    fl_split(b0, b0_big, b0_small);
    fl_split(b1, b1_big, b1_small);
    fl_mma_tf32(c, a_small, b0_big, b1_big);
    fl_mma_tf32(c, a_big, b0_small, b1_small);
    fl_mma_tf32(c, a_big, b0_big, b1_big);
}

// The A operands of a warp's 16 rows [r0, r0 + 16) of a [T, D] operand, from global
// memory; rows past t are zero.
template <int D>
__device__ __forceinline__ void fl_load_a(float (*a)[4], const float* base,
                                          unsigned long long st, unsigned long long r0,
                                          unsigned long long t) {
    int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
    unsigned long long ra = r0 + g, rb = r0 + g + 8;
#pragma unroll
    for (int ks = 0; ks < D / 8; ks++) {
        int k0 = ks * 8 + c;
        a[ks][0] = ra < t ? base[ra * st + k0] : 0.0f;
        a[ks][1] = rb < t ? base[rb * st + k0] : 0.0f;
        a[ks][2] = ra < t ? base[ra * st + k0 + 4] : 0.0f;
        a[ks][3] = rb < t ? base[rb * st + k0 + 4] : 0.0f;
    }
}

// The accumulators of a warp's 16 rows, times the row's scale, stored in rows below t.
template <int D>
__device__ __forceinline__ void fl_store(float (*acc)[4], float* base, unsigned long long st,
                                         unsigned long long r0, unsigned long long t,
                                         float scale_a, float scale_b) {
    int lane = threadIdx.x % 32, g = lane / 4, c = 2 * (lane % 4);
    unsigned long long ra = r0 + g, rb = r0 + g + 8;
#pragma unroll
    for (int nt = 0; nt < D / 8; nt++) {
        if (ra < t)
            *(float2*)(base + ra * st + nt * 8 + c) =
                make_float2(acc[nt][0] * scale_a, acc[nt][1] * scale_a);
        if (rb < t)
            *(float2*)(base + rb * st + nt * 8 + c) =
                make_float2(acc[nt][2] * scale_b, acc[nt][3] * scale_b);
    }
}

// S (16 rows x FL_TILE columns) = a warp's A operand times the transpose of a shared tile
// whose rows are the columns of S.
template <int D>
__device__ __forceinline__ void fl_scores(float (*s)[4], float (*a)[4],
                                          float (*tile)[D + FL_PAD]) {
    int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
#pragma unroll
    for (int nt = 0; nt < FL_TILE / 8; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < D / 8; ks++) {
        unsigned big[4], small[4];
        fl_split4(a[ks], big, small);
#pragma unroll
        for (int nt = 0; nt < FL_TILE / 8; nt++)
            fl_mma3(s[nt], big, small, tile[nt * 8 + g][ks * 8 + c],
                    tile[nt * 8 + g][ks * 8 + c + 4]);
    }
}

// acc (16 rows x D) += P (16 rows x FL_TILE, fl_scores' accumulators) times a shared
// tile of FL_TILE rows x D, each 8-key step in the order of the accumulators' columns.
template <int D>
__device__ __forceinline__ void fl_accumulate(float (*acc)[4], float (*p)[4],
                                              float (*tile)[D + FL_PAD]) {
    int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
#pragma unroll
    for (int kk = 0; kk < FL_TILE / 8; kk++) {
        float a[4] = {p[kk][0], p[kk][2], p[kk][1], p[kk][3]};
        unsigned big[4], small[4];
        fl_split4(a, big, small);
#pragma unroll
        for (int nt = 0; nt < D / 8; nt++)
            fl_mma3(acc[nt], big, small, tile[kk * 8 + 2 * c][nt * 8 + g],
                    tile[kk * 8 + 2 * c + 1][nt * 8 + g]);
    }
}
// END tf32

// BEGIN kernels
// Rows [t0, t0 + FL_TILE) of a [T, D] operand into a shared tile, 16 bytes a thread at a
// time; rows past t are zero (so that masked products read no garbage). With two
// stages the copy is asynchronous (cp.async, zero-filled past t), so that it overlaps
// the products on the tile before; `fl_tile_ready` waits for it.
template <int D>
__device__ __forceinline__ void fl_fetch_tile(FL_ELEM (*tile)[D + FL_PAD], const FL_ELEM* base,
                                              unsigned long long st, unsigned long long t0,
                                              unsigned long long t) {
    const int per = 16 / (int)sizeof(FL_ELEM), vecs = D / per;
    for (int e = threadIdx.x; e < FL_TILE * vecs; e += blockDim.x) {
        int r = e / vecs, c = (e % vecs) * per;
        bool live = t0 + r < t;
        const FL_ELEM* src = live ? base + (t0 + r) * st + c : base;
#if FL_STAGES > 1
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
                     :
                     : "r"(fl_shared_address(&tile[r][c])), "l"(src), "r"(live ? 16 : 0));
#else
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        if (live) v = *(const uint4*)src;
        *(uint4*)&tile[r][c] = v;
#endif
    }
}

// Makes streamed tile `it` of `count` ready in stage it % FL_STAGES for the whole
// block, `fetch(i)` starting the copy of tile i into its stage: with two stages tile
// it + 1 is started first, so that it loads while tile it computes. Every iteration
// ends with __syncthreads (no warp still reads the stage the next fetch overwrites).
template <typename Fetch>
__device__ __forceinline__ void fl_tile_ready(Fetch fetch, unsigned long long it,
                                              unsigned long long count) {
#if FL_STAGES > 1
    if (it == 0) {
        fetch(0);
        asm volatile("cp.async.commit_group;");
    }
    if (it + 1 < count) {
        fetch(it + 1);
        asm volatile("cp.async.commit_group;");
        asm volatile("cp.async.wait_group 1;");
    } else {
        asm volatile("cp.async.wait_group 0;");
    }
#else
    fetch(it);
#endif
    __syncthreads();
}

template <int D>
__device__ __forceinline__ void fl_forward(
    const FL_ELEM* q, unsigned long long q_sb, unsigned long long q_sh,
    unsigned long long q_st, const FL_ELEM* k, unsigned long long k_sb,
    unsigned long long k_sh, unsigned long long k_st, const FL_ELEM* v,
    unsigned long long v_sb, unsigned long long v_sh, unsigned long long v_st,
    FL_ELEM* out, unsigned long long o_sb, unsigned long long o_sh,
    unsigned long long o_st, float* lse, unsigned long long bh, unsigned long long heads,
    unsigned long long tq, unsigned long long tk, float scale, unsigned int causal) {
    __shared__ __align__(16) FL_ELEM ks[FL_STAGES][FL_TILE][D + FL_PAD];
    __shared__ __align__(16) FL_ELEM vs[FL_STAGES][FL_TILE][D + FL_PAD];
    const float log2e = 1.4426950408889634f, scale2 = scale * log2e;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = 2 * (lane % 4);
    unsigned long long tiles = (tq + FL_ROWS - 1) / FL_ROWS;
    for (unsigned long long item = blockIdx.x; item < bh * tiles; item += gridDim.x) {
        // The last row tiles see the most keys under a causal mask: they go first.
        unsigned long long b = item % bh, row0 = (tiles - 1 - item / bh) * FL_ROWS;
        unsigned long long r0 = row0 + warp * 16;
        const FL_ELEM* kb = k + fl_base(b, heads, k_sb, k_sh);
        const FL_ELEM* vb = v + fl_base(b, heads, v_sb, v_sh);
        FL_A(qa);
        fl_load_a<D>(qa, q + fl_base(b, heads, q_sb, q_sh), q_st, r0, tq);
        float acc[D / 8][4];
#pragma unroll
        for (int nt = 0; nt < D / 8; nt++) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
        float m[2] = {fl_neg_inf(), fl_neg_inf()}, l[2] = {0.0f, 0.0f};
        unsigned long long key_end =
            causal ? fl_min(tk, fl_min(row0 + FL_ROWS, tq)) : tk;
        unsigned long long count = (key_end + FL_TILE - 1) / FL_TILE;
        auto fetch = [&](unsigned long long i) {
            fl_fetch_tile<D>(ks[i % FL_STAGES], kb, k_st, i * FL_TILE, tk);
            fl_fetch_tile<D>(vs[i % FL_STAGES], vb, v_st, i * FL_TILE, tk);
        };
        for (unsigned long long it = 0; it < count; it++) {
            fl_tile_ready(fetch, it, count);
            unsigned long long j0 = it * FL_TILE;
            int stage = (int)(it % FL_STAGES);
            // Under the mask a warp may see no key of the tile.
            if (!causal || j0 <= r0 + 15) {
                float s[FL_TILE / 8][4];
                fl_scores<D>(s, qa, ks[stage]);
                bool edge = j0 + FL_TILE > tk || (causal && j0 + FL_TILE - 1 > r0);
                float tile_max[2] = {fl_neg_inf(), fl_neg_inf()};
    #pragma unroll
                for (int nt = 0; nt < FL_TILE / 8; nt++) {
    #pragma unroll
                    for (int e = 0; e < 4; e++) {
                        float x = s[nt][e] * scale2;
                        if (edge) {
                            unsigned long long col = j0 + nt * 8 + c + (e & 1);
                            unsigned long long row = r0 + g + (e >> 1) * 8;
                            if (col >= tk || (causal && col > row)) x = fl_neg_inf();
                        }
                        s[nt][e] = x;
                        tile_max[e >> 1] = fmaxf(tile_max[e >> 1], x);
                    }
                }
                float base[2], correction[2];
    #pragma unroll
                for (int h = 0; h < 2; h++) {
                    float m_new = fmaxf(m[h], fl_quad_max(tile_max[h]));
                    // A row with no visible key yet keeps m = -inf: nothing to rescale.
                    base[h] = m_new == fl_neg_inf() ? 0.0f : m_new;
                    correction[h] = exp2f(m[h] - base[h]);
                    m[h] = m_new;
                    l[h] *= correction[h];
                }
    #pragma unroll
                for (int nt = 0; nt < FL_TILE / 8; nt++) {
    #pragma unroll
                    for (int e = 0; e < 4; e++) {
                        float p = exp2f(s[nt][e] - base[e >> 1]);
                        s[nt][e] = p;
                        l[e >> 1] += p;
                    }
                }
    #pragma unroll
                for (int nt = 0; nt < D / 8; nt++) {
                    acc[nt][0] *= correction[0];
                    acc[nt][1] *= correction[0];
                    acc[nt][2] *= correction[1];
                    acc[nt][3] *= correction[1];
                }
                fl_accumulate<D>(acc, s, vs[stage]);
            }
            __syncthreads();
        }
        float inv[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            l[h] = fl_quad_sum(l[h]);
            inv[h] = l[h] > 0.0f ? 1.0f / l[h] : 0.0f;
        }
        fl_store<D>(acc, out + fl_base(b, heads, o_sb, o_sh), o_st, r0, tq, inv[0], inv[1]);
        if (lane % 4 == 0) {
#pragma unroll
            for (int h = 0; h < 2; h++) {
                unsigned long long row = r0 + g + h * 8;
                if (row < tq) lse[b * tq + row] = (m[h] + log2f(l[h])) / log2e;
            }
        }
    }
}

template <int D>
__device__ __forceinline__ void fl_backward_dq(
    const FL_ELEM* q, unsigned long long q_sb, unsigned long long q_sh,
    unsigned long long q_st, const FL_ELEM* k, unsigned long long k_sb,
    unsigned long long k_sh, unsigned long long k_st, const FL_ELEM* v,
    unsigned long long v_sb, unsigned long long v_sh, unsigned long long v_st,
    const FL_ELEM* dout, unsigned long long g_sb, unsigned long long g_sh,
    unsigned long long g_st, const float* lse, const float* delta, FL_ELEM* dq,
    unsigned long long dq_sb, unsigned long long dq_sh, unsigned long long dq_st,
    unsigned long long bh, unsigned long long heads, unsigned long long tq,
    unsigned long long tk, float scale, unsigned int causal) {
    __shared__ __align__(16) FL_ELEM ks[FL_STAGES][FL_TILE][D + FL_PAD];
    __shared__ __align__(16) FL_ELEM vs[FL_STAGES][FL_TILE][D + FL_PAD];
    const float log2e = 1.4426950408889634f, scale2 = scale * log2e;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = 2 * (lane % 4);
    unsigned long long tiles = (tq + FL_ROWS - 1) / FL_ROWS;
    for (unsigned long long item = blockIdx.x; item < bh * tiles; item += gridDim.x) {
        unsigned long long b = item % bh, row0 = (tiles - 1 - item / bh) * FL_ROWS;
        unsigned long long r0 = row0 + warp * 16;
        const FL_ELEM* kb = k + fl_base(b, heads, k_sb, k_sh);
        const FL_ELEM* vb = v + fl_base(b, heads, v_sb, v_sh);
        FL_A(qa);
        FL_A(ga);
        fl_load_a<D>(qa, q + fl_base(b, heads, q_sb, q_sh), q_st, r0, tq);
        fl_load_a<D>(ga, dout + fl_base(b, heads, g_sb, g_sh), g_st, r0, tq);
        float lse2[2], dl[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            unsigned long long row = r0 + g + h * 8;
            lse2[h] = row < tq ? lse[b * tq + row] * log2e : 0.0f;
            dl[h] = row < tq ? delta[b * tq + row] : 0.0f;
        }
        float acc[D / 8][4];
#pragma unroll
        for (int nt = 0; nt < D / 8; nt++) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
        unsigned long long key_end =
            causal ? fl_min(tk, fl_min(row0 + FL_ROWS, tq)) : tk;
        unsigned long long count = (key_end + FL_TILE - 1) / FL_TILE;
        auto fetch = [&](unsigned long long i) {
            fl_fetch_tile<D>(ks[i % FL_STAGES], kb, k_st, i * FL_TILE, tk);
            fl_fetch_tile<D>(vs[i % FL_STAGES], vb, v_st, i * FL_TILE, tk);
        };
        for (unsigned long long it = 0; it < count; it++) {
            fl_tile_ready(fetch, it, count);
            unsigned long long j0 = it * FL_TILE;
            int stage = (int)(it % FL_STAGES);
            if (!causal || j0 <= r0 + 15) {
                float p[FL_TILE / 8][4], dp[FL_TILE / 8][4];
                fl_scores<D>(p, qa, ks[stage]);
                fl_scores<D>(dp, ga, vs[stage]);
                bool edge = j0 + FL_TILE > tk || (causal && j0 + FL_TILE - 1 > r0);
    #pragma unroll
                for (int nt = 0; nt < FL_TILE / 8; nt++) {
    #pragma unroll
                    for (int e = 0; e < 4; e++) {
                        float x = exp2f(p[nt][e] * scale2 - lse2[e >> 1]);
                        if (edge) {
                            unsigned long long col = j0 + nt * 8 + c + (e & 1);
                            unsigned long long row = r0 + g + (e >> 1) * 8;
                            if (col >= tk || (causal && col > row)) x = 0.0f;
                        }
                        p[nt][e] = x * (dp[nt][e] - dl[e >> 1]);  // dS
                    }
                }
                fl_accumulate<D>(acc, p, ks[stage]);
            }
            __syncthreads();
        }
        fl_store<D>(acc, dq + fl_base(b, heads, dq_sb, dq_sh), dq_st, r0, tq, scale, scale);
    }
}

template <int D>
__device__ __forceinline__ void fl_backward_dkdv(
    const FL_ELEM* q, unsigned long long q_sb, unsigned long long q_sh,
    unsigned long long q_st, const FL_ELEM* k, unsigned long long k_sb,
    unsigned long long k_sh, unsigned long long k_st, const FL_ELEM* v,
    unsigned long long v_sb, unsigned long long v_sh, unsigned long long v_st,
    const FL_ELEM* dout, unsigned long long g_sb, unsigned long long g_sh,
    unsigned long long g_st, const float* lse, const float* delta, FL_ELEM* dk,
    unsigned long long dk_sb, unsigned long long dk_sh, unsigned long long dk_st,
    FL_ELEM* dv, unsigned long long dv_sb, unsigned long long dv_sh,
    unsigned long long dv_st, unsigned long long bh, unsigned long long heads,
    unsigned long long tq, unsigned long long tk, float scale, unsigned int causal) {
    __shared__ __align__(16) FL_ELEM qs[FL_STAGES][FL_TILE][D + FL_PAD];
    __shared__ __align__(16) FL_ELEM gs[FL_STAGES][FL_TILE][D + FL_PAD];
    __shared__ float lse_s[FL_STAGES][FL_TILE], delta_s[FL_STAGES][FL_TILE];
    const float log2e = 1.4426950408889634f, scale2 = scale * log2e;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = 2 * (lane % 4);
    unsigned long long tiles = (tk + FL_ROWS - 1) / FL_ROWS;
    for (unsigned long long item = blockIdx.x; item < bh * tiles; item += gridDim.x) {
        // The first key tiles are seen by the most queries under a causal mask.
        unsigned long long b = item % bh, row0 = (item / bh) * FL_ROWS;
        unsigned long long r0 = row0 + warp * 16;  // this warp's first key
        const FL_ELEM* qb = q + fl_base(b, heads, q_sb, q_sh);
        const FL_ELEM* gb = dout + fl_base(b, heads, g_sb, g_sh);
        FL_A(ka);
        FL_A(va);
        fl_load_a<D>(ka, k + fl_base(b, heads, k_sb, k_sh), k_st, r0, tk);
        fl_load_a<D>(va, v + fl_base(b, heads, v_sb, v_sh), v_st, r0, tk);
        float dk_acc[D / 8][4], dv_acc[D / 8][4];
#pragma unroll
        for (int nt = 0; nt < D / 8; nt++) {
            dk_acc[nt][0] = dk_acc[nt][1] = dk_acc[nt][2] = dk_acc[nt][3] = 0.0f;
            dv_acc[nt][0] = dv_acc[nt][1] = dv_acc[nt][2] = dv_acc[nt][3] = 0.0f;
        }
        // Queries before the block's first key see none of its keys under the mask.
        unsigned long long i_begin = causal ? (row0 / FL_TILE) * FL_TILE : 0;
        unsigned long long count = i_begin < tq ? (tq - i_begin + FL_TILE - 1) / FL_TILE : 0;
        auto fetch = [&](unsigned long long i) {
            unsigned long long i0 = i_begin + i * FL_TILE;
            int stage = (int)(i % FL_STAGES);
            fl_fetch_tile<D>(qs[stage], qb, q_st, i0, tq);
            fl_fetch_tile<D>(gs[stage], gb, g_st, i0, tq);
            for (int r = threadIdx.x; r < FL_TILE; r += blockDim.x) {
                bool live = i0 + r < tq;
                lse_s[stage][r] = live ? lse[b * tq + i0 + r] * log2e : 0.0f;
                delta_s[stage][r] = live ? delta[b * tq + i0 + r] : 0.0f;
            }
        };
        for (unsigned long long it = 0; it < count; it++) {
            fl_tile_ready(fetch, it, count);
            unsigned long long i0 = i_begin + it * FL_TILE;
            int stage = (int)(it % FL_STAGES);
            // Under the mask every query of the tile may precede the warp's keys.
            if (!causal || i0 + FL_TILE - 1 >= r0) {
                // Pᵀ and dPᵀ: rows are this warp's keys, columns the tile's queries.
                float p[FL_TILE / 8][4], dp[FL_TILE / 8][4];
                fl_scores<D>(p, ka, qs[stage]);
                fl_scores<D>(dp, va, gs[stage]);
                bool edge = i0 + FL_TILE > tq || r0 + 16 > tk || (causal && r0 + 15 > i0);
    #pragma unroll
                for (int nt = 0; nt < FL_TILE / 8; nt++) {
    #pragma unroll
                    for (int e = 0; e < 4; e++) {
                        int col = nt * 8 + c + (e & 1);
                        float x = exp2f(p[nt][e] * scale2 - lse_s[stage][col]);
                        if (edge) {
                            unsigned long long query = i0 + col;
                            unsigned long long key = r0 + g + (e >> 1) * 8;
                            if (query >= tq || key >= tk || (causal && key > query)) x = 0.0f;
                        }
                        p[nt][e] = x;
                        dp[nt][e] = x * (dp[nt][e] - delta_s[stage][col]);  // dSᵀ
                    }
                }
                fl_accumulate<D>(dv_acc, p, gs[stage]);
                fl_accumulate<D>(dk_acc, dp, qs[stage]);
            }
            __syncthreads();
        }
        fl_store<D>(dk_acc, dk + fl_base(b, heads, dk_sb, dk_sh), dk_st, r0, tk, scale, scale);
        fl_store<D>(dv_acc, dv + fl_base(b, heads, dv_sb, dv_sh), dv_st, r0, tk, 1.0f, 1.0f);
    }
}

// The C entry points, one per head_dim, with the signatures of kernels/attention.cu
// (the dropout arguments are unused: these kernels serve calls without dropout).
#define FL_DEFINE(D)                                                                        \
    extern "C" __global__ void __launch_bounds__(256)                                       \
        flash_attention_forward_d##D##_DT(                                                  \
            const FL_ELEM* q, unsigned long long q_sb, unsigned long long q_sh,      \
            unsigned long long q_st, const FL_ELEM* k, unsigned long long k_sb,      \
            unsigned long long k_sh, unsigned long long k_st, const FL_ELEM* v,      \
            unsigned long long v_sb, unsigned long long v_sh, unsigned long long v_st,      \
            FL_ELEM* out, unsigned long long o_sb, unsigned long long o_sh,          \
            unsigned long long o_st, float* lse, unsigned long long bh,                     \
            unsigned long long heads, unsigned long long tq, unsigned long long tk,         \
            unsigned int d, float scale, unsigned int causal, float keep, float drop_scale, \
            unsigned long long seed, unsigned long long offset) {                           \
        fl_forward<D>(q, q_sb, q_sh, q_st, k, k_sb, k_sh, k_st, v, v_sb, v_sh, v_st, out,   \
                      o_sb, o_sh, o_st, lse, bh, heads, tq, tk, scale, causal);             \
    }                                                                                       \
    extern "C" __global__ void __launch_bounds__(256)                                       \
        flash_attention_backward_dq_d##D##_DT(                                              \
            const FL_ELEM* q, unsigned long long q_sb, unsigned long long q_sh,      \
            unsigned long long q_st, const FL_ELEM* k, unsigned long long k_sb,      \
            unsigned long long k_sh, unsigned long long k_st, const FL_ELEM* v,      \
            unsigned long long v_sb, unsigned long long v_sh, unsigned long long v_st,      \
            const FL_ELEM* dout, unsigned long long g_sb, unsigned long long g_sh,   \
            unsigned long long g_st, const float* lse, const float* delta,                  \
            FL_ELEM* dq, unsigned long long dq_sb, unsigned long long dq_sh,         \
            unsigned long long dq_st, unsigned long long bh, unsigned long long heads,      \
            unsigned long long tq, unsigned long long tk, unsigned int d, float scale,      \
            unsigned int causal, float keep, float drop_scale, unsigned long long seed,     \
            unsigned long long offset) {                                                    \
        fl_backward_dq<D>(q, q_sb, q_sh, q_st, k, k_sb, k_sh, k_st, v, v_sb, v_sh, v_st,    \
                          dout, g_sb, g_sh, g_st, lse, delta, dq, dq_sb, dq_sh, dq_st, bh,  \
                          heads, tq, tk, scale, causal);                                    \
    }                                                                                       \
    extern "C" __global__ void __launch_bounds__(256)                                       \
        flash_attention_backward_dkdv_d##D##_DT(                                            \
            const FL_ELEM* q, unsigned long long q_sb, unsigned long long q_sh,      \
            unsigned long long q_st, const FL_ELEM* k, unsigned long long k_sb,      \
            unsigned long long k_sh, unsigned long long k_st, const FL_ELEM* v,      \
            unsigned long long v_sb, unsigned long long v_sh, unsigned long long v_st,      \
            const FL_ELEM* dout, unsigned long long g_sb, unsigned long long g_sh,   \
            unsigned long long g_st, const float* lse, const float* delta,                  \
            FL_ELEM* dk, unsigned long long dk_sb, unsigned long long dk_sh,         \
            unsigned long long dk_st, FL_ELEM* dv, unsigned long long dv_sb,         \
            unsigned long long dv_sh, unsigned long long dv_st, unsigned long long bh,      \
            unsigned long long heads, unsigned long long tq, unsigned long long tk,         \
            unsigned int d, float scale, unsigned int causal, float keep, float drop_scale, \
            unsigned long long seed, unsigned long long offset) {                           \
        fl_backward_dkdv<D>(q, q_sb, q_sh, q_st, k, k_sb, k_sh, k_st, v, v_sb, v_sh, v_st,  \
                            dout, g_sb, g_sh, g_st, lse, delta, dk, dk_sb, dk_sh, dk_st,    \
                            dv, dv_sb, dv_sh, dv_st, bh, heads, tq, tk, scale, causal);     \
    }

FL_DEFINE(16)
FL_DEFINE(32)
FL_DEFINE(48)
FL_DEFINE(64)
// END kernels
