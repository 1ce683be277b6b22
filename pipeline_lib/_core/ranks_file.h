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

inline int base64_value(uint8_t c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

inline bool is_blank(uint8_t c) { return c == ' ' || c == '\t'; }

// Strict base64 (binascii.a2b_base64(strict_mode=True)) of p[0:n], appended to out: groups
// of four, at most two '=' and only at the end. As CPython, leftover bits are not checked.
inline bool decode_base64(const uint8_t* p, size_t n, std::string& out) {
    if (n == 0 || n % 4 != 0) return false;
    size_t pad = 0;
    while (pad < 2 && p[n - 1 - pad] == '=') ++pad;
    const size_t chars = n - pad;
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < chars; ++i) {
        const int v = base64_value(p[i]);
        if (v < 0) return false;
        acc = (acc << 6) | static_cast<uint32_t>(v);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out.push_back(static_cast<char>((acc >> bits) & 0xFF));
        }
    }
    return true;
}

}  // namespace detail

// Every line of p[0:n] decoded into `bytes` and `lines`; false where a line is not
// `[ \t]*base64[ \t]+digits[ \t]*` or blank, a token is longer than kMaxTokenBytes or a rank
// is not below kMaxVocabSize. Lines end with \n, \r\n or \r; the last may end the data.
inline bool parse_rank_lines(const uint8_t* p, size_t n, std::string& bytes, std::vector<RankLine>& lines) {
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
        const size_t off = bytes.size();
        if (!detail::decode_base64(p + token_start, token_end - token_start, bytes)) return false;
        if (bytes.size() - off > kMaxTokenBytes) return false;
        lines.push_back(RankLine{off, static_cast<uint32_t>(bytes.size() - off), static_cast<uint32_t>(rank)});
    }
    return true;
}

}  // namespace tokcore
