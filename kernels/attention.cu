// Fused attention (flash-attention style) over [B, H, T, D] operands, D <= 128.
// Not compiled as it is: source.rs prepends the element type's helpers (ELEM,
// to_float, from_float) of kernels/dtypes.cu and renames every `NAME_DT(` to
// `NAME_<dtype>(`. The arguments follow `AttentionKernel::params` in
// labs/core/device/src/kernels/attention.rs; the twins are in attention_cpu.rs.
//
// Operands: each [B, H, T, D] tensor comes as its pointer and its element strides over
// batch, head and sequence (`_sb`, `_sh`, `_st`; head_dim has unit stride), so the head
// views of a [B, T, E] projection are read where they lie and the output can be written
// as [B, T, H, D] memory. Batch-head `bh` is batch bh / heads, head bh % heads. The
// log-sum-exp and delta are dense float [B*H, Tq].
//
// Forward: a block takes a tile of ATT_ROWS query rows of one (batch, head), one warp per
// row; the block's threads load the keys and values ATT_KEYS at a time into shared memory
// (as float), and each warp walks them keeping the running max `m`, the running sum `l`
// of exp(s - m) and its accumulator, rescaled whenever the max grows. Only the output
// and the row's log-sum-exp `m + log(l)` (float) are written: never the T x T scores.
//
// Dropout (keep < 1): the accumulator takes p * Z / keep where the keep flag Z of
// element (bh, i, j) is word j % 4 of the Philox4x32-10 block of counter
// offset + (bh * Tq + i) * ceil(Tk / 4) + j / 4 under `seed`, kept when its 24-bit
// uniform is below `keep` (the dropout kernel's rule; `attention_keeps` in
// attention.rs). While a tile loads, the block's first threads draw its flags into
// shared memory, one Philox block per four elements; `l` and the log-sum-exp stay those
// of the undropped weights, so the backward regenerates the same flags from (seed,
// offset) instead of reading a stored mask.
//
// Backward (FlashAttention-2's split): `delta` = rowsum(dO * O); then dQ with one warp
// per query row walking key tiles, and dK, dV with one warp per key row walking query
// tiles, each recomputing p = exp(s - lse) from q, k and the saved lse, and with
// dropout dV += (p Z / keep) dO, dP = (dO . v) Z / keep, dS = p (dP - delta). No
// atomics: every gradient row is written by one warp, so results are deterministic.
//
// Each lane holds dimensions lane, lane + 32, lane + 64, lane + 96; a dot product is
// summed across the warp with shuffles. The work items (row tiles) are walked in a
// grid-stride loop over blocks, so every thread of a block runs the same iterations
// and __syncthreads is safe.

#define ATT_ROWS 8    // query (or key) rows per block: one per warp of 256 threads
#define ATT_KEYS 32   // rows of the shared-memory tiles (a multiple of 4)
#define ATT_MAX_D 128
#define ATT_PER_LANE 4  // ATT_MAX_D / 32

__device__ __forceinline__ float att_neg_inf() { return __uint_as_float(0xff800000u); }

__device__ __forceinline__ unsigned long long att_min(unsigned long long a, unsigned long long b) {
    return a < b ? a : b;
}

__device__ __forceinline__ float att_warp_sum(float v) {
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// The first element of batch-head bh of an operand with strides (sb, sh) over batch
// and head.
__device__ __forceinline__ unsigned long long att_base(unsigned long long bh,
                                                       unsigned long long heads,
                                                       unsigned long long sb,
                                                       unsigned long long sh) {
    return (bh / heads) * sb + (bh % heads) * sh;
}

// Loads rows [t0, t0 + count) of a [T, d] matrix with row stride st into
// tile[ATT_KEYS][ATT_MAX_D].
__device__ __forceinline__ void att_load_tile_DT(float (*tile)[ATT_MAX_D], const ELEM* base,
                                                 unsigned long long st, unsigned long long t0,
                                                 unsigned int count, unsigned int d) {
    for (unsigned int e = threadIdx.x; e < count * d; e += blockDim.x) {
        unsigned int r = e / d, c = e % d;
        tile[r][c] = to_float(base[(t0 + r) * st + c]);
    }
}

// Philox4x32-10 (Salmon et al., SC 2011), as philox4x32_10 in kernels/rows.rs: the four
// words w[0..4] of the block of counter (lo, hi, 0, 0) under key `seed`.
__device__ __forceinline__ void att_philox(unsigned long long counter, unsigned long long seed,
                                           unsigned int* w) {
    unsigned int c0 = (unsigned int)counter, c1 = (unsigned int)(counter >> 32);
    unsigned int c2 = 0, c3 = 0;
    unsigned int k0 = (unsigned int)seed, k1 = (unsigned int)(seed >> 32);
    for (int round = 0; round < 10; ++round) {
        if (round > 0) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        unsigned int hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
        unsigned int hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
        unsigned int n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
        c0 = n0;
        c1 = lo1;
        c2 = n2;
        c3 = lo0;
    }
    w[0] = c0;
    w[1] = c1;
    w[2] = c2;
    w[3] = c3;
}

__device__ __forceinline__ unsigned char att_kept(unsigned int word, float keep) {
    return (float)(word >> 8) * (1.0f / 16777216.0f) < keep ? 1 : 0;
}

// flags[r * nk + c] = the keep flag of element (bh, q0 + r, k0 + c) for r < nq, c < nk
// (k0 and nk multiples of 4), 0 outside [0, tq) x [0, tk): one Philox block per four
// keys, drawn by the block's first nq * nk / 4 threads.
__device__ __forceinline__ void att_draw_flags(unsigned char* flags, unsigned long long bh,
                                               unsigned long long q0, unsigned int nq,
                                               unsigned long long k0, unsigned int nk,
                                               unsigned long long tq, unsigned long long tk,
                                               float keep, unsigned long long seed,
                                               unsigned long long offset) {
    unsigned int groups = nk / 4;
    unsigned long long row_groups = (tk + 3) / 4;
    for (unsigned int t = threadIdx.x; t < nq * groups; t += blockDim.x) {
        unsigned int r = t / groups, g = t % groups;
        unsigned long long i = q0 + r, j0 = k0 + 4 * g;
        unsigned char* f = flags + r * nk + 4 * g;
        if (i < tq && j0 < tk) {
            unsigned int w[4];
            att_philox(offset + (bh * tq + i) * row_groups + j0 / 4, seed, w);
            for (int c = 0; c < 4; c++) f[c] = j0 + c < tk ? att_kept(w[c], keep) : 0;
        } else {
            for (int c = 0; c < 4; c++) f[c] = 0;
        }
    }
}

// out[bh, i, :] and lse[bh, i] for every query row i; causal hides keys j > i.
extern "C" __global__ void attention_forward_DT(
    const ELEM* q, unsigned long long q_sb, unsigned long long q_sh, unsigned long long q_st,
    const ELEM* k, unsigned long long k_sb, unsigned long long k_sh, unsigned long long k_st,
    const ELEM* v, unsigned long long v_sb, unsigned long long v_sh, unsigned long long v_st,
    ELEM* out, unsigned long long o_sb, unsigned long long o_sh, unsigned long long o_st,
    float* lse, unsigned long long bh, unsigned long long heads, unsigned long long tq,
    unsigned long long tk, unsigned int d, float scale, unsigned int causal, float keep,
    float drop_scale, unsigned long long seed, unsigned long long offset) {
    __shared__ float ks[ATT_KEYS][ATT_MAX_D];
    __shared__ float vs[ATT_KEYS][ATT_MAX_D];
    __shared__ unsigned char kept[ATT_ROWS][ATT_KEYS];
    bool dropping = keep < 1.0f;
    unsigned int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    unsigned long long tiles = (tq + ATT_ROWS - 1) / ATT_ROWS;
    for (unsigned long long item = blockIdx.x; item < bh * tiles; item += gridDim.x) {
        unsigned long long b = item / tiles;
        unsigned long long r0 = (item % tiles) * ATT_ROWS;
        unsigned long long i = r0 + warp;
        bool live = i < tq;
        const ELEM* qb = q + att_base(b, heads, q_sb, q_sh);
        const ELEM* kb = k + att_base(b, heads, k_sb, k_sh);
        const ELEM* vb = v + att_base(b, heads, v_sb, v_sh);
        float qr[ATT_PER_LANE], acc[ATT_PER_LANE];
        for (int c = 0; c < ATT_PER_LANE; c++) {
            unsigned int dd = lane + 32 * c;
            qr[c] = (live && dd < d) ? to_float(qb[i * q_st + dd]) : 0.0f;
            acc[c] = 0.0f;
        }
        float m = att_neg_inf(), l = 0.0f;
        // The last key any row of the tile sees (uniform across the block).
        unsigned long long last_row = att_min(r0 + ATT_ROWS, tq) - 1;
        unsigned long long key_end = causal ? att_min(tk, last_row + 1) : tk;
        for (unsigned long long t0 = 0; t0 < key_end; t0 += ATT_KEYS) {
            unsigned int count = (unsigned int)att_min(ATT_KEYS, key_end - t0);
            __syncthreads();  // the previous tile is no longer read
            att_load_tile_DT(ks, kb, k_st, t0, count, d);
            att_load_tile_DT(vs, vb, v_st, t0, count, d);
            if (dropping)
                att_draw_flags(&kept[0][0], b, r0, ATT_ROWS, t0, ATT_KEYS, tq, tk, keep, seed,
                               offset);
            __syncthreads();
            if (!live) continue;
            for (unsigned int jj = 0; jj < count; jj++) {
                unsigned long long j = t0 + jj;
                if (causal && j > i) break;  // warp-uniform: one row per warp
                float s = 0.0f;
                for (int c = 0; c < ATT_PER_LANE; c++) {
                    unsigned int dd = lane + 32 * c;
                    if (dd < d) s += qr[c] * ks[jj][dd];
                }
                s = att_warp_sum(s) * scale;
                float m_new = fmaxf(m, s);
                float correction = expf(m - m_new);  // 0 for the first key (m = -inf)
                float p = expf(s - m_new);
                l = l * correction + p;
                float pv = dropping ? (kept[warp][jj] ? p * drop_scale : 0.0f) : p;
                for (int c = 0; c < ATT_PER_LANE; c++) {
                    unsigned int dd = lane + 32 * c;
                    if (dd < d) acc[c] = acc[c] * correction + pv * vs[jj][dd];
                }
                m = m_new;
            }
        }
        if (live) {
            float inv = 1.0f / l;
            ELEM* ob = out + att_base(b, heads, o_sb, o_sh) + i * o_st;
            for (int c = 0; c < ATT_PER_LANE; c++) {
                unsigned int dd = lane + 32 * c;
                if (dd < d) ob[dd] = from_float(acc[c] * inv);
            }
            if (lane == 0) lse[b * tq + i] = m + logf(l);
        }
    }
}

// delta[bh * tq + i] = sum_d dout[bh, i, d] * out[bh, i, d], one warp per row.
extern "C" __global__ void attention_backward_delta_DT(
    const ELEM* out, unsigned long long o_sb, unsigned long long o_sh, unsigned long long o_st,
    const ELEM* dout, unsigned long long g_sb, unsigned long long g_sh, unsigned long long g_st,
    float* delta, unsigned long long bh, unsigned long long heads, unsigned long long tq,
    unsigned long long tk, unsigned int d) {
    unsigned long long warp = (blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x) / 32;
    unsigned long long warps = (gridDim.x * (unsigned long long)blockDim.x) / 32;
    unsigned int lane = threadIdx.x % 32;
    unsigned long long rows = bh * tq;
    for (unsigned long long r = warp; r < rows; r += warps) {
        unsigned long long b = r / tq, i = r % tq;
        const ELEM* o = out + att_base(b, heads, o_sb, o_sh) + i * o_st;
        const ELEM* g = dout + att_base(b, heads, g_sb, g_sh) + i * g_st;
        float s = 0.0f;
        for (unsigned int c = lane; c < d; c += 32) s += to_float(o[c]) * to_float(g[c]);
        s = att_warp_sum(s);
        if (lane == 0) delta[r] = s;
    }
}

// dq[bh, i, :] = scale * sum_j p_ij (dp_ij - delta_i) k_j, with p_ij = exp(s_ij - lse_i)
// and dp_ij = (dO_i . v_j) Z_ij / keep: one warp per query row, key tiles in shared
// memory.
extern "C" __global__ void attention_backward_dq_DT(
    const ELEM* q, unsigned long long q_sb, unsigned long long q_sh, unsigned long long q_st,
    const ELEM* k, unsigned long long k_sb, unsigned long long k_sh, unsigned long long k_st,
    const ELEM* v, unsigned long long v_sb, unsigned long long v_sh, unsigned long long v_st,
    const ELEM* dout, unsigned long long g_sb, unsigned long long g_sh, unsigned long long g_st,
    const float* lse, const float* delta,
    ELEM* dq, unsigned long long dq_sb, unsigned long long dq_sh, unsigned long long dq_st,
    unsigned long long bh, unsigned long long heads, unsigned long long tq,
    unsigned long long tk, unsigned int d, float scale, unsigned int causal, float keep,
    float drop_scale, unsigned long long seed, unsigned long long offset) {
    __shared__ float ks[ATT_KEYS][ATT_MAX_D];
    __shared__ float vs[ATT_KEYS][ATT_MAX_D];
    __shared__ unsigned char kept[ATT_ROWS][ATT_KEYS];
    bool dropping = keep < 1.0f;
    unsigned int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    unsigned long long tiles = (tq + ATT_ROWS - 1) / ATT_ROWS;
    for (unsigned long long item = blockIdx.x; item < bh * tiles; item += gridDim.x) {
        unsigned long long b = item / tiles;
        unsigned long long r0 = (item % tiles) * ATT_ROWS;
        unsigned long long i = r0 + warp;
        bool live = i < tq;
        const ELEM* qi = q + att_base(b, heads, q_sb, q_sh) + i * q_st;
        const ELEM* gi = dout + att_base(b, heads, g_sb, g_sh) + i * g_st;
        const ELEM* kb = k + att_base(b, heads, k_sb, k_sh);
        const ELEM* vb = v + att_base(b, heads, v_sb, v_sh);
        float qr[ATT_PER_LANE], gr[ATT_PER_LANE], acc[ATT_PER_LANE];
        for (int c = 0; c < ATT_PER_LANE; c++) {
            unsigned int dd = lane + 32 * c;
            bool in = live && dd < d;
            qr[c] = in ? to_float(qi[dd]) : 0.0f;
            gr[c] = in ? to_float(gi[dd]) : 0.0f;
            acc[c] = 0.0f;
        }
        float row_lse = live ? lse[b * tq + i] : 0.0f;
        float row_delta = live ? delta[b * tq + i] : 0.0f;
        unsigned long long last_row = att_min(r0 + ATT_ROWS, tq) - 1;
        unsigned long long key_end = causal ? att_min(tk, last_row + 1) : tk;
        for (unsigned long long t0 = 0; t0 < key_end; t0 += ATT_KEYS) {
            unsigned int count = (unsigned int)att_min(ATT_KEYS, key_end - t0);
            __syncthreads();
            att_load_tile_DT(ks, kb, k_st, t0, count, d);
            att_load_tile_DT(vs, vb, v_st, t0, count, d);
            if (dropping)
                att_draw_flags(&kept[0][0], b, r0, ATT_ROWS, t0, ATT_KEYS, tq, tk, keep, seed,
                               offset);
            __syncthreads();
            if (!live) continue;
            for (unsigned int jj = 0; jj < count; jj++) {
                unsigned long long j = t0 + jj;
                if (causal && j > i) break;
                float s = 0.0f, dp = 0.0f;
                for (int c = 0; c < ATT_PER_LANE; c++) {
                    unsigned int dd = lane + 32 * c;
                    if (dd < d) {
                        s += qr[c] * ks[jj][dd];
                        dp += gr[c] * vs[jj][dd];
                    }
                }
                s = att_warp_sum(s) * scale;
                dp = att_warp_sum(dp);
                if (dropping) dp = kept[warp][jj] ? dp * drop_scale : 0.0f;
                float p = expf(s - row_lse);
                float ds = p * (dp - row_delta);
                for (int c = 0; c < ATT_PER_LANE; c++) {
                    unsigned int dd = lane + 32 * c;
                    if (dd < d) acc[c] += ds * ks[jj][dd];
                }
            }
        }
        if (live) {
            ELEM* dqi = dq + att_base(b, heads, dq_sb, dq_sh) + i * dq_st;
            for (int c = 0; c < ATT_PER_LANE; c++) {
                unsigned int dd = lane + 32 * c;
                if (dd < d) dqi[dd] = from_float(acc[c] * scale);
            }
        }
    }
}

// dk[bh, j, :] = scale * sum_i ds_ij q_i and dv[bh, j, :] = sum_i (p_ij Z_ij / keep) dO_i:
// one warp per key row, query tiles (q, dO, lse, delta) in shared memory. Causal: only
// rows i >= j.
extern "C" __global__ void attention_backward_dkdv_DT(
    const ELEM* q, unsigned long long q_sb, unsigned long long q_sh, unsigned long long q_st,
    const ELEM* k, unsigned long long k_sb, unsigned long long k_sh, unsigned long long k_st,
    const ELEM* v, unsigned long long v_sb, unsigned long long v_sh, unsigned long long v_st,
    const ELEM* dout, unsigned long long g_sb, unsigned long long g_sh, unsigned long long g_st,
    const float* lse, const float* delta,
    ELEM* dk, unsigned long long dk_sb, unsigned long long dk_sh, unsigned long long dk_st,
    ELEM* dv, unsigned long long dv_sb, unsigned long long dv_sh, unsigned long long dv_st,
    unsigned long long bh, unsigned long long heads, unsigned long long tq,
    unsigned long long tk, unsigned int d, float scale, unsigned int causal, float keep,
    float drop_scale, unsigned long long seed, unsigned long long offset) {
    __shared__ float qs[ATT_KEYS][ATT_MAX_D];
    __shared__ float gs[ATT_KEYS][ATT_MAX_D];
    __shared__ float ls[ATT_KEYS];
    __shared__ float ds_[ATT_KEYS];
    __shared__ unsigned char kept[ATT_KEYS][ATT_ROWS];  // [query row][key row]
    bool dropping = keep < 1.0f;
    unsigned int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    unsigned long long tiles = (tk + ATT_ROWS - 1) / ATT_ROWS;
    for (unsigned long long item = blockIdx.x; item < bh * tiles; item += gridDim.x) {
        unsigned long long b = item / tiles;
        unsigned long long r0 = (item % tiles) * ATT_ROWS;
        unsigned long long j = r0 + warp;
        bool live = j < tk;
        const ELEM* qb = q + att_base(b, heads, q_sb, q_sh);
        const ELEM* gb = dout + att_base(b, heads, g_sb, g_sh);
        const ELEM* kj = k + att_base(b, heads, k_sb, k_sh) + j * k_st;
        const ELEM* vj = v + att_base(b, heads, v_sb, v_sh) + j * v_st;
        float kr[ATT_PER_LANE], vr[ATT_PER_LANE], dk_acc[ATT_PER_LANE], dv_acc[ATT_PER_LANE];
        for (int c = 0; c < ATT_PER_LANE; c++) {
            unsigned int dd = lane + 32 * c;
            bool in = live && dd < d;
            kr[c] = in ? to_float(kj[dd]) : 0.0f;
            vr[c] = in ? to_float(vj[dd]) : 0.0f;
            dk_acc[c] = 0.0f;
            dv_acc[c] = 0.0f;
        }
        // The first query row any key of the tile is seen by (uniform across the block).
        unsigned long long query_start = causal ? r0 : 0;
        for (unsigned long long t0 = query_start; t0 < tq; t0 += ATT_KEYS) {
            unsigned int count = (unsigned int)att_min(ATT_KEYS, tq - t0);
            __syncthreads();
            att_load_tile_DT(qs, qb, q_st, t0, count, d);
            att_load_tile_DT(gs, gb, g_st, t0, count, d);
            for (unsigned int e = threadIdx.x; e < count; e += blockDim.x) {
                ls[e] = lse[b * tq + t0 + e];
                ds_[e] = delta[b * tq + t0 + e];
            }
            // r0 is a multiple of ATT_ROWS, so of 4: the tile's keys are whole groups.
            if (dropping)
                att_draw_flags(&kept[0][0], b, t0, ATT_KEYS, r0, ATT_ROWS, tq, tk, keep, seed,
                               offset);
            __syncthreads();
            if (!live) continue;
            for (unsigned int ii = 0; ii < count; ii++) {
                unsigned long long i = t0 + ii;
                if (causal && j > i) continue;  // warp-uniform: one key row per warp
                float s = 0.0f, dp = 0.0f;
                for (int c = 0; c < ATT_PER_LANE; c++) {
                    unsigned int dd = lane + 32 * c;
                    if (dd < d) {
                        s += qs[ii][dd] * kr[c];
                        dp += gs[ii][dd] * vr[c];
                    }
                }
                s = att_warp_sum(s) * scale;
                dp = att_warp_sum(dp);
                float p = expf(s - ls[ii]);
                float pv = p;
                if (dropping) {
                    float z = kept[ii][warp] ? drop_scale : 0.0f;
                    pv = p * z;
                    dp = dp * z;
                }
                float ds = p * (dp - ds_[ii]);
                for (int c = 0; c < ATT_PER_LANE; c++) {
                    unsigned int dd = lane + 32 * c;
                    if (dd < d) {
                        dv_acc[c] += pv * gs[ii][dd];
                        dk_acc[c] += ds * qs[ii][dd];
                    }
                }
            }
        }
        if (live) {
            ELEM* dkj = dk + att_base(b, heads, dk_sb, dk_sh) + j * dk_st;
            ELEM* dvj = dv + att_base(b, heads, dv_sb, dv_sh) + j * dv_st;
            for (int c = 0; c < ATT_PER_LANE; c++) {
                unsigned int dd = lane + 32 * c;
                if (dd < d) {
                    dkj[dd] = from_float(dk_acc[c] * scale);
                    dvj[dd] = from_float(dv_acc[c]);
                }
            }
        }
    }
}
