// Causal softmax attention on the CPU in fp32, forward and backward (sb3_amago/nets/cpu_attention.py).
//
// Inputs are (..., L, D) contiguous float tensors; every leading index (batch x head) is one task of
// at::parallel_for. Within a task the queries go in blocks of BQ rows: a block's scores against every
// key it may see (rows x n, n = last row + 1) are computed whole, so the softmax is exact, not the
// running one of a flash kernel; the block then multiplies its probabilities by the values. Keys and
// values are transposed once per task so that a block's scores are products along the keys, vectorised
// across them. The backward recomputes a block's probabilities from the saved log-sum-exp and
// accumulates the key and value gradients of its task directly, so tasks never share a write.

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace {

using Vec = at::vec::Vectorized<float>;
constexpr int64_t BQ = 32;  // query rows per block

// out[r * ldo + c] = scale[r] * sum_{t < K} a[r * lda + t] * b[t * ldb + c], for r < rows, c < cols:
// a block's scores (a: queries, b: keys transposed) and its probabilities by the values (a: the
// probabilities, b: values). Four rows at a time share each load of b; columns go a vector at a time.
void small_gemm(const float* a, int64_t lda, const float* b, int64_t ldb, float* out, int64_t ldo, int64_t rows,
                int64_t K, int64_t cols, const float* scale) {
  const int64_t V = Vec::size();
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) {
    const float *a0 = a + r * lda, *a1 = a0 + lda, *a2 = a1 + lda, *a3 = a2 + lda;
    for (int64_t c = 0; c < cols; c += V) {
      const int64_t cnt = std::min(V, cols - c);
      Vec c0(0.f), c1(0.f), c2(0.f), c3(0.f);
      for (int64_t t = 0; t < K; ++t) {
        const Vec bt = Vec::loadu(b + t * ldb + c, cnt);
        c0 = at::vec::fmadd(Vec(a0[t]), bt, c0);
        c1 = at::vec::fmadd(Vec(a1[t]), bt, c1);
        c2 = at::vec::fmadd(Vec(a2[t]), bt, c2);
        c3 = at::vec::fmadd(Vec(a3[t]), bt, c3);
      }
      (c0 * Vec(scale[r])).store(out + r * ldo + c, cnt);
      (c1 * Vec(scale[r + 1])).store(out + (r + 1) * ldo + c, cnt);
      (c2 * Vec(scale[r + 2])).store(out + (r + 2) * ldo + c, cnt);
      (c3 * Vec(scale[r + 3])).store(out + (r + 3) * ldo + c, cnt);
    }
  }
  for (; r < rows; ++r) {
    for (int64_t c = 0; c < cols; c += V) {
      const int64_t cnt = std::min(V, cols - c);
      Vec c0(0.f);
      for (int64_t t = 0; t < K; ++t) c0 = at::vec::fmadd(Vec(a[r * lda + t]), Vec::loadu(b + t * ldb + c, cnt), c0);
      (c0 * Vec(scale[r])).store(out + r * ldo + c, cnt);
    }
  }
}

// acc[j, :] += scale * sum_{r < rows} w[r * L + j] * x[r, :], for j < n (x: (rows, D), acc: (n, D)).
void add_transposed_weights_by_rows(const float* w, const float* x, float* acc, int64_t rows, int64_t n, int64_t D,
                                    int64_t L, float scale) {
  const int64_t V = Vec::size();
  const Vec s(scale);
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    for (int64_t c = 0; c < D; c += V) {
      const int64_t cnt = std::min(V, D - c);
      Vec c0(0.f), c1(0.f), c2(0.f), c3(0.f);
      for (int64_t r = 0; r < rows; ++r) {
        const Vec xr = Vec::loadu(x + r * D + c, cnt);
        const float* wr = w + r * L + j;
        c0 = at::vec::fmadd(Vec(wr[0]), xr, c0);
        c1 = at::vec::fmadd(Vec(wr[1]), xr, c1);
        c2 = at::vec::fmadd(Vec(wr[2]), xr, c2);
        c3 = at::vec::fmadd(Vec(wr[3]), xr, c3);
      }
      float* a = acc + j * D + c;
      at::vec::fmadd(c0, s, Vec::loadu(a, cnt)).store(a, cnt);
      at::vec::fmadd(c1, s, Vec::loadu(a + D, cnt)).store(a + D, cnt);
      at::vec::fmadd(c2, s, Vec::loadu(a + 2 * D, cnt)).store(a + 2 * D, cnt);
      at::vec::fmadd(c3, s, Vec::loadu(a + 3 * D, cnt)).store(a + 3 * D, cnt);
    }
  }
  for (; j < n; ++j) {
    for (int64_t c = 0; c < D; c += V) {
      const int64_t cnt = std::min(V, D - c);
      Vec c0(0.f);
      for (int64_t r = 0; r < rows; ++r) c0 = at::vec::fmadd(Vec(w[r * L + j]), Vec::loadu(x + r * D + c, cnt), c0);
      float* a = acc + j * D + c;
      at::vec::fmadd(c0, s, Vec::loadu(a, cnt)).store(a, cnt);
    }
  }
}

// xt (D, L) = x (L, D) transposed.
void transpose(const float* x, float* xt, int64_t L, int64_t D) {
  for (int64_t j = 0; j < L; ++j)
    for (int64_t d = 0; d < D; ++d) xt[d * L + j] = x[j * D + d];
}

// Row r of a block whose first query is r0 sees keys 0..r0 + r; the block's later columns are zeroed.
int64_t visible(int64_t r0, int64_t r) { return r0 + r + 1; }

void check(const at::Tensor& x, const at::Tensor& like, const char* name) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat, name, " must be a float32 CPU tensor");
  TORCH_CHECK(x.sizes() == like.sizes(), name, " must have the queries' shape ", like.sizes(), ", got ", x.sizes());
}

}  // namespace

// (out, logsumexp): out (..., L, D), logsumexp (..., L) of each query's scaled scores.
std::vector<at::Tensor> causal_attention_forward(const at::Tensor& q_, const at::Tensor& k_, const at::Tensor& v_) {
  check(q_, q_, "q");
  check(k_, q_, "k");
  check(v_, q_, "v");
  const auto q = q_.contiguous(), k = k_.contiguous(), v = v_.contiguous();
  const int64_t L = q.size(-2), D = q.size(-1), tasks = L * D == 0 ? 0 : q.numel() / (L * D);
  auto out = at::empty_like(q, at::MemoryFormat::Contiguous);
  auto lse = at::empty(q.sizes().slice(0, q.dim() - 1), q.options());
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  const float *Q = q.data_ptr<float>(), *K = k.data_ptr<float>(), *Vv = v.data_ptr<float>();
  float *O = out.data_ptr<float>(), *LSE = lse.data_ptr<float>();
  at::parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> kt(D * L), p(BQ * L);
    const int64_t V = Vec::size();
    float scales[BQ];
    std::fill(scales, scales + BQ, scale);
    for (int64_t t = begin; t < end; ++t) {
      const int64_t base = t * L * D;
      transpose(K + base, kt.data(), L, D);
      for (int64_t r0 = 0; r0 < L; r0 += BQ) {
        const int64_t rows = std::min(BQ, L - r0), n = r0 + rows;
        small_gemm(Q + base + r0 * D, D, kt.data(), L, p.data(), L, rows, D, n, scales);  // scores
        float inv_sum[BQ];
        for (int64_t r = 0; r < rows; ++r) {
          float* pr = p.data() + r * L;
          const int64_t seen = visible(r0, r);
          Vec mv(-std::numeric_limits<float>::infinity());
          int64_t j = 0;
          for (; j + V <= seen; j += V) mv = at::vec::maximum(mv, Vec::loadu(pr + j));
          float m = at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return at::vec::maximum(a, b); }, mv);
          for (; j < seen; ++j) m = std::max(m, pr[j]);
          const Vec mb(m);
          Vec sv(0.f);
          for (j = 0; j < seen; j += V) {
            const int64_t cnt = std::min(V, seen - j);
            const Vec e = (Vec::loadu(pr + j, cnt) - mb).exp();
            e.store(pr + j, cnt);
            sv = sv + (cnt == V ? e : Vec::set(Vec(0.f), e, cnt));
          }
          std::fill(pr + seen, pr + n, 0.f);
          const float sum = at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return a + b; }, sv);
          LSE[t * L + r0 + r] = m + std::log(sum);
          inv_sum[r] = 1.f / sum;
        }
        small_gemm(p.data(), L, Vv + base, D, O + base + r0 * D, D, rows, n, D, inv_sum);
      }
    }
  });
  return {out, lse};
}

// (dq, dk, dv) from the output's gradient and the forward's inputs, output and logsumexp.
std::vector<at::Tensor> causal_attention_backward(const at::Tensor& grad_, const at::Tensor& q_, const at::Tensor& k_,
                                                  const at::Tensor& v_, const at::Tensor& out_, const at::Tensor& lse_) {
  check(q_, q_, "q");
  check(k_, q_, "k");
  check(v_, q_, "v");
  check(out_, q_, "out");
  check(grad_, q_, "grad");
  const auto grad = grad_.contiguous(), q = q_.contiguous(), k = k_.contiguous(), v = v_.contiguous(),
             out = out_.contiguous(), lse = lse_.contiguous();
  const int64_t L = q.size(-2), D = q.size(-1), tasks = L * D == 0 ? 0 : q.numel() / (L * D);
  TORCH_CHECK(lse.numel() == tasks * L && lse.scalar_type() == at::kFloat, "lse must be float32 with one value per query");
  auto dq = at::empty_like(q, at::MemoryFormat::Contiguous);
  auto dk = at::zeros_like(k, at::MemoryFormat::Contiguous), dv = at::zeros_like(v, at::MemoryFormat::Contiguous);
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  const float *Q = q.data_ptr<float>(), *K = k.data_ptr<float>(), *Vv = v.data_ptr<float>(), *G = grad.data_ptr<float>(),
              *O = out.data_ptr<float>(), *LSE = lse.data_ptr<float>();
  float *DQ = dq.data_ptr<float>(), *DK = dk.data_ptr<float>(), *DV = dv.data_ptr<float>();
  at::parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> kt(D * L), vt(D * L), p(BQ * L), ds(BQ * L);
    const int64_t V = Vec::size();
    float scales[BQ], ones[BQ];
    std::fill(scales, scales + BQ, scale);
    std::fill(ones, ones + BQ, 1.f);
    for (int64_t t = begin; t < end; ++t) {
      const int64_t base = t * L * D;
      transpose(K + base, kt.data(), L, D);
      transpose(Vv + base, vt.data(), L, D);
      for (int64_t r0 = 0; r0 < L; r0 += BQ) {
        const int64_t rows = std::min(BQ, L - r0), n = r0 + rows;
        small_gemm(Q + base + r0 * D, D, kt.data(), L, p.data(), L, rows, D, n, scales);  // scores
        small_gemm(G + base + r0 * D, D, vt.data(), L, ds.data(), L, rows, D, n, ones);  // grad of probabilities
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t i = r0 + r, seen = visible(r0, r);
          float *pr = p.data() + r * L, *dsr = ds.data() + r * L;
          float dot = 0.f;  // sum_d grad[i, d] * out[i, d]
          for (int64_t d = 0; d < D; ++d) dot += G[base + i * D + d] * O[base + i * D + d];
          const Vec lb(LSE[t * L + i]), db(dot);
          for (int64_t j = 0; j < seen; j += V) {
            const int64_t cnt = std::min(V, seen - j);
            const Vec prob = (Vec::loadu(pr + j, cnt) - lb).exp();
            prob.store(pr + j, cnt);
            (prob * (Vec::loadu(dsr + j, cnt) - db)).store(dsr + j, cnt);  // grad of the scaled scores
          }
          std::fill(pr + seen, pr + n, 0.f);
          std::fill(dsr + seen, dsr + n, 0.f);
        }
        small_gemm(ds.data(), L, K + base, D, DQ + base + r0 * D, D, rows, n, D, scales);
        add_transposed_weights_by_rows(p.data(), G + base + r0 * D, DV + base, rows, n, D, L, 1.f);
        add_transposed_weights_by_rows(ds.data(), Q + base + r0 * D, DK + base, rows, n, D, L, scale);
      }
    }
  });
  return {dq, dk, dv};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &causal_attention_forward, "causal attention: (out, logsumexp)");
  m.def("backward", &causal_attention_backward, "causal attention's gradients: (dq, dk, dv)");
}
