// UTF-8 of a Python str's storage: its code units of 1 (Latin-1), 2 (UCS-2) or 4 (UCS-4) bytes.
// encode_batch's threads convert a batch's str documents themselves, each the documents it
// encodes: converted by the caller (CPython's PyUnicode_AsUTF8AndSize, under the GIL) the batch's
// text went through one thread before any other could start.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

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

template <class Unit>
size_t utf8_from(const Unit* u, size_t n, uint8_t* out) {
    // Runs of ASCII (most of the text in many languages: spaces, digits, punctuation, markup)
    // eight bytes of units at a time: a word whose units are all below 0x80.
    constexpr size_t kPerWord = 8 / sizeof(Unit);
    constexpr uint64_t kHigh = sizeof(Unit) == 1   ? 0x8080808080808080ull
                               : sizeof(Unit) == 2 ? 0xFF80FF80FF80FF80ull
                                                   : 0xFFFFFF80FFFFFF80ull;
    uint8_t* o = out;
    size_t i = 0;
    while (i < n) {
        if (i + kPerWord <= n) {
            uint64_t w;
            std::memcpy(&w, u + i, 8);
            if ((w & kHigh) == 0) {
                for (size_t k = 0; k < kPerWord; ++k) o[k] = static_cast<uint8_t>(u[i + k]);
                o += kPerWord;
                i += kPerWord;
                continue;
            }
        }
        const uint32_t c = u[i++];
        if (sizeof(Unit) > 1 && (c & 0xFFFFF800u) == 0xD800) return SIZE_MAX;
        o = put_utf8(c, o);
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
