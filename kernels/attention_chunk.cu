// The row kernels of chunked attention: attention as matrix products (cuBLAS, tensor
// cores) over a chunk of query rows at a time, these kernels between the products.
// Not compiled as it is: source.rs appends it to kernels/attention.cu in each dtype's
// attention module (it uses that file's att_* helpers) and renames every `NAME_DT(` to
// `NAME_<dtype>(`. The arguments follow `AttentionChunkKernel::params` in
// labs/core/src/kernels/attention_chunk.rs; the twins are in attention_chunk_cpu.rs.
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

// lse[bh * tq + i] = log(sum over visible j of exp(s_ij)) and
// probs_ij = exp(s_ij - lse) * Z_ij / keep (0 where masked), one warp per row. The rows
// are walked warp by warp (grid-stride), so every lane of a warp takes the same rows and
// the shuffles see all 32.
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
        float m = att_neg_inf();
        for (unsigned long long j = lane; j < visible; j += 32) m = fmaxf(m, s[j]);
        m = att_warp_max(m);
        float l = 0.0f;
        for (unsigned long long j = lane; j < visible; j += 32) l += expf(s[j] - m);
        l = att_warp_sum(l);
        float row_lse = m + logf(l);
        if (lane == 0) lse[bh * tq + i] = row_lse;
        // Four keys (one Philox block) per lane and step.
        for (unsigned long long g = lane; g < (cols + 3) / 4; g += 32) {
            float f[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            if (4 * g < visible)
                att_chunk_factors(f, bh, i, g, tq, tk, keep, drop_scale, seed, offset);
            for (int c = 0; c < 4; c++) {
                unsigned long long j = 4 * g + c;
                if (j < cols) p[j] = from_float(j < visible ? expf(s[j] - row_lse) * f[c] : 0.0f);
            }
        }
    }
}

// probs_ij = p Z / keep and dscores_ij = p (dprobs_ij Z / keep - delta_i) with
// p = exp(s_ij - lse_i), 0 where masked: one thread per four keys of a row.
extern "C" __global__ void attention_chunk_grads_DT(
    const float* scores, const float* dprobs, ELEM* probs, ELEM* dscores, const float* lse,
    const float* delta, unsigned long long bh0, unsigned long long n, unsigned long long r0,
    unsigned long long rows, unsigned long long cols, unsigned long long tq,
    unsigned long long tk, unsigned int causal, float keep, float drop_scale,
    unsigned long long seed, unsigned long long offset) {
    unsigned long long groups = (cols + 3) / 4;
    unsigned long long total = n * rows * groups;
    unsigned long long stride = gridDim.x * (unsigned long long)blockDim.x;
    for (unsigned long long t = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
         t < total; t += stride) {
        unsigned long long r = t / groups, g = t % groups;
        unsigned long long bh = bh0 + r / rows, i = r0 + r % rows;
        unsigned long long visible = causal ? att_min(cols, i + 1) : cols;
        float f[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        float row_lse = 0.0f, row_delta = 0.0f;
        if (4 * g < visible) {
            att_chunk_factors(f, bh, i, g, tq, tk, keep, drop_scale, seed, offset);
            row_lse = lse[bh * tq + i];
            row_delta = delta[bh * tq + i];
        }
        for (int c = 0; c < 4; c++) {
            unsigned long long j = 4 * g + c;
            if (j >= cols) break;
            unsigned long long e = r * cols + j;
            float pz = 0.0f, ds = 0.0f;
            if (j < visible) {
                float p = expf(scores[e] - row_lse);
                pz = p * f[c];
                ds = p * (dprobs[e] * f[c] - row_delta);
            }
            probs[e] = from_float(pz);
            dscores[e] = from_float(ds);
        }
    }
}

// dst[bh0 + z, i, c] = src[(z * t + i) * d + c], narrowed: the float accumulators of the
// key and value gradients written into their [B, T, H, D] memory.
extern "C" __global__ void attention_chunk_store_DT(
    const float* src, ELEM* dst, unsigned long long d_sb, unsigned long long d_sh,
    unsigned long long d_st, unsigned long long bh0, unsigned long long n,
    unsigned long long heads, unsigned long long t, unsigned int d) {
    unsigned long long total = n * t * d;
    unsigned long long stride = gridDim.x * (unsigned long long)blockDim.x;
    for (unsigned long long e = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
         e < total; e += stride) {
        unsigned long long c = e % d, row = e / d;
        unsigned long long z = row / t, i = row % t;
        dst[att_base(bh0 + z, heads, d_sb, d_sh) + i * d_st + c] = from_float(src[e]);
    }
}
