// The row kernels of a training step (softmax, layer norm, dropout, embedding, the
// negative log-likelihood, max over a row). Not compiled as it is: source.rs prepends
// the element type's helpers (ELEM, to_float, from_float) of kernels/dtypes.cu and
// renames every `NAME_DT(` to `NAME_<dtype>(`. The arguments follow `RowKernel::params`
// in labs/core/device/src/kernels/rows.rs; the twins are in labs/core/device/src/kernels/cpu_rows.rs.
//
// Row kernels give one warp to a row, in a grid-stride loop over warps: the launch's
// grid (rows * 32 threads, capped) covers any number of rows, every lane of a warp
// walks the same rows, so full-mask shuffles are safe. Sizes are 64-bit. Everything
// is computed in float whatever the element type.

#define GRID_STRIDE_LOOP(i, n)                                                        \
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x +         \
                                threadIdx.x;                                          \
         i < (n); i += (unsigned long long)gridDim.x * blockDim.x)

#define WARP_ROW_LOOP(r, rows)                                                        \
    unsigned long long warp_ =                                                        \
        (blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x) / 32;             \
    unsigned long long warps_ = (gridDim.x * (unsigned long long)blockDim.x) / 32;    \
    unsigned int lane = threadIdx.x % 32;                                             \
    for (unsigned long long r = warp_; r < (rows); r += warps_)

__device__ __forceinline__ float neg_inf() { return __uint_as_float(0xff800000u); }

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// A running maximum m and sum s of exp(x - m) (online softmax): folding in a value
// rescales the sum when the maximum grows. A -inf value adds nothing (and must not
// make exp(-inf - -inf) a NaN); a NaN makes the sum NaN, as it would the two-pass sum.
__device__ __forceinline__ void online_add(float& m, float& s, float v) {
    if (v > m) {
        s = s * expf(m - v) + 1.0f;
        m = v;
    } else if (v != neg_inf()) {
        s += expf(v - m);
    }
}

// The running (m, s) of a whole warp, merged lane by lane; a lane that saw nothing
// (or only -inf) has s = 0 and adds nothing.
__device__ __forceinline__ void warp_online(float& m, float& s) {
    for (int o = 16; o > 0; o /= 2) {
        float mo = __shfl_xor_sync(0xffffffffu, m, o);
        float so = __shfl_xor_sync(0xffffffffu, s, o);
        float mm = fmaxf(m, mo);
        float a = s == 0.0f ? 0.0f : s * expf(m - mm);
        float b = so == 0.0f ? 0.0f : so * expf(mo - mm);
        m = mm;
        s = a + b;
    }
}

// How the softmax kernels load and store the float32 side of a row: RowIo<false> is
// the module's ELEM (widened and narrowed), RowIo<true> is float as it is. The kernels
// that read half precision and write float32 (PyTorch's half_to_float, the autocast
// path of softmax and log_softmax) and their backward, which reads the float32 output
// and gradient and writes the input's dtype, are the same bodies with RowIo<true>.
template <bool WIDE> struct RowIo;
template <> struct RowIo<false> {
    typedef ELEM T;
    static __device__ __forceinline__ float load(const ELEM* p, unsigned long long i) {
        return to_float(p[i]);
    }
    static __device__ __forceinline__ void store(ELEM* p, unsigned long long i, float v) {
        p[i] = from_float(v);
    }
};
template <> struct RowIo<true> {
    typedef float T;
    static __device__ __forceinline__ float load(const float* p, unsigned long long i) {
        return p[i];
    }
    static __device__ __forceinline__ void store(float* p, unsigned long long i, float v) {
        p[i] = v;
    }
};

// softmax (log_ = 0) or log_softmax (log_ = 1) of each row, max-subtracted: one read
// of the row for its maximum and sum together (online), one more to write the output
// (a 50257-wide row of logits is read twice, not three times). Four independent loads
// per lane are in flight in each pass. The input is ELEM; the output is Y's type.
template <typename Y>
__device__ __forceinline__ void softmax_rows_body(const ELEM* __restrict__ x,
                                                  typename Y::T* __restrict__ y,
                                                  unsigned long long rows,
                                                  unsigned long long cols, unsigned int log_) {
    WARP_ROW_LOOP(r, rows) {
        const ELEM* xr = x + r * cols;
        typename Y::T* yr = y + r * cols;
        float m = neg_inf();
        float s = 0.0f;
        unsigned long long c = lane;
        for (; c + 96 < cols; c += 128) {
            float v0 = to_float(xr[c]);
            float v1 = to_float(xr[c + 32]);
            float v2 = to_float(xr[c + 64]);
            float v3 = to_float(xr[c + 96]);
            online_add(m, s, v0);
            online_add(m, s, v1);
            online_add(m, s, v2);
            online_add(m, s, v3);
        }
        for (; c < cols; c += 32) online_add(m, s, to_float(xr[c]));
        warp_online(m, s);
        // Every element -inf: the two-pass form's max is -inf and its outputs NaN.
        if (m == neg_inf()) s = __uint_as_float(0x7fc00000u);
        float ls = log_ ? logf(s) : 0.0f;
        float inv = 1.0f / s;
        c = lane;
        for (; c + 96 < cols; c += 128) {
            float v0 = to_float(xr[c]);
            float v1 = to_float(xr[c + 32]);
            float v2 = to_float(xr[c + 64]);
            float v3 = to_float(xr[c + 96]);
            if (log_) {
                Y::store(yr, c, v0 - m - ls);
                Y::store(yr, c + 32, v1 - m - ls);
                Y::store(yr, c + 64, v2 - m - ls);
                Y::store(yr, c + 96, v3 - m - ls);
            } else {
                Y::store(yr, c, expf(v0 - m) * inv);
                Y::store(yr, c + 32, expf(v1 - m) * inv);
                Y::store(yr, c + 64, expf(v2 - m) * inv);
                Y::store(yr, c + 96, expf(v3 - m) * inv);
            }
        }
        for (; c < cols; c += 32) {
            float v = to_float(xr[c]);
            Y::store(yr, c, log_ ? v - m - ls : expf(v - m) * inv);
        }
    }
}

extern "C" __global__ void softmax_rows_DT(const ELEM* __restrict__ x, ELEM* __restrict__ y,
                                           unsigned long long rows, unsigned long long cols,
                                           unsigned int log_) {
    softmax_rows_body<RowIo<false> >(x, y, rows, cols, log_);
}

// The same rows written in float32 (softmax(x, dtype=float32) of a half x, no float32
// copy of x).
extern "C" __global__ void softmax_rows_to_f32_DT(const ELEM* __restrict__ x,
                                                  float* __restrict__ y,
                                                  unsigned long long rows,
                                                  unsigned long long cols, unsigned int log_) {
    softmax_rows_body<RowIo<true> >(x, y, rows, cols, log_);
}

// From the saved output y: dx = y * (g - sum(g * y)), or for log_softmax
// dx = g - exp(y) * sum(g). One pass for the sum, one that reads y and g and writes
// dx; four independent loads per lane in flight in each. y and g are Y's type, dx is
// ELEM.
__device__ __forceinline__ float softmax_grad_term(float y, float g, unsigned int log_) {
    return log_ ? g : g * y;
}

__device__ __forceinline__ float softmax_grad(float y, float g, float s, unsigned int log_) {
    return log_ ? g - expf(y) * s : y * (g - s);
}

template <typename Y>
__device__ __forceinline__ void softmax_backward_body(const typename Y::T* __restrict__ y,
                                                      const typename Y::T* __restrict__ g,
                                                      ELEM* __restrict__ dx,
                                                      unsigned long long rows,
                                                      unsigned long long cols,
                                                      unsigned int log_) {
    WARP_ROW_LOOP(r, rows) {
        const typename Y::T* yr = y + r * cols;
        const typename Y::T* gr = g + r * cols;
        ELEM* dr = dx + r * cols;
        float s = 0.0f;
        unsigned long long c = lane;
        if (log_) {
            float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
            for (; c + 96 < cols; c += 128) {
                s0 += Y::load(gr, c);
                s1 += Y::load(gr, c + 32);
                s2 += Y::load(gr, c + 64);
                s3 += Y::load(gr, c + 96);
            }
            s = (s0 + s1) + (s2 + s3);
        }
        for (; c < cols; c += 32) s += softmax_grad_term(Y::load(yr, c), Y::load(gr, c), log_);
        s = warp_sum(s);
        c = lane;
        for (; c + 96 < cols; c += 128) {
            float y0 = Y::load(yr, c), g0 = Y::load(gr, c);
            float y1 = Y::load(yr, c + 32), g1 = Y::load(gr, c + 32);
            float y2 = Y::load(yr, c + 64), g2 = Y::load(gr, c + 64);
            float y3 = Y::load(yr, c + 96), g3 = Y::load(gr, c + 96);
            dr[c] = from_float(softmax_grad(y0, g0, s, log_));
            dr[c + 32] = from_float(softmax_grad(y1, g1, s, log_));
            dr[c + 64] = from_float(softmax_grad(y2, g2, s, log_));
            dr[c + 96] = from_float(softmax_grad(y3, g3, s, log_));
        }
        for (; c < cols; c += 32)
            dr[c] = from_float(softmax_grad(Y::load(yr, c), Y::load(gr, c), s, log_));
    }
}

extern "C" __global__ void softmax_backward_DT(const ELEM* __restrict__ y,
                                               const ELEM* __restrict__ g,
                                               ELEM* __restrict__ dx,
                                               unsigned long long rows,
                                               unsigned long long cols, unsigned int log_) {
    softmax_backward_body<RowIo<false> >(y, g, dx, rows, cols, log_);
}

// The backward of softmax_rows_to_f32: the float32 output and gradient in, the
// gradient written once in the input's dtype (no float32 gradient, no cast).
extern "C" __global__ void softmax_backward_from_f32_DT(const float* __restrict__ y,
                                                        const float* __restrict__ g,
                                                        ELEM* __restrict__ dx,
                                                        unsigned long long rows,
                                                        unsigned long long cols,
                                                        unsigned int log_) {
    softmax_backward_body<RowIo<true> >(y, g, dx, rows, cols, log_);
}

// y = (x - mean) * rstd * w + b per row (w, b may be null); mean and rstd (float) per row,
// the variance biased and computed from the mean (two passes).
extern "C" __global__ void layer_norm_DT(const ELEM* x, const ELEM* w, const ELEM* b, ELEM* y,
                                         float* mean, float* rstd, unsigned long long rows,
                                         unsigned long long cols, float eps) {
    WARP_ROW_LOOP(r, rows) {
        const ELEM* xr = x + r * cols;
        ELEM* yr = y + r * cols;
        float s = 0.0f;
        for (unsigned long long c = lane; c < cols; c += 32) s += to_float(xr[c]);
        float mu = warp_sum(s) / (float)cols;
        float v = 0.0f;
        for (unsigned long long c = lane; c < cols; c += 32) {
            float d = to_float(xr[c]) - mu;
            v += d * d;
        }
        float rs = 1.0f / sqrtf(warp_sum(v) / (float)cols + eps);
        if (lane == 0) {
            mean[r] = mu;
            rstd[r] = rs;
        }
        for (unsigned long long c = lane; c < cols; c += 32) {
            float o = (to_float(xr[c]) - mu) * rs;
            if (w) o = o * to_float(w[c]);
            if (b) o = o + to_float(b[c]);
            yr[c] = from_float(o);
        }
    }
}

// dx = rstd * (gw - mean(gw) - xhat * mean(gw * xhat)), gw = g * w, xhat = (x - mean) * rstd.
extern "C" __global__ void layer_norm_backward_DT(const ELEM* x, const ELEM* w, const ELEM* g,
                                                  const float* mean, const float* rstd,
                                                  ELEM* dx, unsigned long long rows,
                                                  unsigned long long cols) {
    WARP_ROW_LOOP(r, rows) {
        const ELEM* xr = x + r * cols;
        const ELEM* gr = g + r * cols;
        ELEM* dr = dx + r * cols;
        float mu = mean[r];
        float rs = rstd[r];
        float a = 0.0f, bsum = 0.0f;
        for (unsigned long long c = lane; c < cols; c += 32) {
            float gw = to_float(gr[c]) * (w ? to_float(w[c]) : 1.0f);
            float xhat = (to_float(xr[c]) - mu) * rs;
            a += gw;
            bsum += gw * xhat;
        }
        a = warp_sum(a) / (float)cols;
        bsum = warp_sum(bsum) / (float)cols;
        for (unsigned long long c = lane; c < cols; c += 32) {
            float gw = to_float(gr[c]) * (w ? to_float(w[c]) : 1.0f);
            float xhat = (to_float(xr[c]) - mu) * rs;
            dr[c] = from_float(rs * (gw - a - xhat * bsum));
        }
    }
}

// First pass of dw[c] = sum_r g[r, c] * xhat[r, c] and db[c] = sum_r g[r, c]: thread
// (k, c) sums the rows of span k in order into partial[0][k][c] and partial[1][k][c].
extern "C" __global__ void layer_norm_param_grads_DT(const ELEM* x, const ELEM* g,
                                                     const float* mean, const float* rstd,
                                                     float* partial, unsigned long long rows,
                                                     unsigned long long cols,
                                                     unsigned long long chunks) {
    unsigned long long span = (rows + chunks - 1) / chunks;
    GRID_STRIDE_LOOP(i, chunks * cols) {
        unsigned long long k = i / cols, c = i % cols;
        unsigned long long begin = k * span;
        unsigned long long end = begin + span < rows ? begin + span : rows;
        float sw = 0.0f, sb = 0.0f;
        for (unsigned long long r = begin; r < end; ++r) {
            float gv = to_float(g[r * cols + c]);
            sw += gv * ((to_float(x[r * cols + c]) - mean[r]) * rstd[r]);
            sb += gv;
        }
        partial[i] = sw;
        partial[chunks * cols + i] = sb;
    }
}

// Second pass: dw[c], db[c] (either may be null) the sums of column c's partial sums.
extern "C" __global__ void layer_norm_param_finish_DT(const float* partial, ELEM* dw, ELEM* db,
                                                      unsigned long long cols,
                                                      unsigned long long chunks) {
    GRID_STRIDE_LOOP(c, cols) {
        float sw = 0.0f, sb = 0.0f;
        for (unsigned long long k = 0; k < chunks; ++k) {
            sw += partial[k * cols + c];
            sb += partial[chunks * cols + k * cols + c];
        }
        if (dw) dw[c] = from_float(sw);
        if (db) db[c] = from_float(sb);
    }
}

// Philox4x32-10 (Salmon et al., SC 2011), as philox4x32_10 in kernels/rows.rs.
__device__ __forceinline__ unsigned int philox_first_word(unsigned long long counter,
                                                          unsigned long long seed) {
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
    return c0;
}

// Keeps x[i] (times scale) when the uniform of counter offset + i is below keep.
extern "C" __global__ void dropout_DT(const ELEM* x, ELEM* y, unsigned char* mask,
                                      unsigned long long n, float keep, float scale,
                                      unsigned long long seed, unsigned long long offset) {
    GRID_STRIDE_LOOP(i, n) {
        unsigned int w = philox_first_word(offset + i, seed);
        float u = (float)(w >> 8) * (1.0f / 16777216.0f);
        unsigned char m = u < keep ? 1 : 0;
        mask[i] = m;
        y[i] = from_float(m ? to_float(x[i]) * scale : 0.0f);
    }
}

extern "C" __global__ void masked_scale_DT(const ELEM* x, const unsigned char* mask, ELEM* y,
                                           unsigned long long n, float scale) {
    GRID_STRIDE_LOOP(i, n) { y[i] = from_float(mask[i] ? to_float(x[i]) * scale : 0.0f); }
}

// out[j, :] = w[idx[j], :]; an index outside [0, vocab) gives zeros (no illegal access).
extern "C" __global__ void embedding_DT(const ELEM* w, const long long* idx, ELEM* out,
                                        unsigned long long n, unsigned long long dim,
                                        unsigned long long vocab) {
    GRID_STRIDE_LOOP(i, n * dim) {
        long long t = idx[i / dim];
        bool ok = t >= 0 && (unsigned long long)t < vocab;
        out[i] = ok ? w[(unsigned long long)t * dim + i % dim] : from_float(0.0f);
    }
}

// dw[idx[j], :] += g[j, :] into a zeroed float buffer; out-of-range indices are skipped.
extern "C" __global__ void embedding_backward_DT(const ELEM* g, const long long* idx,
                                                 float* dw, unsigned long long n,
                                                 unsigned long long dim,
                                                 unsigned long long vocab) {
    GRID_STRIDE_LOOP(i, n * dim) {
        long long t = idx[i / dim];
        if (t >= 0 && (unsigned long long)t < vocab)
            atomicAdd(dw + (unsigned long long)t * dim + i % dim, to_float(g[i]));
    }
}

extern "C" __global__ void narrow_f32_DT(const float* x, ELEM* y, unsigned long long n) {
    GRID_STRIDE_LOOP(i, n) { y[i] = from_float(x[i]); }
}

// One warp: out[0] = mean over counted rows of -logp[r, target[r]], count[0] = rows counted.
extern "C" __global__ void nll_loss_DT(const ELEM* logp, const long long* target, ELEM* out,
                                       float* count, unsigned long long rows,
                                       unsigned long long cols, long long ignore_index) {
    if (blockIdx.x != 0 || threadIdx.x >= 32) return;
    float s = 0.0f, k = 0.0f;
    for (unsigned long long r = threadIdx.x; r < rows; r += 32) {
        long long t = target[r];
        if (t != ignore_index && t >= 0 && (unsigned long long)t < cols) {
            s -= to_float(logp[r * cols + (unsigned long long)t]);
            k += 1.0f;
        }
    }
    s = warp_sum(s);
    k = warp_sum(k);
    if (threadIdx.x == 0) {
        out[0] = from_float(s / k);
        count[0] = k;
    }
}

extern "C" __global__ void nll_loss_backward_DT(const ELEM* g, const float* count,
                                                const long long* target, ELEM* dx,
                                                unsigned long long rows,
                                                unsigned long long cols,
                                                long long ignore_index) {
    GRID_STRIDE_LOOP(i, rows * cols) {
        long long t = target[i / cols];
        bool hit = t != ignore_index && t == (long long)(i % cols);
        dx[i] = from_float(hit ? -to_float(g[0]) / count[0] : 0.0f);
    }
}

// mse_loss's input gradient, as PyTorch's mse_backward: scale * (x - y) * g, scale = 2 / n.
extern "C" __global__ void mse_loss_backward_DT(const ELEM* g, const ELEM* x, const ELEM* y,
                                                ELEM* dx, unsigned long long n, float scale) {
    float gv = to_float(g[0]);
    GRID_STRIDE_LOOP(i, n) {
        dx[i] = from_float(scale * (to_float(x[i]) - to_float(y[i])) * gv);
    }
}

// a beats b: larger, or a NaN against a number.
__device__ __forceinline__ bool beats(float a, float b) { return a > b || (a != a && b == b); }

// The largest element of each row and its first column (NaN is the largest).
extern "C" __global__ void max_rows_DT(const ELEM* x, ELEM* values, long long* indices,
                                       unsigned long long rows, unsigned long long cols) {
    WARP_ROW_LOOP(r, rows) {
        const ELEM* xr = x + r * cols;
        float best = 0.0f;
        long long bi = -1;
        for (unsigned long long c = lane; c < cols; c += 32) {
            float v = to_float(xr[c]);
            if (bi < 0 || beats(v, best)) {
                best = v;
                bi = (long long)c;
            }
        }
        for (int o = 16; o > 0; o /= 2) {
            float ov = __shfl_xor_sync(0xffffffffu, best, o);
            long long oi = __shfl_xor_sync(0xffffffffu, bi, o);
            bool take = oi >= 0 && (bi < 0 || beats(ov, best) || (!beats(best, ov) && oi < bi));
            if (take) {
                best = ov;
                bi = oi;
            }
        }
        if (lane == 0) {
            values[r] = xr[bi];
            indices[r] = bi;
        }
    }
}

// out[r, idx[r]] = g[r] (out zeroed beforehand).
extern "C" __global__ void scatter_rows_DT(const ELEM* g, const long long* idx, ELEM* out,
                                           unsigned long long rows, unsigned long long cols) {
    GRID_STRIDE_LOOP(r, rows) { out[r * cols + (unsigned long long)idx[r]] = g[r]; }
}

// First pass of a split sum: warp w sums span w % chunks of row w / chunks.
extern "C" __global__ void sum_partials_DT(const ELEM* x, float* partial, unsigned long long rows,
                                           unsigned long long cols, unsigned long long chunks) {
    unsigned long long span = (cols + chunks - 1) / chunks;
    WARP_ROW_LOOP(w, rows * chunks) {
        unsigned long long r = w / chunks, k = w % chunks;
        unsigned long long begin = k * span;
        unsigned long long end = begin + span < cols ? begin + span : cols;
        const ELEM* xr = x + r * cols;
        float acc = 0.0f;
        for (unsigned long long c = begin + lane; c < end; c += 32) acc += to_float(xr[c]);
        acc = warp_sum(acc);
        if (lane == 0) partial[w] = acc;
    }
}

// Second pass: out[r] = alpha * the sum of row r's partial sums.
extern "C" __global__ void sum_finish_DT(const float* partial, ELEM* out, unsigned long long rows,
                                         unsigned long long chunks, float alpha) {
    WARP_ROW_LOOP(r, rows) {
        float acc = 0.0f;
        for (unsigned long long k = lane; k < chunks; k += 32) acc += partial[r * chunks + k];
        acc = warp_sum(acc);
        if (lane == 0) out[r] = from_float(alpha * acc);
    }
}
