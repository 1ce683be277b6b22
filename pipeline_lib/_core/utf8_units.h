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

// The UTF-8 of units[0:n] (of `kind` bytes each) into out, which has room for
// n * utf8_bytes_per_unit(kind) bytes; returns the bytes written, or SIZE_MAX at a surrogate
// code point (UTF-8 cannot hold one: Python's own conversion raises UnicodeEncodeError there).
inline size_t utf8_from_units(const void* units, size_t n, unsigned kind, uint8_t* out) {
    uint8_t* o = out;
    size_t i = 0;
    auto put = [&](uint32_t c) {
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
    };
    // Runs of ASCII (most of the text in many languages: spaces, digits, punctuation, markup)
    // eight bytes of units at a time.
    if (kind == 1) {
        const uint8_t* u = static_cast<const uint8_t*>(units);
        while (i < n) {
            if (i + 8 <= n) {
                uint64_t w;
                std::memcpy(&w, u + i, 8);
                if ((w & 0x8080808080808080ull) == 0) {
                    std::memcpy(o, &w, 8);
                    o += 8;
                    i += 8;
                    continue;
                }
            }
            put(u[i++]);
        }
    } else if (kind == 2) {
        const uint16_t* u = static_cast<const uint16_t*>(units);
        while (i < n) {
            if (i + 4 <= n) {
                uint64_t w;
                std::memcpy(&w, u + i, 8);
                if ((w & 0xFF80FF80FF80FF80ull) == 0) {
                    for (int k = 0; k < 4; ++k) o[k] = static_cast<uint8_t>(w >> (16 * k));
                    o += 4;
                    i += 4;
                    continue;
                }
            }
            const uint32_t c = u[i++];
            if ((c & 0xF800) == 0xD800) return SIZE_MAX;
            put(c);
        }
    } else {
        const uint32_t* u = static_cast<const uint32_t*>(units);
        while (i < n) {
            if (i + 2 <= n) {
                uint64_t w;
                std::memcpy(&w, u + i, 8);
                if ((w & 0xFFFFFF80FFFFFF80ull) == 0) {
                    o[0] = static_cast<uint8_t>(w);
                    o[1] = static_cast<uint8_t>(w >> 32);
                    o += 2;
                    i += 2;
                    continue;
                }
            }
            const uint32_t c = u[i++];
            if ((c & 0xFFFFF800) == 0xD800) return SIZE_MAX;
            put(c);
        }
    }
    return static_cast<size_t>(o - out);
}

}  // namespace tokcore
