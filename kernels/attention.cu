// Fused attention (flash-attention style) over dense [BH, T, D] tensors, D <= 128.
// Not compiled as it is: source.rs prepends the element type's helpers (ELEM,
// to_float, from_float) of kernels/dtypes.cu and renames every `NAME_DT(` to
// `NAME_<dtype>(`. The arguments follow `AttentionKernel::params` in
// labs/core/src/kernels/attention.rs; the twins are in attention_cpu.rs.
//
// Forward: a block takes a tile of ATT_ROWS query rows of one (batch, head), one warp per
// row; the block's threads load the keys and values ATT_KEYS at a time into shared memory
// (as float), and each warp walks them keeping the running max `m`, the running sum `l`
// of exp(s - m) and its accumulator, rescaled whenever the max grows. Only the output
// and the row's log-sum-exp `m + log(l)` (float) are written: never the T x T scores.
//
// Backward (FlashAttention-2's split): `delta` = rowsum(dO * O); then dQ with one warp
// per query row walking key tiles, and dK, dV with one warp per key row walking query
// tiles, each recomputing p = exp(s - lse) from q, k and the saved lse. No atomics: every
// gradient row is written by one warp, so results are deterministic.
//
// Each lane holds dimensions lane, lane + 32, lane + 64, lane + 96; a dot product is
// summed across the warp with shuffles. The work items (row tiles) are walked in a
// grid-stride loop over blocks, so every thread of a block runs the same iterations
// and __syncthreads is safe. Simple rather than fast: its speed is for the lead to
// measure against the naive composition.

#define ATT_ROWS 8    // query (or key) rows per block: one per warp of 256 threads
#define ATT_KEYS 32   // rows of the shared-memory tiles
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

// Loads rows [t0, t0 + count) of a dense [T, d] matrix into tile[ATT_KEYS][ATT_MAX_D].
__device__ __forceinline__ void att_load_tile_DT(float (*tile)[ATT_MAX_D], const ELEM* base,
                                                 unsigned long long t0, unsigned int count,
                                                 unsigned int d) {
    for (unsigned int e = threadIdx.x; e < count * d; e += blockDim.x) {
        unsigned int r = e / d, c = e % d;
        tile[r][c] = to_float(base[(t0 + r) * d + c]);
    }
}

// out[bh, i, :] and lse[bh, i] for every query row i; causal hides keys j > i.
extern "C" __global__ void attention_forward_DT(const ELEM* q, const ELEM* k, const ELEM* v,
                                                ELEM* out, float* lse,
                                                unsigned long long bh, unsigned long long tq,
                                                unsigned long long tk, unsigned int d,
                                                float scale, unsigned int causal) {
    __shared__ float ks[ATT_KEYS][ATT_MAX_D];
    __shared__ float vs[ATT_KEYS][ATT_MAX_D];
    unsigned int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    unsigned long long tiles = (tq + ATT_ROWS - 1) / ATT_ROWS;
    for (unsigned long long item = blockIdx.x; item < bh * tiles; item += gridDim.x) {
        unsigned long long b = item / tiles;
        unsigned long long r0 = (item % tiles) * ATT_ROWS;
        unsigned long long i = r0 + warp;
        bool live = i < tq;
        const ELEM* qb = q + b * tq * d;
        const ELEM* kb = k + b * tk * d;
        const ELEM* vb = v + b * tk * d;
        float qr[ATT_PER_LANE], acc[ATT_PER_LANE];
        for (int c = 0; c < ATT_PER_LANE; c++) {
            unsigned int dd = lane + 32 * c;
            qr[c] = (live && dd < d) ? to_float(qb[i * d + dd]) : 0.0f;
            acc[c] = 0.0f;
        }
        float m = att_neg_inf(), l = 0.0f;
        // The last key any row of the tile sees (uniform across the block).
        unsigned long long last_row = att_min(r0 + ATT_ROWS, tq) - 1;
        unsigned long long key_end = causal ? att_min(tk, last_row + 1) : tk;
        for (unsigned long long t0 = 0; t0 < key_end; t0 += ATT_KEYS) {
            unsigned int count = (unsigned int)att_min(ATT_KEYS, key_end - t0);
            __syncthreads();  // the previous tile is no longer read
            att_load_tile_DT(ks, kb, t0, count, d);
            att_load_tile_DT(vs, vb, t0, count, d);
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
                for (int c = 0; c < ATT_PER_LANE; c++) {
                    unsigned int dd = lane + 32 * c;
                    if (dd < d) acc[c] = acc[c] * correction + p * vs[jj][dd];
                }
                m = m_new;
            }
        }
        if (live) {
            float inv = 1.0f / l;
            for (int c = 0; c < ATT_PER_LANE; c++) {
                unsigned int dd = lane + 32 * c;
                if (dd < d) out[b * tq * d + i * d + dd] = from_float(acc[c] * inv);
            }
            if (lane == 0) lse[b * tq + i] = m + logf(l);
        }
    }
}

// delta[r] = sum_d dout[r, d] * out[r, d], one warp per row of the rows = BH * Tq rows.
extern "C" __global__ void attention_backward_delta_DT(const ELEM* out, const ELEM* dout,
                                                       float* delta, unsigned long long rows,
                                                       unsigned int d) {
    unsigned long long warp = (blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x) / 32;
    unsigned long long warps = (gridDim.x * (unsigned long long)blockDim.x) / 32;
    unsigned int lane = threadIdx.x % 32;
    for (unsigned long long r = warp; r < rows; r += warps) {
        float s = 0.0f;
        for (unsigned int c = lane; c < d; c += 32)
            s += to_float(out[r * d + c]) * to_float(dout[r * d + c]);
        s = att_warp_sum(s);
        if (lane == 0) delta[r] = s;
    }
}

// dq[bh, i, :] = scale * sum_j p_ij (dp_ij - delta_i) k_j, with p_ij = exp(s_ij - lse_i)
// and dp_ij = dO_i . v_j: one warp per query row, key tiles in shared memory.
extern "C" __global__ void attention_backward_dq_DT(
    const ELEM* q, const ELEM* k, const ELEM* v, const ELEM* dout, const float* lse,
    const float* delta, ELEM* dq, unsigned long long bh, unsigned long long tq,
    unsigned long long tk, unsigned int d, float scale, unsigned int causal) {
    __shared__ float ks[ATT_KEYS][ATT_MAX_D];
    __shared__ float vs[ATT_KEYS][ATT_MAX_D];
    unsigned int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    unsigned long long tiles = (tq + ATT_ROWS - 1) / ATT_ROWS;
    for (unsigned long long item = blockIdx.x; item < bh * tiles; item += gridDim.x) {
        unsigned long long b = item / tiles;
        unsigned long long r0 = (item % tiles) * ATT_ROWS;
        unsigned long long i = r0 + warp;
        bool live = i < tq;
        const ELEM* kb = k + b * tk * d;
        const ELEM* vb = v + b * tk * d;
        float qr[ATT_PER_LANE], gr[ATT_PER_LANE], acc[ATT_PER_LANE];
        for (int c = 0; c < ATT_PER_LANE; c++) {
            unsigned int dd = lane + 32 * c;
            bool in = live && dd < d;
            qr[c] = in ? to_float(q[b * tq * d + i * d + dd]) : 0.0f;
            gr[c] = in ? to_float(dout[b * tq * d + i * d + dd]) : 0.0f;
            acc[c] = 0.0f;
        }
        float row_lse = live ? lse[b * tq + i] : 0.0f;
        float row_delta = live ? delta[b * tq + i] : 0.0f;
        unsigned long long last_row = att_min(r0 + ATT_ROWS, tq) - 1;
        unsigned long long key_end = causal ? att_min(tk, last_row + 1) : tk;
        for (unsigned long long t0 = 0; t0 < key_end; t0 += ATT_KEYS) {
            unsigned int count = (unsigned int)att_min(ATT_KEYS, key_end - t0);
            __syncthreads();
            att_load_tile_DT(ks, kb, t0, count, d);
            att_load_tile_DT(vs, vb, t0, count, d);
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
                float p = expf(s - row_lse);
                float ds = p * (dp - row_delta);
                for (int c = 0; c < ATT_PER_LANE; c++) {
                    unsigned int dd = lane + 32 * c;
                    if (dd < d) acc[c] += ds * ks[jj][dd];
                }
            }
        }
        if (live) {
            for (int c = 0; c < ATT_PER_LANE; c++) {
                unsigned int dd = lane + 32 * c;
                if (dd < d) dq[b * tq * d + i * d + dd] = from_float(acc[c] * scale);
            }
        }
    }
}

// dk[bh, j, :] = scale * sum_i ds_ij q_i and dv[bh, j, :] = sum_i p_ij dO_i: one warp per
// key row, query tiles (q, dO, lse, delta) in shared memory. Causal: only rows i >= j.
extern "C" __global__ void attention_backward_dkdv_DT(
    const ELEM* q, const ELEM* k, const ELEM* v, const ELEM* dout, const float* lse,
    const float* delta, ELEM* dk, ELEM* dv, unsigned long long bh, unsigned long long tq,
    unsigned long long tk, unsigned int d, float scale, unsigned int causal) {
    __shared__ float qs[ATT_KEYS][ATT_MAX_D];
    __shared__ float gs[ATT_KEYS][ATT_MAX_D];
    __shared__ float ls[ATT_KEYS];
    __shared__ float ds_[ATT_KEYS];
    unsigned int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    unsigned long long tiles = (tk + ATT_ROWS - 1) / ATT_ROWS;
    for (unsigned long long item = blockIdx.x; item < bh * tiles; item += gridDim.x) {
        unsigned long long b = item / tiles;
        unsigned long long r0 = (item % tiles) * ATT_ROWS;
        unsigned long long j = r0 + warp;
        bool live = j < tk;
        const ELEM* qb = q + b * tq * d;
        const ELEM* gb = dout + b * tq * d;
        float kr[ATT_PER_LANE], vr[ATT_PER_LANE], dk_acc[ATT_PER_LANE], dv_acc[ATT_PER_LANE];
        for (int c = 0; c < ATT_PER_LANE; c++) {
            unsigned int dd = lane + 32 * c;
            bool in = live && dd < d;
            kr[c] = in ? to_float(k[b * tk * d + j * d + dd]) : 0.0f;
            vr[c] = in ? to_float(v[b * tk * d + j * d + dd]) : 0.0f;
            dk_acc[c] = 0.0f;
            dv_acc[c] = 0.0f;
        }
        // The first query row any key of the tile is seen by (uniform across the block).
        unsigned long long query_start = causal ? r0 : 0;
        for (unsigned long long t0 = query_start; t0 < tq; t0 += ATT_KEYS) {
            unsigned int count = (unsigned int)att_min(ATT_KEYS, tq - t0);
            __syncthreads();
            att_load_tile_DT(qs, qb, t0, count, d);
            att_load_tile_DT(gs, gb, t0, count, d);
            for (unsigned int e = threadIdx.x; e < count; e += blockDim.x) {
                ls[e] = lse[b * tq + t0 + e];
                ds_[e] = delta[b * tq + t0 + e];
            }
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
                float ds = p * (dp - ds_[ii]);
                for (int c = 0; c < ATT_PER_LANE; c++) {
                    unsigned int dd = lane + 32 * c;
                    if (dd < d) {
                        dv_acc[c] += p * gs[ii][dd];
                        dk_acc[c] += ds * qs[ii][dd];
                    }
                }
            }
        }
        if (live) {
            for (int c = 0; c < ATT_PER_LANE; c++) {
                unsigned int dd = lane + 32 * c;
                if (dd < d) {
                    dk[b * tk * d + j * d + dd] = from_float(dk_acc[c] * scale);
                    dv[b * tk * d + j * d + dd] = from_float(dv_acc[c]);
                }
            }
        }
    }
}
