// Dropout's keep mask on the CPU in one pass (sb3_amago/nets/dropout.py, keep_mask).
//
// Element i of the mask reads 16-bit field i % 4 of draw i / 4, the draw being SplitMix64's output
// function of key + (i / 4) * GAMMA (wrapping), and is kept where the field, read as signed and
// shifted by 2^15, is at least 2 * steps (the rate in steps of 2^-15): kept elements hold the scale,
// dropped ones 0. The same integers as the torch expressions in dropout.py, so the same mask. Under
// AVX-512 eight draws go at a time: their 32 fields are the 32 16-bit lanes of the vector in element
// order (little-endian), compared at once into the two 16-float stores.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cstdint>
#ifdef CPU_CAPABILITY_AVX512
#include <immintrin.h>
#endif

// A named namespace: profiles (benchmarks/profile_update.py) tell these symbols from attention's by it.
namespace dropout {

constexpr uint64_t GAMMA = 0x9E3779B97F4A7C15ULL;
constexpr uint64_t MULTIPLIER_1 = 0xBF58476D1CE4E5B9ULL;
constexpr uint64_t MULTIPLIER_2 = 0x94D049BB133111EBULL;
constexpr int64_t FIELDS_PER_DRAW = 4;
// Draws per task of at::parallel_for: a 256 KiB stretch of the mask.
constexpr int64_t GRAIN = 16384;

uint64_t draw(uint64_t key, int64_t d) {
  uint64_t z = key + static_cast<uint64_t>(d) * GAMMA;
  z = (z ^ (z >> 30)) * MULTIPLIER_1;
  z = (z ^ (z >> 27)) * MULTIPLIER_2;
  return z ^ (z >> 31);
}

// Elements first..last (exclusive) of the mask, a draw at a time.
void fill_scalar(float* out, uint64_t key, int64_t first, int64_t last, uint32_t threshold, float kept) {
  uint64_t z = 0;
  for (int64_t i = first; i < last; ++i) {
    if (i == first || i % FIELDS_PER_DRAW == 0) z = draw(key, i / FIELDS_PER_DRAW);
    const uint32_t field = static_cast<uint32_t>(z >> (16 * (i % FIELDS_PER_DRAW))) & 0xFFFFu;
    out[i] = (field ^ 0x8000u) >= threshold ? kept : 0.f;
  }
}

#ifdef CPU_CAPABILITY_AVX512
// Draws d0..d1 (a multiple of 8 of them), elements 4 d0..4 d1.
void fill_avx512(float* out, uint64_t key, int64_t d0, int64_t d1, uint32_t threshold, float kept) {
  const __m512i gamma = _mm512_set1_epi64(static_cast<int64_t>(GAMMA));
  const __m512i m1 = _mm512_set1_epi64(static_cast<int64_t>(MULTIPLIER_1));
  const __m512i m2 = _mm512_set1_epi64(static_cast<int64_t>(MULTIPLIER_2));
  const __m512i k = _mm512_set1_epi64(static_cast<int64_t>(key));
  const __m512i sign = _mm512_set1_epi16(static_cast<int16_t>(0x8000));
  const __m512i bound = _mm512_set1_epi16(static_cast<int16_t>(threshold));
  const __m512i lanes = _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0);
  const __m512 kept_v = _mm512_set1_ps(kept);
  for (int64_t d = d0; d < d1; d += 8) {
    const __m512i index = _mm512_add_epi64(_mm512_set1_epi64(d), lanes);
    __m512i z = _mm512_add_epi64(k, _mm512_mullo_epi64(index, gamma));
    z = _mm512_mullo_epi64(_mm512_xor_si512(z, _mm512_srli_epi64(z, 30)), m1);
    z = _mm512_mullo_epi64(_mm512_xor_si512(z, _mm512_srli_epi64(z, 27)), m2);
    z = _mm512_xor_si512(z, _mm512_srli_epi64(z, 31));
    const __mmask32 keep = _mm512_cmpge_epu16_mask(_mm512_xor_si512(z, sign), bound);
    float* o = out + d * FIELDS_PER_DRAW;
    _mm512_storeu_ps(o, _mm512_maskz_mov_ps(static_cast<__mmask16>(keep), kept_v));
    _mm512_storeu_ps(o + 16, _mm512_maskz_mov_ps(static_cast<__mmask16>(keep >> 16), kept_v));
  }
}
#endif

}  // namespace dropout

// A contiguous float32 tensor of like's shape: the keep mask of the 0-d int64 key at the rate of
// steps / 2^15, scale where kept and 0 where dropped.
at::Tensor dropout_keep_mask(const at::Tensor& like, const at::Tensor& key, int64_t steps, double scale) {
  TORCH_CHECK(key.numel() == 1 && key.scalar_type() == at::kLong, "key must be one int64");
  TORCH_CHECK(steps >= 0 && steps < (1 << 15), "steps must lie in [0, 2^15), got ", steps);
  auto out = at::empty(like.sizes(), like.options().dtype(at::kFloat).memory_format(at::MemoryFormat::Contiguous));
  const int64_t n = out.numel();
  const uint64_t k = static_cast<uint64_t>(key.item<int64_t>());
  const uint32_t threshold = static_cast<uint32_t>(2 * steps);
  const float kept = static_cast<float>(scale);
  float* dst = out.data_ptr<float>();
  const int64_t whole_draws = n / dropout::FIELDS_PER_DRAW;
  at::parallel_for(0, whole_draws, dropout::GRAIN, [&](int64_t begin, int64_t end) {
    int64_t d = begin;
#ifdef CPU_CAPABILITY_AVX512
    const int64_t vector_end = begin + (end - begin) / 8 * 8;
    dropout::fill_avx512(dst, k, begin, vector_end, threshold, kept);
    d = vector_end;
#endif
    dropout::fill_scalar(dst, k, d * dropout::FIELDS_PER_DRAW, end * dropout::FIELDS_PER_DRAW, threshold, kept);
  });
  dropout::fill_scalar(dst, k, whole_draws * dropout::FIELDS_PER_DRAW, n, threshold, kept);
  return out;
}
