// UTF-8 of a Python str's storage: its code units of 1 (Latin-1), 2 (UCS-2) or 4 (UCS-4) bytes.
// encode_batch's threads convert a batch's str documents themselves, each the documents it
// encodes: converted by the caller (CPython's PyUnicode_AsUTF8AndSize, under the GIL) the batch's
// text went through one thread before any other could start. The calls that encode one text
// convert it here too (module.cpp's MadeUtf8): 2-5x CPython's conversion.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__SSE2__) && !defined(TOKCORE_NO_SIMD)
#include <emmintrin.h>
#endif

namespace tokcore {

// Most UTF-8 bytes a code unit of `kind` bytes takes (a UCS-2 unit is at most U+FFFF: 3 bytes).
constexpr size_t utf8_bytes_per_unit(unsigned kind) { return kind == 1 ? 2 : kind == 2 ? 3 : 4; }

namespace detail {

// c (< 0x110000, not a surrogate) as UTF-8 at o; returns the end.
inline uint8_t* put_utf8(uint32_t c, uint8_t* o) {
    if (c < 0x80) {
        *o++ = static_cast<uint8_t>(c);
    } else if (c < 0x800) {
        *o++ = static_cast<uint8_t>(0xC0 | (c >> 6));
        *o++ = static_cast<uint8_t>(0x80 | (c & 0x3F));
    } else if (c < 0x10000) {
        *o++ = static_cast<uint8_t>(0xE0 | (c >> 12));
        *o++ = static_cast<uint8_t>(0x80 | ((c >> 6) & 0x3F));
        *o++ = static_cast<uint8_t>(0x80 | (c & 0x3F));
    } else {
        *o++ = static_cast<uint8_t>(0xF0 | (c >> 18));
        *o++ = static_cast<uint8_t>(0x80 | ((c >> 12) & 0x3F));
        *o++ = static_cast<uint8_t>(0x80 | ((c >> 6) & 0x3F));
        *o++ = static_cast<uint8_t>(0x80 | (c & 0x3F));
    }
    return o;
}

// Whether the 16 bytes of units at u are all ASCII, then their bytes stored at o (16 / sizeof(Unit)
// of them). SSE2 where the compiler has it (TOKCORE_NO_SIMD forces the words below;
// tests/test_core_swar.py compares the two builds).
template <class Unit>
inline bool ascii_block(const Unit* u, uint8_t* o) {
#if defined(__SSE2__) && !defined(TOKCORE_NO_SIMD)
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(u));
    if constexpr (sizeof(Unit) == 1) {
        if (_mm_movemask_epi8(v) != 0) return false;
        _mm_storeu_si128(reinterpret_cast<__m128i*>(o), v);
    } else if constexpr (sizeof(Unit) == 2) {
        // units <= 0x7F are those that subtracting 0x7F (saturated at 0) leaves 0
        const __m128i over = _mm_subs_epu16(v, _mm_set1_epi16(0x7F));
        if (_mm_movemask_epi8(_mm_cmpeq_epi16(over, _mm_setzero_si128())) != 0xFFFF) return false;
        _mm_storel_epi64(reinterpret_cast<__m128i*>(o), _mm_packus_epi16(v, v));
    } else {
        // code points are < 0x110000: a signed compare orders them
        if (_mm_movemask_epi8(_mm_cmpgt_epi32(v, _mm_set1_epi32(0x7F))) != 0) return false;
        const __m128i halves = _mm_packs_epi32(v, v);
        const uint32_t four = static_cast<uint32_t>(_mm_cvtsi128_si32(_mm_packus_epi16(halves, halves)));
        std::memcpy(o, &four, 4);
    }
    return true;
#else
    constexpr uint64_t kHigh = sizeof(Unit) == 1   ? 0x8080808080808080ull
                               : sizeof(Unit) == 2 ? 0xFF80FF80FF80FF80ull
                                                   : 0xFFFFFF80FFFFFF80ull;
    uint64_t w[2];
    std::memcpy(w, u, 16);
    if (((w[0] | w[1]) & kHigh) != 0) return false;
    for (size_t k = 0; k < 16 / sizeof(Unit); ++k) o[k] = static_cast<uint8_t>(u[k]);
    return true;
#endif
}

template <class Unit>
size_t utf8_from(const Unit* u, size_t n, uint8_t* out) {
    // Runs of ASCII (most of the text in many languages: spaces, digits, punctuation, markup) 16
    // bytes of units at a time; the units of a block that is not all ASCII one by one.
    constexpr size_t kPerBlock = 16 / sizeof(Unit);
    uint8_t* o = out;
    size_t i = 0;
    while (i < n) {
        for (; i + kPerBlock <= n && ascii_block(u + i, o); i += kPerBlock) o += kPerBlock;
        for (const size_t stop = std::min(i + kPerBlock, n); i < stop; ++i) {
            const uint32_t c = u[i];
            if (sizeof(Unit) > 1 && (c & 0xFFFFF800u) == 0xD800) return SIZE_MAX;
            o = put_utf8(c, o);
        }
    }
    return static_cast<size_t>(o - out);
}

}  // namespace detail

// The UTF-8 of units[0:n] (of `kind` bytes each) into out, which has room for
// n * utf8_bytes_per_unit(kind) bytes; returns the bytes written, or SIZE_MAX at a surrogate
// code point (UTF-8 cannot hold one: Python's own conversion raises UnicodeEncodeError there).
inline size_t utf8_from_units(const void* units, size_t n, unsigned kind, uint8_t* out) {
    switch (kind) {
        case 1:
            return detail::utf8_from(static_cast<const uint8_t*>(units), n, out);
        case 2:
            return detail::utf8_from(static_cast<const uint16_t*>(units), n, out);
        default:
            return detail::utf8_from(static_cast<const uint32_t*>(units), n, out);
    }
}

}  // namespace tokcore
