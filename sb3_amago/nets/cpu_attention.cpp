// Causal softmax attention on the CPU in fp32, forward and backward (sb3_amago/nets/cpu_attention.py).
//
// The input is the projection (B, L, 3, H, D) of queries, keys and values, at any strides with D
// contiguous; every (batch, head) pair is one task of at::parallel_for, reading its rows where they lie.
// The output is written in (B, L, H, D) order (the layout the output projection reads, so no transpose
// follows), and the backward reads the output's gradient at its strides and returns the projection's
// gradient whole, (B, L, 3, H, D) contiguous: no stack of three gradients follows either.
// Rotary tables (cosines and signed sines, broadcastable to the queries' shape; empty: none) turn the
// queries and keys as they are read, and the backward turns their gradients back, so the rotation
// costs no pass of its own. Within a task the forward takes the queries in blocks of BQ rows: a block's
// scores against every key it may see (rows x n, n = last row + 1) are computed whole, so the softmax is
// exact, not the running one of a flash kernel. A chunk of KC keys at a time, it computes the scores
// and their rows' maxima, then the exponentials and their products with the values, each while the
// chunk is in the first-level cache.
// The backward goes the other way round: a block of BQ keys at a time, against every query block that
// sees it, so that everything a pair of blocks touches (their probabilities recomputed from the saved
// log-sum-exp, the score gradients, the key block's gradients) stays in the first-level cache; only
// the queries' gradients accumulate across key blocks, in a contiguous buffer. Every product runs on
// one register-tiled routine (product), and its sums are taken in the same order however the work is
// blocked (Mode::Continue), so the values do not depend on the block sizes. Tasks never share a write.

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
constexpr int64_t BQ = 32;                // query rows (keys in the backward) per block
constexpr int64_t KC = 64;                // keys of the forward's chunks, a multiple of every vector's width
constexpr int64_t VS = Vec::size();       // floats per vector
constexpr int TR = VS == 16 ? 8 : 4;      // rows of a register tile: 16 accumulators of AVX-512's 32
constexpr int TC = 2;                     // registers, 8 of AVX2's 16; columns of a tile, in vectors
// Rows a task's gather asks the memory for ahead of the one it reads: a projection's rows lie
// 3 * H * D floats apart, beyond what the hardware prefetcher follows (+5% forward, +2% backward at L = 257).
constexpr int64_t PREFETCH_ROWS = 8;

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// The row length (in floats) of the forward's keys transposed and block scores: L rounded up to whole
// vectors, and to an odd number of them, so that successive rows do not all fall in one set of the
// caches (rows of a power-of-two length do: the forward 1.16x faster padded at L = 1,024, 1.12x at 4,096).
int64_t padded_row(int64_t L) {
  const int64_t vectors = round_up(L, VS) / VS;
  return (vectors % 2 ? vectors : vectors + 1) * VS;
}

// One product out = diag(scale) A B (or another Mode below): A's element (r, t) is
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

// What a product does with out: Store writes diag(scale) A B, Accumulate adds it, and Continue carries
// on the sums out holds (its multiply-adds start from out's values, and they are stored unscaled), so
// that a product over all of K taken in chunks of K has the values of one over all of it.
enum class Mode { Store, Accumulate, Continue };

// Rows r..r + R and the C vectors of columns from c, over t < K: each load of B serves R rows and each
// element of A C vectors, in R x C accumulators (enough to keep the multiply-add units busy). Not
// inlined: inlined into the backward's loop, GCC kept the accumulators in memory.
template <int R, int C, Mode M>
__attribute__((noinline)) void tile(const Product& m, int64_t r, int64_t c, int64_t K) {
  Vec acc[R][C];
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 2
    for (int j = 0; j < C; ++j) acc[i][j] = M == Mode::Continue ? Vec::loadu(m.out + (r + i) * m.ldo + c + j * VS) : Vec(0.f);
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
#pragma GCC unroll 2
    for (int j = 0; j < C; ++j) {
      float* o = m.out + (r + i) * m.ldo + c + j * VS;
      if constexpr (M == Mode::Continue)
        acc[i][j].store(o);
      else if constexpr (M == Mode::Accumulate)
        at::vec::fmadd(acc[i][j], Vec(m.scale[r + i]), Vec::loadu(o)).store(o);
      else
        (acc[i][j] * Vec(m.scale[r + i])).store(o);
    }
  }
}

template <int C, Mode M>
void tile_rows(const Product& m, int64_t rows, int64_t c, int64_t K) {
  int64_t r = 0;
  for (; r + TR <= rows; r += TR) tile<TR, C, M>(m, r, c, K);
  for (; r < rows; ++r) tile<1, C, M>(m, r, c, K);
}

// The product over rows x cols; columns past the last whole vector (a head width that is not a
// multiple of the vector) go a row at a time with partial loads.
template <Mode M>
void product(const Product& m, int64_t rows, int64_t K, int64_t cols) {
  const int64_t whole = cols / VS * VS;
  int64_t c = 0;
  for (; c + TC * VS <= whole; c += TC * VS) tile_rows<TC, M>(m, rows, c, K);
  for (; c < whole; c += VS) tile_rows<1, M>(m, rows, c, K);
  if (c == cols) return;
  const int64_t cnt = cols - c;
  for (int64_t r = 0; r < rows; ++r) {
    float* o = m.out + r * m.ldo + c;
    Vec acc = M == Mode::Continue ? Vec::loadu(o, cnt) : Vec(0.f);
    for (int64_t t = 0; t < K; ++t)
      acc = at::vec::fmadd(Vec(m.a[r * m.ars + t * m.aks]), Vec::loadu(m.b + t * m.ldb + c, cnt), acc);
    if constexpr (M == Mode::Continue)
      acc.store(o, cnt);
    else if constexpr (M == Mode::Accumulate)
      at::vec::fmadd(acc, Vec(m.scale[r]), Vec::loadu(o, cnt)).store(o, cnt);
    else
      (acc * Vec(m.scale[r])).store(o, cnt);
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

// xt (D, ld) = x's L rows of D transposed; columns L..ld of xt are left as they are.
void transpose(Rows x, float* xt, int64_t L, int64_t D, int64_t ld) {
  for (int64_t j = 0; j < L; ++j)
    for (int64_t d = 0; d < D; ++d) xt[d * ld + j] = x.row(j)[d];
}

// x's L rows of D = xt (D, ld) transposed back.
void transpose_back(const float* xt, int64_t ld, Rows x, int64_t L, int64_t D) {
  for (int64_t j = 0; j < L; ++j)
    for (int64_t d = 0; d < D; ++d) x.row(j)[d] = xt[d * ld + j];
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

// The forward's per-task buffers: the queries and keys gathered contiguous (L, D), turned where there
// are rotary tables; the keys transposed (D, ld), zero past L; a query block's scores (BQ, ld), whose
// rows of ld (padded_row) let every pass over them run on whole vectors; its unscaled outputs (BQ, D).
struct ForwardBuffers {
  int64_t ld;
  std::vector<float> qr, kr, kt, p, acc, scales;
  ForwardBuffers(int64_t L, int64_t D, float scale)
      : ld(padded_row(L)), qr(L * D), kr(L * D), kt(D * ld, 0.f), p(BQ * ld), acc(BQ * D), scales(BQ, scale) {}
};

// The backward's per-task buffers: the queries and keys gathered contiguous and turned (L, D), each
// query's dot product of its output's gradient with its output (L) and its gradient's unscaled sums
// (L, D); for one block of keys (kw: BQ rounded up to whole vectors), the keys and values transposed
// and the key and value gradients transposed (D, kw), and a query block's probabilities and score
// gradients against it (BQ, kw).
struct BackwardBuffers {
  int64_t kw;
  std::vector<float> qr, kr, dq, dots, kt, vt, dkt, dvt, p, ds, scales, ones, scratch;
  BackwardBuffers(int64_t L, int64_t D, float scale)
      : kw(round_up(BQ, VS)),
        qr(L * D),
        kr(L * D),
        dq(L * D),
        dots(L),
        kt(D * kw, 0.f),
        vt(D * kw, 0.f),
        dkt(D * kw),
        dvt(D * kw),
        p(BQ * kw),
        ds(BQ * kw),
        scales(std::max(BQ, D), scale),
        ones(std::max(BQ, D), 1.f),
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
    ForwardBuffers buf(L, D, scale);
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
        // the scores and their rows' maxima a chunk of KC keys at a time, the maxima while the chunk is
        // in the first-level cache
        float maxima[BQ];
        Vec sums[BQ], running[BQ];
        std::fill(running, running + rows, Vec(-std::numeric_limits<float>::infinity()));
        for (int64_t c0 = 0; c0 < width; c0 += KC) {
          const int64_t c1 = std::min(c0 + KC, width);
          product<Mode::Store>({Qr + r0 * D, D, 1, buf.kt.data() + c0, ld, P + c0, ld, buf.scales.data()}, rows, D, c1 - c0);
          for (int64_t r = 0; r < rows; ++r) {
            float* pr = P + r * ld;
            const int64_t seen = visible(r0, r);
            if (seen < c1) mask_future(pr, std::max(seen, c0), c1);
            Vec m = running[r];
            for (int64_t j = c0; j < c1; j += VS) m = at::vec::maximum(m, Vec::loadu(pr + j));
            running[r] = m;
          }
        }
        for (int64_t r = 0; r < rows; ++r) {
          maxima[r] = at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return at::vec::maximum(a, b); }, running[r]);
          sums[r] = Vec(0.f);
        }
        // the exponentials and their products with the values a chunk of keys at a time, while the chunk
        // is in the first-level cache (the chunks' sums carried on: those over all keys)
        float* acc = buf.acc.data();
        std::fill(acc, acc + rows * D, 0.f);
        for (int64_t c0 = 0; c0 < n; c0 += KC) {
          const int64_t c1 = std::min(c0 + KC, width);
          for (int64_t r = 0; r < rows; ++r) {
            float* pr = P + r * ld;
            const Vec mb(maxima[r]);
            Vec sv = sums[r];
            for (int64_t j = c0; j < c1; j += VS) {
              const Vec e = (Vec::loadu(pr + j) - mb).exp();
              e.store(pr + j);
              sv = sv + e;
            }
            sums[r] = sv;
          }
          product<Mode::Continue>({P + c0, ld, 1, vt.row(c0), vt.row_stride, acc, D, nullptr}, rows, std::min(c1, n) - c0, D);
        }
        for (int64_t r = 0; r < rows; ++r) {
          const float sum = at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return a + b; }, sums[r]);
          LSE[t * L + r0 + r] = maxima[r] + std::log(sum);
          const float inv_sum = 1.f / sum;
          for (int64_t d = 0; d < D; ++d) ot.row(r0 + r)[d] = acc[r * D + d] * inv_sum;
        }
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
    BackwardBuffers buf(L, D, scale);
    const int64_t kw = buf.kw;
    float *P = buf.p.data(), *DS = buf.ds.data(), *Qr = buf.qr.data(), *Kr = buf.kr.data(), *DQsum = buf.dq.data(),
          *Kt = buf.kt.data(), *Vt = buf.vt.data(), *DKt = buf.dkt.data(), *DVt = buf.dvt.data(), *dots = buf.dots.data();
    const float *scales = buf.scales.data(), *ones = buf.ones.data();
    for (int64_t t = begin; t < end; ++t) {
      const Rows gt = GRAD.task(t), ot = OUT.task(t), vt = V.task(t);
      const Rows dqt = DQ.task(t), dkt = DK.task(t), dvt = DV.task(t);
      const Rotation turn = rot.task(t);
      gather_rows(Q.task(t), turn, Qr, L, D);
      gather_rows(K.task(t), turn, Kr, L, D);
      for (int64_t i = 0; i < L; ++i) {  // sum_d grad[i, d] * out[i, d]
        float dot = 0.f;
        for (int64_t d = 0; d < D; ++d) dot += gt.row(i)[d] * ot.row(i)[d];
        dots[i] = dot;
      }
      std::fill(DQsum, DQsum + L * D, 0.f);  // the queries' gradients accumulate over the key blocks, unscaled
      const float* lse = LSE + t * L;
      for (int64_t k0 = 0; k0 < L; k0 += BQ) {  // a block of keys, and every query block that sees it
        const int64_t keys = std::min(BQ, L - k0);
        transpose({Kr + k0 * D, D}, Kt, keys, D, kw);
        transpose({vt.row(k0), vt.row_stride}, Vt, keys, D, kw);
        std::fill(DKt, DKt + D * kw, 0.f);
        std::fill(DVt, DVt + D * kw, 0.f);
        for (int64_t r0 = k0; r0 < L; r0 += BQ) {
          const int64_t rows = std::min(BQ, L - r0);
          const float *Qb = Qr + r0 * D, *Gb = gt.row(r0);
          const int64_t lg = gt.row_stride;
          product<Mode::Store>({Qb, D, 1, Kt, kw, P, kw, scales}, rows, D, kw);  // scores
          product<Mode::Store>({Gb, lg, 1, Vt, kw, DS, kw, ones}, rows, D, kw);   // grad of probabilities
          for (int64_t r = 0; r < rows; ++r) {
            float *pr = P + r * kw, *dsr = DS + r * kw;
            const int64_t seen = visible(r0, r) - k0;
            if (seen < kw) mask_future(pr, seen, kw);
            const Vec lb(lse[r0 + r]), db(dots[r0 + r]);
            for (int64_t j = 0; j < kw; j += VS) {
              const Vec prob = (Vec::loadu(pr + j) - lb).exp();
              prob.store(pr + j);
              (prob * (Vec::loadu(dsr + j) - db)).store(dsr + j);  // grad of the scaled scores
            }
          }
          product<Mode::Continue>({DS, kw, 1, Kr + k0 * D, D, DQsum + r0 * D, D, nullptr}, rows, keys, D);  // dq += ds k
          product<Mode::Accumulate>({Gb, 1, lg, P, kw, DVt, kw, ones}, D, rows, kw);     // dv^T += grad^T p
          product<Mode::Accumulate>({Qb, 1, D, DS, kw, DKt, kw, scales}, D, rows, kw);  // dk^T += scale q^T ds
        }
        transpose_back(DVt, kw, {dvt.row(k0), dvt.row_stride}, keys, D);
        transpose_back(DKt, kw, {dkt.row(k0), dkt.row_stride}, keys, D);
        if (turn.on())
          for (int64_t j = k0; j < k0 + keys; ++j)
            rotate_back(dkt.row(j), turn.cos.row(j), turn.sin.row(j), buf.scratch.data(), D);
      }
      for (int64_t i = 0; i < L; ++i) {
        for (int64_t d = 0; d < D; ++d) dqt.row(i)[d] = DQsum[i * D + d] * scale;
        if (turn.on()) rotate_back(dqt.row(i), turn.cos.row(i), turn.sin.row(i), buf.scratch.data(), D);
      }
    }
  });
  return dqkv;
}
