// The two steps of BPE on a short piece held in arrays (EncoderCore::bpe_small): find the pair
// of lowest rank, and close the gap the merge leaves. SSE2 where the compiler has it, plain loops
// otherwise (TOKCORE_NO_SIMD forces them; tests/test_core_swar.py compares the two builds).
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__SSE2__) && !defined(TOKCORE_NO_SIMD)
#include <emmintrin.h>
#endif

namespace tokcore::small_merge {

// The arrays hold one vector more than their entries: the scan and the shift work in whole
// 4-lane vectors, reading (never using) up to 3 entries past the live ones.
constexpr size_t kPad = 8;
constexpr uint32_t kNoPair = 0xFFFFFFFFu;

// Position and value of the lowest of rk[0 .. pairs) (pairs >= 1), leftmost on ties; rk[pairs ..]
// up to the next multiple of 4 must hold kNoPair. Which pair is lowest changes from step to step,
// so a branch per pair was mispredicted about once per pair looked at: this has none.
inline size_t lowest_pair(const uint32_t* rk, size_t pairs, uint32_t& best) {
#if defined(__SSE2__) && !defined(TOKCORE_NO_SIMD)
    // SSE2 compares signed lanes: flipping the top bit orders unsigned values the same way.
    const __m128i flip = _mm_set1_epi32(static_cast<int>(0x80000000u));
    auto lanes = [&](size_t v) {
        return _mm_xor_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rk + v)), flip);
    };
    auto min4 = [](__m128i a, __m128i b) {
        const __m128i lt = _mm_cmplt_epi32(b, a);
        return _mm_or_si128(_mm_and_si128(lt, b), _mm_andnot_si128(lt, a));
    };
    __m128i low = lanes(0);
    for (size_t v = 4; v < pairs; v += 4) low = min4(low, lanes(v));
    low = min4(low, _mm_shuffle_epi32(low, 0x4E));
    low = min4(low, _mm_shuffle_epi32(low, 0xB1));
    best = static_cast<uint32_t>(_mm_cvtsi128_si32(low)) ^ 0x80000000u;
    for (size_t v = 0;; v += 4) {
        const int hit = _mm_movemask_ps(_mm_castsi128_ps(_mm_cmpeq_epi32(lanes(v), low)));
        if (hit != 0) return v + static_cast<size_t>(__builtin_ctz(static_cast<unsigned>(hit)));
    }
#else
    best = kNoPair;
    size_t at = 0;
    for (size_t k = 0; k < pairs; ++k) {
        const bool lower = rk[k] < best;
        best = lower ? rk[k] : best;
        at = lower ? k : at;
    }
    return at;
#endif
}

// a[i ..] = a[i + 1 ..] for the entries before `end`, and up to 3 after it (a pads them).
inline void shift_down(uint32_t* a, size_t i, size_t end) {
#if defined(__SSE2__) && !defined(TOKCORE_NO_SIMD)
    // Each step loads before it stores, and stores only below what the next step loads.
    for (; i < end; i += 4)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(a + i),
                         _mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i + 1)));
#else
    for (; i < end; ++i) a[i] = a[i + 1];
#endif
}

}  // namespace tokcore::small_merge
