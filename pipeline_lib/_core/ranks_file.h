// The lines of a tiktoken ranks file (`base64(token) rank`), decoded without Python objects.
//
// Accepts exactly what pipeline_lib.tokenizer.load's fast path accepts (its _RANKS_BLOCK
// regex, then strict base64 and the limits), and nothing else: a file this rejects is
// parsed again in Python, which names its bad line.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "encode.h"

namespace tokcore {

struct RankLine {
    size_t token_off;  // into the decoded bytes
    uint32_t token_len;
    uint32_t rank;
};

namespace detail {

// Each byte's base64 value, -1 for a byte that is none.
struct Base64Values {
    int8_t v[256];
    constexpr Base64Values() : v{} {
        for (int c = 0; c < 256; ++c) v[c] = -1;
        for (int k = 0; k < 26; ++k) v['A' + k] = static_cast<int8_t>(k), v['a' + k] = static_cast<int8_t>(k + 26);
        for (int k = 0; k < 10; ++k) v['0' + k] = static_cast<int8_t>(k + 52);
        v['+'] = 62;
        v['/'] = 63;
    }
};
inline constexpr Base64Values kBase64{};

inline int base64_value(uint8_t c) { return kBase64.v[c]; }

inline bool is_blank(uint8_t c) { return c == ' ' || c == '\t'; }

// Strict base64 (binascii.a2b_base64(strict_mode=True)) of p[0:n], written at out (room for
// n * 3 / 4 bytes), whose end it returns, or nullptr: groups of four, at most two '=' and only
// at the end. As CPython, leftover bits are not checked.
inline char* decode_base64(const uint8_t* p, size_t n, char* out) {
    if (n == 0 || n % 4 != 0) return nullptr;
    size_t pad = 0;
    while (pad < 2 && p[n - 1 - pad] == '=') ++pad;
    const size_t chars = n - pad;
    size_t i = 0;
    for (; i + 4 <= chars; i += 4) {
        const int a = base64_value(p[i]), b = base64_value(p[i + 1]), c = base64_value(p[i + 2]),
                  d = base64_value(p[i + 3]);
        if ((a | b | c | d) < 0) return nullptr;
        const uint32_t v = static_cast<uint32_t>(a) << 18 | static_cast<uint32_t>(b) << 12 |
                           static_cast<uint32_t>(c) << 6 | static_cast<uint32_t>(d);
        *out++ = static_cast<char>(v >> 16);
        *out++ = static_cast<char>(v >> 8);
        *out++ = static_cast<char>(v);
    }
    uint32_t acc = 0;
    int bits = 0;
    for (; i < chars; ++i) {
        const int v = base64_value(p[i]);
        if (v < 0) return nullptr;
        acc = (acc << 6) | static_cast<uint32_t>(v);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            *out++ = static_cast<char>((acc >> bits) & 0xFF);
        }
    }
    return out;
}

}  // namespace detail

// Every line of p[0:n] decoded into `bytes` and `lines`; false where a line is not
// `[ \t]*base64[ \t]+digits[ \t]*` or blank, a token is longer than kMaxTokenBytes or a rank
// is not below kMaxVocabSize. Lines end with \n, \r\n or \r; the last may end the data.
inline bool parse_rank_lines(const uint8_t* p, size_t n, std::string& bytes, std::vector<RankLine>& lines) {
    // Decoded into a buffer sized once (a token's bytes are at most 3/4 of its base64), cut to
    // what was written at the end.
    const size_t base = bytes.size();
    bytes.resize(base + n / 4 * 3 + 3);
    char* const start = bytes.data();
    char* w = start + base;
    struct Cut {
        std::string& bytes;
        char*& w;
        ~Cut() { bytes.resize(static_cast<size_t>(w - bytes.data())); }
    } cut{bytes, w};
    size_t i = 0;
    while (i < n) {
        while (i < n && detail::is_blank(p[i])) ++i;
        if (i == n) break;
        if (p[i] == '\n' || p[i] == '\r') {  // a blank line
            i += (p[i] == '\r' && i + 1 < n && p[i + 1] == '\n') ? 2 : 1;
            continue;
        }
        const size_t token_start = i;
        while (i < n && detail::base64_value(p[i]) >= 0) ++i;
        size_t pads = 0;
        while (i < n && p[i] == '=' && pads < 2) ++i, ++pads;
        const size_t token_end = i;
        if (token_end - pads == token_start || i == n || !detail::is_blank(p[i])) return false;
        while (i < n && detail::is_blank(p[i])) ++i;
        uint64_t rank = 0;
        const size_t digits_start = i;
        while (i < n && p[i] >= '0' && p[i] <= '9') {
            rank = rank * 10 + (p[i] - '0');
            if (rank >= kMaxVocabSize) return false;
            ++i;
        }
        if (i == digits_start) return false;
        while (i < n && detail::is_blank(p[i])) ++i;
        if (i < n) {
            if (p[i] == '\r') i += (i + 1 < n && p[i + 1] == '\n') ? 2 : 1;
            else if (p[i] == '\n') ++i;
            else return false;
        }
        char* const end = detail::decode_base64(p + token_start, token_end - token_start, w);
        if (end == nullptr || static_cast<size_t>(end - w) > kMaxTokenBytes) return false;
        lines.push_back(RankLine{static_cast<size_t>(w - start), static_cast<uint32_t>(end - w), static_cast<uint32_t>(rank)});
        w = end;
    }
    return true;
}

}  // namespace tokcore
