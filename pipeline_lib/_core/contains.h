// Whether a text holds a string: the encoder's calls look for the special tokens' common prefix
// ("<|") before encoding, in the bytes they are about to read. Python's `in` took a quarter of
// encode_to_numpy's time on English (a pass of ~1 GB/s); 32 bytes a step here (16 without AVX2).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string_view>

#if defined(__x86_64__)
#include <immintrin.h>
#elif defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace tokcore {

namespace detail {

// Whether the needle nd[0:m] (m >= 2) starts at s.
inline bool needle_at(const uint8_t* p, size_t s, const uint8_t* nd, size_t m) {
    return std::memcmp(p + s + 2, nd + 2, m - 2) == 0;
}

#if defined(__x86_64__)
// The starts i..i+31 at once, where i + 32 <= last; returns where it stopped, or `last + 1` when
// it found the needle.
[[gnu::target("avx2")]] inline size_t contains_avx2(const uint8_t* p, size_t last, const uint8_t* nd, size_t m) {
    const __m256i first = _mm256_set1_epi8(static_cast<char>(nd[0]));
    const __m256i second = _mm256_set1_epi8(static_cast<char>(nd[1]));
    size_t i = 0;
    for (; i + 32 <= last; i += 32) {
        const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i));
        const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 1));
        unsigned hits = static_cast<unsigned>(
            _mm256_movemask_epi8(_mm256_and_si256(_mm256_cmpeq_epi8(a, first), _mm256_cmpeq_epi8(b, second))));
        for (; hits != 0; hits &= hits - 1) {
            if (needle_at(p, i + static_cast<size_t>(__builtin_ctz(hits)), nd, m)) return last + 1;
        }
    }
    return i;
}
#endif

}  // namespace detail

// Whether p[0:n] holds needle (an empty needle is held by every text).
inline bool contains_bytes(const uint8_t* p, size_t n, std::string_view needle) {
    const size_t m = needle.size();
    if (m == 0) return true;
    if (m > n) return false;
    const auto* nd = reinterpret_cast<const uint8_t*>(needle.data());
    if (m == 1) return std::memchr(p, nd[0], n) != nullptr;
    const size_t last = n - m;  // the last place the needle may start
    auto rest_at = [&](size_t s) { return detail::needle_at(p, s, nd, m); };
    size_t i = 0;
#if defined(__x86_64__)
    static const bool avx2 = __builtin_cpu_supports("avx2") && std::getenv("TOKENMILL_NO_AVX2") == nullptr;
    if (avx2) {
        i = detail::contains_avx2(p, last, nd, m);
        if (i > last) return true;
    }
#endif
#if defined(__SSE2__)
    // The starts i..i+15 at once: where the needle's first two bytes are.
    const __m128i first = _mm_set1_epi8(static_cast<char>(nd[0]));
    const __m128i second = _mm_set1_epi8(static_cast<char>(nd[1]));
    for (; i + 16 <= last; i += 16) {
        const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i));
        const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i + 1));
        unsigned hits =
            static_cast<unsigned>(_mm_movemask_epi8(_mm_and_si128(_mm_cmpeq_epi8(a, first), _mm_cmpeq_epi8(b, second))));
        for (; hits != 0; hits &= hits - 1) {
            if (rest_at(i + static_cast<size_t>(__builtin_ctz(hits)))) return true;
        }
    }
#endif
    for (; i <= last; ++i) {
        if (p[i] == nd[0] && p[i + 1] == nd[1] && rest_at(i)) return true;
    }
    return false;
}

// The same over a Python str's code units of 1, 2 or 4 bytes, the needle given as code points.
template <class Unit>
bool contains_units(const Unit* p, size_t n, const uint32_t* needle, size_t m) {
    if (m == 0) return true;
    if (m > n) return false;
    for (size_t s = 0; s + m <= n; ++s) {
        if (p[s] != needle[0]) continue;
        size_t k = 1;
        while (k < m && p[s + k] == needle[k]) ++k;
        if (k == m) return true;
    }
    return false;
}

}  // namespace tokcore
