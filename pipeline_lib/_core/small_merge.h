// The two steps of BPE on a short piece held in arrays (EncoderCore::bpe_small): find the pair
// of lowest rank, and close the gap the merge leaves (SSE2 where the compiler has it, a plain
// loop otherwise: TOKCORE_NO_SIMD forces it; tests/test_core_swar.py compares the two builds).
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__SSE2__) && !defined(TOKCORE_NO_SIMD)
#include <emmintrin.h>
#endif

namespace tokcore::small_merge {

// The arrays hold one vector more than their entries: the shift works in whole 4-lane vectors,
// reading (never using) up to 4 entries past the live ones.
constexpr size_t kPad = 8;
constexpr uint32_t kNoPair = 0xFFFFFFFFu;

// Position and value of the lowest of rk[0 .. pairs) (pairs >= 1), leftmost on ties. Which pair
// is lowest changes from step to step, so a branch per pair was mispredicted about once per pair
// looked at: conditional moves instead. Scalar loads: the ranks were just stored one by one, and
// a vector load of them would wait for those stores (tried: slower despite fewer instructions).
inline size_t lowest_pair(const uint32_t* rk, size_t pairs, uint32_t& best) {
    best = kNoPair;
    size_t at = 0;
    for (size_t k = 0; k < pairs; ++k) {
        const bool lower = rk[k] < best;
        best = lower ? rk[k] : best;
        at = lower ? k : at;
    }
    return at;
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
