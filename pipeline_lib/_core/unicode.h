// UTF-8 decoding and character classes for the pre-tokenizers.
//
// Text is scanned as raw bytes. A well-formed UTF-8 sequence (Unicode Table 3-7: no
// overlongs, no surrogates, nothing above U+10FFFF) is one character whose classes come
// from the generated two-level table. Every other byte is one character of its own with
// no class at all -- neither letter, number nor space -- which is exactly how the Python
// reference sees it after decoding with "surrogateescape" (U+DC80..U+DCFF, category Cs).
#pragma once

#include <cstddef>
#include <cstdint>

#include "unicode_tables.h"

namespace tokcore {

using tables::kFlagL;
using tables::kFlagLo;
using tables::kFlagN;
using tables::kFlagS;
using tables::kFlagUp;

struct Char {
    uint32_t cp;    // code point; 0xDC00 + byte for an invalid byte
    uint8_t flags;  // kFlag* bits
    uint8_t len;    // bytes, 1..4
};

inline uint8_t flags_of_cp(uint32_t cp) {
    return tables::kStage2[(static_cast<uint32_t>(tables::kStage1[cp >> tables::kBlockShift])
                            << tables::kBlockShift) |
                           (cp & ((1u << tables::kBlockShift) - 1))];
}

// Flags of an ASCII byte (block 0 of the table is U+0000..U+00FF).
inline uint8_t ascii_flags(uint8_t b) { return tables::kStage2[b]; }

// The first blocks of stage 2 are U+0000..U+07FF in order, so a code point of one or two
// UTF-8 bytes (Latin, Greek, Cyrillic, Armenian, Hebrew, Arabic) indexes it directly: one load
// where flags_of_cp takes two dependent ones.
constexpr bool stage2_starts_in_order() {
    for (uint32_t b = 0; b < (0x800u >> tables::kBlockShift); ++b)
        if (tables::kStage1[b] != b) return false;
    return true;
}
static_assert(stage2_starts_in_order(), "tools/gen_unicode_tables.py must keep blocks U+0000..U+07FF first, in order");
inline uint8_t flags_below_800(uint32_t cp) { return tables::kStage2[cp]; }

// Slow path: decode a (possibly invalid) multi-byte sequence starting at s[i], i < n.
// Kept out of line so that the ASCII path of its callers inlines.
[[gnu::noinline]] inline Char decode_multibyte(const uint8_t* s, size_t n, size_t i) {
    const uint8_t b0 = s[i];
    const size_t left = n - i;
    Char bad{0xDC00u + b0, 0, 1};
    if (b0 >= 0xC2 && b0 <= 0xDF) {
        if (left < 2 || (s[i + 1] & 0xC0) != 0x80) return bad;
        uint32_t cp = ((b0 & 0x1Fu) << 6) | (s[i + 1] & 0x3Fu);
        return {cp, flags_below_800(cp), 2};
    }
    if (b0 >= 0xE0 && b0 <= 0xEF) {
        if (left < 3) return bad;
        const uint8_t b1 = s[i + 1], b2 = s[i + 2];
        const uint8_t lo = b0 == 0xE0 ? 0xA0 : 0x80;
        const uint8_t hi = b0 == 0xED ? 0x9F : 0xBF;
        if (b1 < lo || b1 > hi || (b2 & 0xC0) != 0x80) return bad;
        uint32_t cp = ((b0 & 0x0Fu) << 12) | ((b1 & 0x3Fu) << 6) | (b2 & 0x3Fu);
        return {cp, flags_of_cp(cp), 3};
    }
    if (b0 >= 0xF0 && b0 <= 0xF4) {
        if (left < 4) return bad;
        const uint8_t b1 = s[i + 1], b2 = s[i + 2], b3 = s[i + 3];
        const uint8_t lo = b0 == 0xF0 ? 0x90 : 0x80;
        const uint8_t hi = b0 == 0xF4 ? 0x8F : 0xBF;
        if (b1 < lo || b1 > hi || (b2 & 0xC0) != 0x80 || (b3 & 0xC0) != 0x80) return bad;
        uint32_t cp = ((b0 & 0x07u) << 18) | ((b1 & 0x3Fu) << 12) | ((b2 & 0x3Fu) << 6) | (b3 & 0x3Fu);
        return {cp, flags_of_cp(cp), 4};
    }
    return bad;
}

// The character starting at s[i]; requires i < n. Inlined: pre-tokenizing calls it for
// nearly every byte, and for ASCII it is a table load.
[[gnu::always_inline]] inline Char char_at(const uint8_t* s, size_t n, size_t i) {
    const uint8_t b = s[i];
    if (b < 0x80) return {b, ascii_flags(b), 1};
    return decode_multibyte(s, n, i);
}

// char_at with two- and three-byte sequences (Latin, Greek, Cyrillic, Hebrew, Arabic, Indic,
// CJK: nearly every non-ASCII character of most text) decoded inline too, for the loops over
// runs of characters, where the out-of-line call cost about as much as the decoding. (Inlined
// at every char_at of the pre-tokenizers, it made the ASCII paths slower.)
[[gnu::always_inline]] inline Char char_at_wide(const uint8_t* s, size_t n, size_t i) {
    const uint8_t b = s[i];
    if (b < 0x80) return {b, ascii_flags(b), 1};
    if (b >= 0xC2 && b <= 0xDF && i + 1 < n && (s[i + 1] & 0xC0) == 0x80) {
        const uint32_t cp = ((b & 0x1Fu) << 6) | (s[i + 1] & 0x3Fu);
        return {cp, flags_below_800(cp), 2};
    }
    if ((b & 0xF0) == 0xE0 && i + 2 < n) {
        // Table 3-7: E0 needs A0..BF, ED needs 80..9F (no surrogates), others 80..BF
        const uint8_t b1 = s[i + 1], b2 = s[i + 2];
        const uint8_t lo = b == 0xE0 ? 0xA0 : 0x80;
        const uint8_t hi = b == 0xED ? 0x9F : 0xBF;
        if (b1 >= lo && b1 <= hi && (b2 & 0xC0) == 0x80) {
            const uint32_t cp = ((b & 0x0Fu) << 12) | ((b1 & 0x3Fu) << 6) | (b2 & 0x3Fu);
            return {cp, flags_of_cp(cp), 3};
        }
    }
    return decode_multibyte(s, n, i);
}

// Lower-case ASCII letter that the character case-insensitively equals, if it is one of
// the contraction letters (s d m t l v r e); 0 otherwise.
inline char contraction_letter(const Char& c) {
    uint32_t cp = c.cp;
    if (cp < 0x80) {
        if (cp >= 'A' && cp <= 'Z') cp += 'a' - 'A';
        switch (cp) {
            case 's': case 'd': case 'm': case 't': case 'l': case 'v': case 'r': case 'e':
                return static_cast<char>(cp);
            default:
                return 0;
        }
    }
    for (int k = 0; k < tables::kNumFolds; ++k)
        if (tables::kFolds[k].cp == cp) return tables::kFolds[k].letter;
    return 0;
}

}  // namespace tokcore
