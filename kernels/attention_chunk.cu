// The row kernels of chunked attention: attention as matrix products (cuBLAS, tensor
// cores) over a chunk of query rows at a time, these kernels between the products.
// Not compiled as it is: source.rs appends it to kernels/attention.cu in each dtype's
// attention module (it uses that file's att_* helpers) and renames every `NAME_DT(` to
// `NAME_<dtype>(`. The arguments follow `AttentionChunkKernel::params` in
// labs/core/device/src/kernels/attention_chunk.rs; the twins are in attention_chunk_cpu.rs.
//
// A chunk's scores are dense float [n, rows, cols]: batch-heads bh0 .. bh0 + n, query
// rows r0 .. r0 + rows (of tq), keys 0 .. cols (of tk); row r of the chunk (r over
// n * rows) starts at element r * cols, and is query i = r0 + r % rows of batch-head
// bh0 + r / rows. The scores come already scaled (the product's alpha). The log-sum-exp
// and delta are the whole call's dense float [B*H, tq].
//
// The causal mask hides keys j > i; dropout keeps key j of row (bh, i) by word j % 4 of
// the Philox4x32-10 block of counter offset + (bh * tq + i) * ceil(tk / 4) + j / 4, the
// rule of the fused kernels (att_draw_flags), so that both paths drop the same weights.

// The factors of keys 4g .. 4g + 3 of row (bh, i): 1 without dropout, else Z / keep
// (drop_scale when kept, 0 when dropped).
__device__ __forceinline__ void att_chunk_factors(float* f, unsigned long long bh,
                                                  unsigned long long i, unsigned long long g,
                                                  unsigned long long tq, unsigned long long tk,
                                                  float keep, float drop_scale,
                                                  unsigned long long seed,
                                                  unsigned long long offset) {
    if (keep < 1.0f) {
        unsigned int w[4];
        att_philox(offset + (bh * tq + i) * ((tk + 3) / 4) + g, seed, w);
        for (int c = 0; c < 4; c++) f[c] = att_kept(w[c], keep) ? drop_scale : 0.0f;
    } else {
        for (int c = 0; c < 4; c++) f[c] = 1.0f;
    }
}

__device__ __forceinline__ float att_warp_max(float v) {
    for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Four consecutive elements, stored with one instruction where they are aligned: a
// warp's lanes each writing four neighbours one by one would touch every line four
// times.
struct __align__(4 * sizeof(ELEM)) att_elem4 {
    ELEM v[4];
};

// out[j0 .. j0 + 4] = v, those below `cols` only.
__device__ __forceinline__ void att_store4(ELEM* out, unsigned long long j0,
                                           unsigned long long cols, const float* v) {
    ELEM* at = out + j0;
    if (j0 + 4 <= cols && ((unsigned long long)at % sizeof(att_elem4)) == 0) {
        att_elem4 e;
        for (int c = 0; c < 4; c++) e.v[c] = from_float(v[c]);
        *(att_elem4*)at = e;
    } else {
        for (int c = 0; c < 4 && j0 + c < cols; c++) at[c] = from_float(v[c]);
    }
}

// The row's max and sum of exp(s_j - max) over its visible keys, one pass: each lane
// keeps its own (m, l) and rescales l when its max grows, then the warp merges them.
__device__ __forceinline__ void att_row_max_sum(const float* s, unsigned long long visible,
                                                unsigned int lane, float* m_out,
                                                float* l_out) {
    float m = att_neg_inf(), l = 0.0f;
    unsigned long long j = lane;
    if (((unsigned long long)s & 15) == 0) {
        // Four scores a load where the row is 16-byte aligned.
        const float4* s4 = (const float4*)s;
        for (unsigned long long g = lane; 4 * g + 3 < visible; g += 32) {
            float4 x = s4[g];
            float mx = fmaxf(fmaxf(x.x, x.y), fmaxf(x.z, x.w));
            if (mx > m) {
                l *= expf(m - mx);
                m = mx;
            }
            l += expf(x.x - m) + expf(x.y - m) + expf(x.z - m) + expf(x.w - m);
        }
        j = 4 * (visible / 4) + lane;
    }
    for (; j < visible; j += 32) {
        float x = s[j];
        if (x > m) {
            l *= expf(m - x);
            m = x;
        }
        l += expf(x - m);
    }
    float wm = att_warp_max(m);
    l = m == att_neg_inf() ? 0.0f : l * expf(m - wm);
    *m_out = wm;
    *l_out = att_warp_sum(l);
}

// lse[bh * tq + i] = log(sum over visible j of exp(s_ij)) and
// probs_ij = exp(s_ij - lse) * Z_ij / keep (0 where masked), one warp per row. The rows
// are walked warp by warp (grid-stride), so every lane of a warp takes the same rows and
// the shuffles see all 32. The scores are read twice: once for the max and the sum
// together, once for the weights.
extern "C" __global__ void attention_chunk_probs_DT(
    const float* scores, ELEM* probs, float* lse, unsigned long long bh0,
    unsigned long long n, unsigned long long r0, unsigned long long rows,
    unsigned long long cols, unsigned long long tq, unsigned long long tk, unsigned int causal,
    float keep, float drop_scale, unsigned long long seed, unsigned long long offset) {
    unsigned long long warp = (blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x) / 32;
    unsigned long long warps = (gridDim.x * (unsigned long long)blockDim.x) / 32;
    unsigned int lane = threadIdx.x % 32;
    for (unsigned long long r = warp; r < n * rows; r += warps) {
        unsigned long long bh = bh0 + r / rows, i = r0 + r % rows;
        const float* s = scores + r * cols;
        ELEM* p = probs + r * cols;
        unsigned long long visible = causal ? att_min(cols, i + 1) : cols;
        float m, l;
        att_row_max_sum(s, visible, lane, &m, &l);
        float row_lse = m + logf(l);
        if (lane == 0) lse[bh * tq + i] = row_lse;
        // Four keys (one Philox block) per lane and step.
        for (unsigned long long g = lane; g < (cols + 3) / 4; g += 32) {
            float f[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            if (4 * g < visible)
                att_chunk_factors(f, bh, i, g, tq, tk, keep, drop_scale, seed, offset);
            float w[4];
            for (int c = 0; c < 4; c++) {
                unsigned long long j = 4 * g + c;
                w[c] = j < visible ? expf(s[j] - row_lse) * f[c] : 0.0f;
            }
            att_store4(p, 4 * g, cols, w);
        }
    }
}

// Threads per row for rows of `units` units of work: a multiple of 32 (whole warps),
// at most the block, so that a block takes 256 / that many rows at once.
__device__ __forceinline__ unsigned int att_row_threads(unsigned long long units) {
    return units >= blockDim.x ? blockDim.x : (unsigned int)((units + 31) / 32) * 32;
}

// probs_ij = p Z / keep and dscores_ij = p (dprobs_ij Z / keep - delta_i) with
// p = exp(s_ij - lse_i), 0 where masked. Each thread takes four keys at a time (one
// Philox block); a row's keys go to whole warps of one block, the block's rows are
// walked grid-stride, so that a row's numbers are found once per row and no thread
// divides by a 64-bit count per key.
extern "C" __global__ void attention_chunk_grads_DT(
    const float* scores, const float* dprobs, ELEM* probs, ELEM* dscores, const float* lse,
    const float* delta, unsigned long long bh0, unsigned long long n, unsigned long long r0,
    unsigned long long rows, unsigned long long cols, unsigned long long tq,
    unsigned long long tk, unsigned int causal, float keep, float drop_scale,
    unsigned long long seed, unsigned long long offset) {
    unsigned long long groups = (cols + 3) / 4;
    unsigned int per_row = att_row_threads(groups);
    unsigned int rows_at_once = blockDim.x / per_row;
    unsigned int sub = threadIdx.x / per_row, first = threadIdx.x % per_row;
    if (sub >= rows_at_once) return;
    bool aligned = (cols % 4) == 0 &&
                   (((unsigned long long)scores | (unsigned long long)dprobs) & 15) == 0;
    for (unsigned long long r = blockIdx.x * (unsigned long long)rows_at_once + sub;
         r < n * rows; r += gridDim.x * (unsigned long long)rows_at_once) {
        unsigned long long bh = bh0 + r / rows, i = r0 + r % rows;
        unsigned long long visible = causal ? att_min(cols, i + 1) : cols;
        float row_lse = lse[bh * tq + i], row_delta = delta[bh * tq + i];
        const float* s = scores + r * cols;
        const float* dp = dprobs + r * cols;
        ELEM* pr = probs + r * cols;
        ELEM* ds = dscores + r * cols;
        for (unsigned long long g = first; g < groups; g += per_row) {
            unsigned long long j0 = 4 * g;
            if (j0 >= visible) {
                const float zero[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                att_store4(pr, j0, cols, zero);
                att_store4(ds, j0, cols, zero);
                continue;
            }
            float f[4];
            att_chunk_factors(f, bh, i, g, tq, tk, keep, drop_scale, seed, offset);
            float sv[4], dv[4];
            if (aligned) {
                float4 a = ((const float4*)s)[g], b = ((const float4*)dp)[g];
                sv[0] = a.x; sv[1] = a.y; sv[2] = a.z; sv[3] = a.w;
                dv[0] = b.x; dv[1] = b.y; dv[2] = b.z; dv[3] = b.w;
            } else {
                for (int c = 0; c < 4; c++) {
                    bool in = j0 + c < cols;
                    sv[c] = in ? s[j0 + c] : 0.0f;
                    dv[c] = in ? dp[j0 + c] : 0.0f;
                }
            }
            float pz[4], g2[4];
            for (int c = 0; c < 4; c++) {
                bool in = j0 + c < visible;
                float p = in ? expf(sv[c] - row_lse) : 0.0f;
                pz[c] = p * f[c];
                g2[c] = in ? p * (dv[c] * f[c] - row_delta) : 0.0f;
            }
            att_store4(pr, j0, cols, pz);
            att_store4(ds, j0, cols, g2);
        }
    }
}

// dst[bh0 + z, i, c] = src[(z * t + i) * d + c], narrowed: the float accumulators of the
// key and value gradients written into their [B, T, H, D] memory. Whole warps per row
// of d, the rows walked grid-stride: no thread divides per element.
extern "C" __global__ void attention_chunk_store_DT(
    const float* src, ELEM* dst, unsigned long long d_sb, unsigned long long d_sh,
    unsigned long long d_st, unsigned long long bh0, unsigned long long n,
    unsigned long long heads, unsigned long long t, unsigned int d) {
    unsigned int per_row = att_row_threads(d);
    unsigned int rows_at_once = blockDim.x / per_row;
    unsigned int sub = threadIdx.x / per_row, first = threadIdx.x % per_row;
    if (sub >= rows_at_once) return;
    for (unsigned long long row = blockIdx.x * (unsigned long long)rows_at_once + sub;
         row < n * t; row += gridDim.x * (unsigned long long)rows_at_once) {
        unsigned long long z = row / t, i = row % t;
        ELEM* out = dst + att_base(bh0 + z, heads, d_sb, d_sh) + i * d_st;
        const float* in = src + row * d;
        for (unsigned int c = first; c < d; c += per_row) out[c] = from_float(in[c]);
    }
}
