// Causal softmax attention on the CPU in fp32, forward and backward (sb3_amago/nets/cpu_attention.py).
//
// The input is the projection (B, L, 3, H, D) of queries, keys and values, at any strides with D
// contiguous; every (batch, head) pair is one task of at::parallel_for, reading its rows where they lie.
// The output is written in (B, L, H, D) order (the layout the output projection reads, so no transpose
// follows), and the backward reads the output's gradient at its strides and returns the projection's
// gradient whole, (B, L, 3, H, D) contiguous: no stack of three gradients follows either.
// Rotary tables (cosines and signed sines, broadcastable to the queries' shape; empty: none) turn the
// queries and keys as they are read, and the backward turns their gradients back, so the rotation
// costs no pass of its own. Within a task the queries go in blocks of BQ rows: a block's scores
// against every key it may see (rows x n, n = last row + 1) are computed whole, so the softmax is
// exact, not the running one of a flash kernel; the block then multiplies its probabilities by the values. Keys and
// values are transposed once per task so that a block's scores are products along the keys, vectorised
// across them; rows are padded to whole vectors, and all five products of the two passes run on one
// register-tiled routine (product). The backward recomputes a block's probabilities from the saved
// log-sum-exp and accumulates the key and value gradients of its task directly, so tasks never share
// a write.

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

namespace {

using Vec = at::vec::Vectorized<float>;
constexpr int64_t BQ = 32;                // query rows per block
constexpr int64_t VS = Vec::size();       // floats per vector
constexpr int TR = VS == 16 ? 8 : 4;      // rows of a register tile: 16 accumulators of AVX-512's 32
constexpr int TC = 2;                     // registers, 8 of AVX2's 16; columns of a tile, in vectors
// Rows a task's gather asks the memory for ahead of the one it reads: a projection's rows lie
// 3 * H * D floats apart, beyond what the hardware prefetcher follows (+5% forward, +2% backward at L = 257).
constexpr int64_t PREFETCH_ROWS = 8;

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// One product out = diag(scale) A B (or out += diag(scale) A B): A's element (r, t) is
// a[r * ars + t * aks] (a matrix or a transposed one), B's (t, c) is b[t * ldb + c], out's (r, c) is
// out[r * ldo + c], and row r's scale is scale[r].
struct Product {
  const float* a;
  int64_t ars, aks;
  const float* b;
  int64_t ldb;
  float* out;
  int64_t ldo;
  const float* scale;
};

// Rows r..r + R and the C vectors of columns from c, over t < K: each load of B serves R rows and each
// element of A C vectors, in R x C accumulators (enough to keep the multiply-add units busy).
template <int R, int C, bool Accumulate>
inline void tile(const Product& m, int64_t r, int64_t c, int64_t K) {
  Vec acc[R][C];
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 2
    for (int j = 0; j < C; ++j) acc[i][j] = Vec(0.f);
  const float* a = m.a + r * m.ars;
  for (int64_t t = 0; t < K; ++t) {
    Vec bt[C];
#pragma GCC unroll 2
    for (int j = 0; j < C; ++j) bt[j] = Vec::loadu(m.b + t * m.ldb + c + j * VS);
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) {
      const Vec ai(a[i * m.ars + t * m.aks]);
#pragma GCC unroll 2
      for (int j = 0; j < C; ++j) acc[i][j] = at::vec::fmadd(ai, bt[j], acc[i][j]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i) {
    const Vec s(m.scale[r + i]);
#pragma GCC unroll 2
    for (int j = 0; j < C; ++j) {
      float* o = m.out + (r + i) * m.ldo + c + j * VS;
      (Accumulate ? at::vec::fmadd(acc[i][j], s, Vec::loadu(o)) : acc[i][j] * s).store(o);
    }
  }
}

template <int C, bool Accumulate>
void tile_rows(const Product& m, int64_t rows, int64_t c, int64_t K) {
  int64_t r = 0;
  for (; r + TR <= rows; r += TR) tile<TR, C, Accumulate>(m, r, c, K);
  for (; r < rows; ++r) tile<1, C, Accumulate>(m, r, c, K);
}

// The product over rows x cols; columns past the last whole vector (a head width that is not a
// multiple of the vector) go a row at a time with partial loads.
template <bool Accumulate>
void product(const Product& m, int64_t rows, int64_t K, int64_t cols) {
  const int64_t whole = cols / VS * VS;
  int64_t c = 0;
  for (; c + TC * VS <= whole; c += TC * VS) tile_rows<TC, Accumulate>(m, rows, c, K);
  for (; c < whole; c += VS) tile_rows<1, Accumulate>(m, rows, c, K);
  if (c == cols) return;
  const int64_t cnt = cols - c;
  for (int64_t r = 0; r < rows; ++r) {
    Vec acc(0.f);
    for (int64_t t = 0; t < K; ++t)
      acc = at::vec::fmadd(Vec(m.a[r * m.ars + t * m.aks]), Vec::loadu(m.b + t * m.ldb + c, cnt), acc);
    float* o = m.out + r * m.ldo + c;
    const Vec s(m.scale[r]);
    (Accumulate ? at::vec::fmadd(acc, s, Vec::loadu(o, cnt)) : acc * s).store(o, cnt);
  }
}

// One task's rows of a (..., L, D) tensor: row j starts at data + j * row_stride, its elements contiguous
// (inputs are read through it, outputs written).
struct Rows {
  float* data;
  int64_t row_stride;
  float* row(int64_t j) const { return data + j * row_stride; }
};

// Where each task's rows start in a (..., L, D) tensor with a contiguous last axis, and their stride.
struct TaskRows {
  float* data;
  int64_t row_stride;
  std::vector<int64_t> offsets;
  TaskRows(const at::Tensor& x, int64_t tasks) : data(x.data_ptr<float>()), row_stride(x.stride(-2)), offsets(tasks) {
    const int64_t lead = x.dim() - 2;
    for (int64_t t = 0; t < tasks; ++t) {
      int64_t rest = t, offset = 0;
      for (int64_t a = lead - 1; a >= 0; --a) {
        offset += rest % x.size(a) * x.stride(a);
        rest /= x.size(a);
      }
      offsets[t] = offset;
    }
  }
  Rows task(int64_t t) const { return {data + offsets[t], row_stride}; }
};

// The rotary tables of a task, or none (cos.data == nullptr).
struct Rotation {
  Rows cos, sin;
  bool on() const { return cos.data != nullptr; }
};

// The rotation rounds each product before the sum, as torch's operators (and inductor's code, built
// with -ffp-contract=off) do: GCC would otherwise fuse them into one multiply-add in C++.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#endif

// y = x cos + swap(x) sin over one row, swap exchanging the row's halves (the tables' signed sines
// make this the rotation of each feature pair): the values of the same expression in torch. One
// loop per half, without a branch, so that the compiler vectorises them.
void rotate(const float* x, const float* cos, const float* sin, float* y, int64_t D) {
#ifdef __clang__
#pragma clang fp contract(off)
#endif
  const int64_t h = D / 2;
  for (int64_t d = 0; d < h; ++d) y[d] = x[d] * cos[d] + x[d + h] * sin[d];
  for (int64_t d = h; d < D; ++d) y[d] = x[d] * cos[d] + x[d - h] * sin[d];
}

// The gradient of x from the gradient g of rotate's y, in place: g cos + swap(g sin); gs holds D floats.
void rotate_back(float* g, const float* cos, const float* sin, float* gs, int64_t D) {
#ifdef __clang__
#pragma clang fp contract(off)
#endif
  const int64_t h = D / 2;
  for (int64_t d = 0; d < D; ++d) gs[d] = g[d] * sin[d];
  for (int64_t d = 0; d < h; ++d) g[d] = g[d] * cos[d] + gs[d + h];
  for (int64_t d = h; d < D; ++d) g[d] = g[d] * cos[d] + gs[d - h];
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif

// out (L, D) contiguous = the task's rows, turned by rot where it is on.
void gather_rows(Rows x, const Rotation& rot, float* out, int64_t L, int64_t D) {
  for (int64_t j = 0; j < L; ++j) {
    __builtin_prefetch(x.row(std::min(j + PREFETCH_ROWS, L - 1)));
    if (rot.on())
      rotate(x.row(j), rot.cos.row(j), rot.sin.row(j), out + j * D, D);
    else
      std::copy(x.row(j), x.row(j) + D, out + j * D);
  }
}

// xt (D, ld) = x's L rows of D transposed; columns L..ld of xt are left as they are (zero).
void transpose(Rows x, float* xt, int64_t L, int64_t D, int64_t ld) {
  for (int64_t j = 0; j < L; ++j)
    for (int64_t d = 0; d < D; ++d) xt[d * ld + j] = x.row(j)[d];
}

// Row r of a block whose first query is r0 sees keys 0..r0 + r.
int64_t visible(int64_t r0, int64_t r) { return r0 + r + 1; }

void check(const at::Tensor& x, const at::Tensor& like, const char* name) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat, name, " must be a float32 CPU tensor");
  TORCH_CHECK(x.sizes() == like.sizes(), name, " must have the queries' shape ", like.sizes(), ", got ", x.sizes());
}

// x itself where its last axis is contiguous (strides elsewhere are read as they are), else a contiguous copy.
at::Tensor rows_contiguous(const at::Tensor& x) { return x.stride(-1) == 1 ? x : x.contiguous(); }

// Queries, keys and values (B, H, L, D): views of the projection (B, L, 3, H, D), checked, rows made
// contiguous where they are not.
std::vector<at::Tensor> split_projection(const at::Tensor& qkv) {
  TORCH_CHECK(qkv.device().is_cpu() && qkv.scalar_type() == at::kFloat, "qkv must be a float32 CPU tensor");
  TORCH_CHECK(qkv.dim() == 5 && qkv.size(2) == 3, "qkv must be a (B, L, 3, H, D) projection, got ", qkv.sizes());
  const auto x = rows_contiguous(qkv);
  return {x.select(2, 0).transpose(1, 2), x.select(2, 1).transpose(1, 2), x.select(2, 2).transpose(1, 2)};
}

// The rotary tables broadcast to the queries' shape, checked; undefined tensors where both are empty
// (no rotation).
std::pair<at::Tensor, at::Tensor> tables(const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& q) {
  TORCH_CHECK((cos.numel() == 0) == (sin.numel() == 0), "give both rotary tables (cos and sin), or both empty");
  if (cos.numel() == 0) return {at::Tensor(), at::Tensor()};
  TORCH_CHECK(q.size(-1) % 2 == 0, "rotary tables need an even head width, got ", q.size(-1));
  auto c = cos.expand(q.sizes()), s = sin.expand(q.sizes());
  check(c, q, "cos");
  check(s, q, "sin");
  return {rows_contiguous(c), rows_contiguous(s)};
}

// The rotation of task t: its rows of the tables, or none.
struct Tables {
  std::unique_ptr<TaskRows> cos, sin;
  Tables(const at::Tensor& c, const at::Tensor& s, int64_t tasks) {
    if (c.defined()) {
      cos = std::make_unique<TaskRows>(c, tasks);
      sin = std::make_unique<TaskRows>(s, tasks);
    }
  }
  Rotation task(int64_t t) const {
    if (!cos) return {{nullptr, 0}, {nullptr, 0}};
    return {cos->task(t), sin->task(t)};
  }
};

// Per-task buffers: rows of ld = L rounded up to whole vectors, so that every product and softmax
// pass over a block's scores runs on whole vectors; the keys (and values) transposed, zero past L;
// the queries (and keys) gathered contiguous, turned where there are rotary tables.
struct Buffers {
  int64_t ld;
  std::vector<float> qr, kr, kt, vt, p, ds, scales, ones, scratch;
  Buffers(int64_t L, int64_t D, float scale, bool backward)
      : ld(round_up(L, VS)),
        qr(L * D),
        kr(L * D),
        kt(D * ld, 0.f),
        vt(backward ? D * ld : 0, 0.f),
        p(BQ * ld),
        ds(backward ? BQ * ld : 0),
        scales(std::max(L, BQ), scale),
        ones(backward ? std::max(L, BQ) : 0, 1.f),
        scratch(D) {}
};

// Sets the scores of a block row past the keys it sees (up to the row's whole vectors) to -inf, whose
// probability is then exactly 0.
void mask_future(float* row, int64_t seen, int64_t width) {
  std::fill(row + seen, row + width, -std::numeric_limits<float>::infinity());
}

}  // namespace

// (out, logsumexp) of the projection qkv (B, L, 3, H, D): out (B, H, L, D) laid out as (B, L, H, D),
// logsumexp (B, H, L) of each query's scaled scores; the queries and keys turned by the rotary tables
// cos and sin unless both are empty.
std::vector<at::Tensor> causal_attention_forward(const at::Tensor& qkv, const at::Tensor& cos_, const at::Tensor& sin_) {
  const auto views = split_projection(qkv);
  const auto &q = views[0], &k = views[1], &v = views[2];
  const auto [cos, sin] = tables(cos_, sin_, q);
  const int64_t L = q.size(-2), D = q.size(-1), tasks = L * D == 0 ? 0 : q.numel() / (L * D);
  auto out = at::empty({q.size(0), L, q.size(1), D}, q.options()).transpose(1, 2);
  auto lse = at::empty(q.sizes().slice(0, q.dim() - 1), q.options());
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  const TaskRows Q(q, tasks), K(k, tasks), V(v, tasks), OUT(out, tasks);
  const Tables rot(cos, sin, tasks);
  float* LSE = lse.data_ptr<float>();
  at::parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
    Buffers buf(L, D, scale, false);
    const int64_t ld = buf.ld;
    float *P = buf.p.data(), *Qr = buf.qr.data();
    for (int64_t t = begin; t < end; ++t) {
      const Rows vt = V.task(t), ot = OUT.task(t);
      const Rotation turn = rot.task(t);
      gather_rows(Q.task(t), turn, Qr, L, D);
      gather_rows(K.task(t), turn, buf.kr.data(), L, D);
      transpose({buf.kr.data(), D}, buf.kt.data(), L, D, ld);
      for (int64_t r0 = 0; r0 < L; r0 += BQ) {
        const int64_t rows = std::min(BQ, L - r0), n = r0 + rows, width = round_up(n, VS);
        product<false>({Qr + r0 * D, D, 1, buf.kt.data(), ld, P, ld, buf.scales.data()}, rows, D, width);
        float inv_sum[BQ];
        for (int64_t r = 0; r < rows; ++r) {
          float* pr = P + r * ld;
          mask_future(pr, visible(r0, r), width);
          Vec mv(-std::numeric_limits<float>::infinity());
          for (int64_t j = 0; j < width; j += VS) mv = at::vec::maximum(mv, Vec::loadu(pr + j));
          const float m = at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return at::vec::maximum(a, b); }, mv);
          const Vec mb(m);
          Vec sv(0.f);
          for (int64_t j = 0; j < width; j += VS) {
            const Vec e = (Vec::loadu(pr + j) - mb).exp();
            e.store(pr + j);
            sv = sv + e;
          }
          const float sum = at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return a + b; }, sv);
          LSE[t * L + r0 + r] = m + std::log(sum);
          inv_sum[r] = 1.f / sum;
        }
        // probabilities by values
        product<false>({P, ld, 1, vt.data, vt.row_stride, ot.row(r0), ot.row_stride, inv_sum}, rows, n, D);
      }
    }
  });
  return {out, lse};
}

// The projection's gradient (B, L, 3, H, D), contiguous, from the output's gradient (B, H, L, D), the
// forward's projection, tables, output and logsumexp: the gradient of the projection as given (before
// the rotation of its queries and keys).
at::Tensor causal_attention_backward(const at::Tensor& grad_, const at::Tensor& qkv, const at::Tensor& cos_,
                                     const at::Tensor& sin_, const at::Tensor& out_, const at::Tensor& lse_) {
  const auto views = split_projection(qkv);
  const auto &q = views[0], &k = views[1], &v = views[2];
  check(out_, q, "out");
  check(grad_, q, "grad");
  const auto grad = rows_contiguous(grad_), out = rows_contiguous(out_), lse = lse_.contiguous();
  const auto [cos, sin] = tables(cos_, sin_, q);
  const int64_t L = q.size(-2), D = q.size(-1), tasks = L * D == 0 ? 0 : q.numel() / (L * D);
  TORCH_CHECK(lse.numel() == tasks * L && lse.scalar_type() == at::kFloat, "lse must be float32 with one value per query");
  auto dqkv = at::empty(qkv.sizes(), qkv.options().memory_format(at::MemoryFormat::Contiguous));
  const auto dq = dqkv.select(2, 0).transpose(1, 2), dk = dqkv.select(2, 1).transpose(1, 2), dv = dqkv.select(2, 2).transpose(1, 2);
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  const TaskRows Q(q, tasks), K(k, tasks), V(v, tasks), GRAD(grad, tasks), OUT(out, tasks);
  const TaskRows DQ(dq, tasks), DK(dk, tasks), DV(dv, tasks);
  const Tables rot(cos, sin, tasks);
  const float* LSE = lse.data_ptr<float>();
  at::parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
    Buffers buf(L, D, scale, true);
    const int64_t ld = buf.ld;
    float *P = buf.p.data(), *DS = buf.ds.data(), *Qr = buf.qr.data(), *Kr = buf.kr.data();
    const float *scales = buf.scales.data(), *ones = buf.ones.data();
    for (int64_t t = begin; t < end; ++t) {
      const Rows gt = GRAD.task(t), ot = OUT.task(t), dqt = DQ.task(t), dkt = DK.task(t), dvt = DV.task(t);
      for (int64_t j = 0; j < L; ++j) {  // the key and value gradients accumulate over the query blocks
        std::fill(dkt.row(j), dkt.row(j) + D, 0.f);
        std::fill(dvt.row(j), dvt.row(j) + D, 0.f);
      }
      const Rotation turn = rot.task(t);
      gather_rows(Q.task(t), turn, Qr, L, D);
      gather_rows(K.task(t), turn, Kr, L, D);
      transpose({Kr, D}, buf.kt.data(), L, D, ld);
      transpose(V.task(t), buf.vt.data(), L, D, ld);
      for (int64_t r0 = 0; r0 < L; r0 += BQ) {
        const int64_t rows = std::min(BQ, L - r0), n = r0 + rows, width = round_up(n, VS);
        const float *Qb = Qr + r0 * D, *Gb = gt.row(r0);
        const int64_t lg = gt.row_stride;
        product<false>({Qb, D, 1, buf.kt.data(), ld, P, ld, scales}, rows, D, width);  // scores
        product<false>({Gb, lg, 1, buf.vt.data(), ld, DS, ld, ones}, rows, D, width);  // grad of probabilities
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t i = r0 + r;
          float *pr = P + r * ld, *dsr = DS + r * ld;
          mask_future(pr, visible(r0, r), width);
          float dot = 0.f;  // sum_d grad[i, d] * out[i, d]
          for (int64_t d = 0; d < D; ++d) dot += gt.row(i)[d] * ot.row(i)[d];
          const Vec lb(LSE[t * L + i]), db(dot);
          for (int64_t j = 0; j < width; j += VS) {
            const Vec prob = (Vec::loadu(pr + j) - lb).exp();
            prob.store(pr + j);
            (prob * (Vec::loadu(dsr + j) - db)).store(dsr + j);  // grad of the scaled scores
          }
        }
        product<false>({DS, ld, 1, Kr, D, dqt.row(r0), dqt.row_stride, scales}, rows, n, D);
        product<true>({P, 1, ld, Gb, lg, dvt.data, dvt.row_stride, ones}, n, rows, D);     // dv += p^T grad
        product<true>({DS, 1, ld, Qb, D, dkt.data, dkt.row_stride, scales}, n, rows, D);  // dk += scale ds^T q
        if (turn.on())
          for (int64_t i = r0; i < n; ++i)
            rotate_back(dqt.row(i), turn.cos.row(i), turn.sin.row(i), buf.scratch.data(), D);
      }
      if (turn.on())
        for (int64_t j = 0; j < L; ++j)
          rotate_back(dkt.row(j), turn.cos.row(j), turn.sin.row(j), buf.scratch.data(), D);
    }
  });
  return dqkv;
}
