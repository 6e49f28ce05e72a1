// Element-wise helpers for the decoder step: float math on rows of T (float / bf16 / half),
// rounding to T where the eager PyTorch path rounds, so both paths agree to the last bit of
// most values.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "vec_simd.h"

#if defined(__AVX2__)
#include "x86_intrinsics.h"
#endif

namespace tgserve {

// exp via Cody-Waite reduction and a degree-6 polynomial (~2 ulp); plain float ops, so loops
// using it vectorize (libm's expf does not).
inline float fast_exp(float x) {
  x = std::min(std::max(x, -87.0f), 88.0f);
  const float n = std::floor(x * kLog2e + 0.5f);
  const float r = x - n * kLn2Hi - n * kLn2Lo;
  float p = kExpPoly[0];
  p = p * r + kExpPoly[1];
  p = p * r + kExpPoly[2];
  p = p * r + kExpPoly[3];
  p = p * r + kExpPoly[4];
  p = p * r + kExpPoly[5];
  p = p * r + kExpPoly[6];
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float two_n;
  std::memcpy(&two_n, &bits, sizeof(float));
  return p * two_n;
}

// RMSNorm as models/layers.py: out = w * T(x * rsqrt(mean(x^2) + eps)).
template <typename T>
inline void rms_norm_row(const T* x, const T* w, T* out, int64_t n, float eps) {
#ifdef TGSERVE_VEC_SIMD
  if constexpr (simd::kVectorized<T>) {
    __m512 squares = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) {
      const __m512 v = simd::load(x + i, simd::tail_mask(n - i));
      squares = _mm512_fmadd_ps(v, v, squares);
    }
    const __m512 r = _mm512_set1_ps(
        1.0f / std::sqrt(_mm512_reduce_add_ps(squares) / static_cast<float>(n) + eps));
    for (int64_t i = 0; i < n; i += 16) {
      const __mmask16 m = simd::tail_mask(n - i);
      const __m512 normed = simd::round_to<T>(_mm512_mul_ps(simd::load(x + i, m), r));
      simd::store(out + i, _mm512_mul_ps(simd::load(w + i, m), normed), m);
    }
    return;
  }
#endif
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) {
    const float v = static_cast<float>(x[i]);
    sum += v * v;
  }
  const float r = 1.0f / std::sqrt(sum / static_cast<float>(n) + eps);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const T normed = static_cast<T>(static_cast<float>(x[i]) * r);
    out[i] = static_cast<T>(static_cast<float>(w[i]) * static_cast<float>(normed));
  }
}

// x += y, rounded to T (the residual stream stays in the model's dtype, as in eager).
template <typename T>
inline void add_row(T* x, const T* y, int64_t n) {
#ifdef TGSERVE_VEC_SIMD
  if constexpr (simd::kVectorized<T>) {
    for (int64_t i = 0; i < n; i += 16) {
      const __mmask16 m = simd::tail_mask(n - i);
      simd::store(x + i, _mm512_add_ps(simd::load(x + i, m), simd::load(y + i, m)), m);
    }
    return;
  }
#endif
#pragma omp simd
  for (int64_t i = 0; i < n; ++i)
    x[i] = static_cast<T>(static_cast<float>(x[i]) + static_cast<float>(y[i]));
}

#if defined(__AVX2__) && defined(__FMA__) && !defined(TGSERVE_VEC_SIMD)
// silu(g) = g / (1 + fast_exp(-g)) for 8 float lanes, the operations GCC compiles the scalar
// loop of silu_mul into on AVX2 + FMA targets (-O3, its default -ffp-contract=fast), so the
// same bits as that loop: x = -g clamped to [-87, 88], n = floor(fma(x, log2e, 0.5)), r =
// fma(-n, ln2_lo, fma(-n, ln2_hi, x)), Horner's rule in FMAs, then 1 + p * 2^n as one FMA
// (exact 2^n: the exponent bits). Before, that loop stayed scalar (vroundss, vdivss per
// element: 5.5% of an int8 offline 64 x 128/128 run's CPU time on AVX2 Zen 3).
inline __m256 silu8(__m256 g) {
  const __m256 x = _mm256_min_ps(_mm256_max_ps(_mm256_sub_ps(_mm256_setzero_ps(), g),
                                               _mm256_set1_ps(-87.0f)),
                                 _mm256_set1_ps(88.0f));
  const __m256 n = _mm256_round_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(kLog2e), _mm256_set1_ps(0.5f)),
                                   _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  const __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo),
                                    _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x));
  __m256 p = _mm256_set1_ps(kExpPoly[0]);
  for (int i = 1; i < 7; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpPoly[i]));
  const __m256i bits = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_div_ps(g, _mm256_fmadd_ps(p, _mm256_castsi256_ps(bits), _mm256_set1_ps(1.0f)));
}
#endif

// out [n] = T(silu(gate)) * up, element by element (a span of a row: each element's bits are
// its own, whatever the span).
template <typename T>
inline void silu_mul(const T* gate, const T* up, T* out, int64_t n) {
#ifdef TGSERVE_VEC_SIMD
  if constexpr (simd::kVectorized<T>) {
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t i = 0; i < n; i += 16) {
      const __mmask16 m = simd::tail_mask(n - i);
      const __m512 g = simd::load(gate + i, m);
      const __m512 e = simd::exp(_mm512_sub_ps(_mm512_setzero_ps(), g));
      const __m512 act = simd::round_to<T>(_mm512_div_ps(g, _mm512_add_ps(one, e)));
      simd::store(out + i, _mm512_mul_ps(act, simd::load(up + i, m)), m);
    }
    return;
  }
#elif defined(__AVX2__) && defined(__FMA__)
  if constexpr (std::is_same_v<T, float>) {  // 8 lanes, then the loop below for the tail
    const int64_t whole = n - n % 8;
    for (int64_t i = 0; i < whole; i += 8)
      _mm256_storeu_ps(out + i, _mm256_mul_ps(silu8(_mm256_loadu_ps(gate + i)),
                                              _mm256_loadu_ps(up + i)));
    gate += whole, up += whole, out += whole, n -= whole;
  }
#endif
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float g = static_cast<float>(gate[i]);
    const T act = static_cast<T>(g / (1.0f + fast_exp(-g)));
    out[i] = static_cast<T>(static_cast<float>(act) * static_cast<float>(up[i]));
  }
}

// out = T(silu(gate)) * up, gate and up being the two halves of one fused row [2n].
template <typename T>
inline void silu_mul_row(const T* gate_up, T* out, int64_t n) {
  silu_mul(gate_up, gate_up + n, out, n);
}

// Rotate-half RoPE in place on `heads` vectors of size d: x*cos + rotate_half(x)*sin, with
// the cos/sin tables [d] already in T and each product rounded to T, as eager does.
template <typename T>
inline void rope_heads(T* x, const T* cos, const T* sin, int64_t heads, int64_t d) {
  const int64_t half = d / 2;
#ifdef TGSERVE_VEC_SIMD
  if constexpr (simd::kVectorized<T>) {
    for (int64_t i = 0; i < half; i += 16) {
      const __mmask16 m = simd::tail_mask(half - i);
      const __m512 cos_lo = simd::load(cos + i, m), cos_hi = simd::load(cos + half + i, m);
      const __m512 sin_lo = simd::load(sin + i, m), sin_hi = simd::load(sin + half + i, m);
      for (int64_t h = 0; h < heads; ++h) {
        T* v = x + h * d;
        const __m512 a = simd::load(v + i, m), b = simd::load(v + half + i, m);
        const __m512 a_cos = simd::round_to<T>(_mm512_mul_ps(a, cos_lo));
        const __m512 nb_sin = simd::round_to<T>(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_mul_ps(b, sin_lo)));
        const __m512 b_cos = simd::round_to<T>(_mm512_mul_ps(b, cos_hi));
        const __m512 a_sin = simd::round_to<T>(_mm512_mul_ps(a, sin_hi));
        simd::store(v + i, _mm512_add_ps(a_cos, nb_sin), m);
        simd::store(v + half + i, _mm512_add_ps(b_cos, a_sin), m);
      }
    }
    return;
  }
#endif
  for (int64_t h = 0; h < heads; ++h) {
    T* v = x + h * d;
    for (int64_t i = 0; i < half; ++i) {
      const float a = static_cast<float>(v[i]), b = static_cast<float>(v[i + half]);
      const T a_cos = static_cast<T>(a * static_cast<float>(cos[i]));
      const T b_cos = static_cast<T>(b * static_cast<float>(cos[i + half]));
      const T nb_sin = static_cast<T>(-b * static_cast<float>(sin[i]));
      const T a_sin = static_cast<T>(a * static_cast<float>(sin[i + half]));
      v[i] = static_cast<T>(static_cast<float>(a_cos) + static_cast<float>(nb_sin));
      v[i + half] = static_cast<T>(static_cast<float>(b_cos) + static_cast<float>(a_sin));
    }
  }
}

}  // namespace tgserve
