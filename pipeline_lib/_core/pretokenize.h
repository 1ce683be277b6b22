// Hand-written pre-tokenizers for the three split patterns of pipeline_lib/patterns.py.
//
// Each `*_piece(s, n, i)` returns the end of the regex match that starts at byte i, i.e.
// what `regex.findall` would produce there. None of the patterns can fail to match a
// non-empty remainder, so the pieces tile the input. Every decision below is annotated
// with the alternative of the pattern it implements; comments use
//   L = \p{L}, N = \p{N}, S = \s, "other" = [^\s\p{L}\p{N}]
//   Up = [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}], Lo = [\p{Ll}\p{Lm}\p{Lo}\p{M}]   (o200k)
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#if defined(__SSE2__) && !defined(TOKCORE_NO_SIMD)
#include <emmintrin.h>
#endif
#if defined(__x86_64__) && !defined(TOKCORE_NO_SIMD)
#include <immintrin.h>
#define TOKCORE_AVX2_WINDOW 1
#endif

#include "hashing.h"
#include "unicode.h"

namespace tokcore {

// kNoSplit: no split, a whole document is one piece (minbpe's BasicTokenizer).
enum PatternId : int { kGpt2 = 0, kCl100k = 1, kO200k = 2, kNoSplit = 3 };
constexpr int kNumPatterns = 4;

namespace pretok {

constexpr size_t npos = static_cast<size_t>(-1);

// Loops over the pieces of a text hand the bytes they have done to the cancellation poll
// (cancel.h) once this many have passed, not per piece: a poll per piece, whose counter the
// compiler must keep in memory, costs as much as pre-tokenizing an English word.
constexpr size_t kPollBytes = size_t{1} << 12;

inline bool is_other(uint8_t f) { return (f & (kFlagL | kFlagN | kFlagS)) == 0; }
inline bool is_crlf(uint32_t cp) { return cp == '\r' || cp == '\n'; }

// Number of leading ASCII letters ([A-Za-z]) among the 8 bytes of w, first byte lowest.
// Per byte: OR 0x20 folds A-Z onto a-z, and adding 0x1F / 0x05 to the low 7 bits sets bit 7
// iff they are >= 'a' / > 'z' (no carry crosses a byte).
inline unsigned ascii_letters(uint64_t w) {
    constexpr uint64_t k01 = 0x0101010101010101ull, k80 = 0x80 * k01;
    const uint64_t low7 = (w | 0x20 * k01) & ~k80;
    const uint64_t letter = (low7 + (0x80 - 'a') * k01) & ~(low7 + (0x80 - 'z' - 1) * k01) & ~w & k80;
    const uint64_t other = ~letter & k80;
    return other ? static_cast<unsigned>(__builtin_ctzll(other)) / 8 : 8;
}

// Number of leading bytes of w in [lo, hi] (ASCII, hi - lo < 0x7F), first byte lowest: the
// same carry-free comparisons as ascii_letters without the case fold.
inline unsigned ascii_in_range(uint64_t w, uint8_t lo, uint8_t hi) {
    constexpr uint64_t k01 = 0x0101010101010101ull, k80 = 0x80 * k01;
    const uint64_t low7 = w & ~k80;
    const uint64_t in = (low7 + (0x80 - lo) * k01) & ~(low7 + (0x80 - hi - 1) * k01) & ~w & k80;
    const uint64_t other = ~in & k80;
    return other ? static_cast<unsigned>(__builtin_ctzll(other)) / 8 : 8;
}

// End of the maximal run, starting at i, of characters whose flags have any bit of `mask`.
[[gnu::always_inline]] inline size_t run_any(const uint8_t* s, size_t n, size_t i, uint8_t mask) {
    // Runs of ASCII letters -- most of the bytes of most text -- 8 bytes at a time.
    if (mask == kFlagL) {
        while (i + 8 <= n) {
            uint64_t w;
            std::memcpy(&w, s + i, 8);
            const unsigned k = ascii_letters(w);
            i += k;
            if (k < 8) break;
        }
    } else if (mask == kFlagLo || mask == kFlagUp) {  // o200k's cased classes: a-z / A-Z
        const uint8_t lo = mask == kFlagLo ? 'a' : 'A';
        while (i + 8 <= n) {
            uint64_t w;
            std::memcpy(&w, s + i, 8);
            const unsigned k = ascii_in_range(w, lo, static_cast<uint8_t>(lo + 25));
            i += k;
            if (k < 8) break;
        }
    }
    while (i < n) {
        const uint8_t b = s[i];
        if (b < 0x80) {
            if (!(ascii_flags(b) & mask)) break;
            ++i;
        } else {
            const Char c = char_at_wide(s, n, i);
            if (!(c.flags & mask)) break;
            i += c.len;
        }
    }
    return i;
}

// End of the maximal run of "other" characters ([^\s\p{L}\p{N}]) starting at i.
inline size_t run_other(const uint8_t* s, size_t n, size_t i) {
    while (i < n) {
        const Char c = char_at(s, n, i);
        if (!is_other(c.flags)) break;
        i += c.len;
    }
    return i;
}

// A maximal run of whitespace starting at i (s[i] is whitespace).
struct WsRun {
    size_t end;         // first byte after the run
    size_t last_start;  // start of the run's last character
    size_t crlf_end;    // end of the run's last \r or \n, or npos
    bool multi;         // run has at least two characters
};

inline WsRun ws_run(const uint8_t* s, size_t n, size_t i) {
    WsRun r{i, i, npos, false};
    size_t count = 0;
    // Long runs of spaces (indentation, padding) 8 bytes at a time.
    constexpr uint64_t kSpaces = 0x2020202020202020ull;
    for (uint64_t w; i + 8 <= n && (std::memcpy(&w, s + i, 8), w == kSpaces);) {
        i += 8;
        count += 8;
        r.last_start = i - 1;
    }
    while (i < n) {
        const Char c = char_at(s, n, i);
        if (!(c.flags & kFlagS)) break;
        if (is_crlf(c.cp)) r.crlf_end = i + 1;
        r.last_start = i;
        i += c.len;
        ++count;
    }
    r.end = i;
    r.multi = count >= 2;
    return r;
}

// Case-insensitive contraction after an apostrophe at s[i]:
// '(?i:[sdmt]|ll|ve|re) -- the same set as o200k's (?i:'s|'t|'re|'ve|'m|'ll|'d).
// Returns the end of the match or npos.
inline size_t contraction_ci(const uint8_t* s, size_t n, size_t i) {
    if (i >= n || s[i] != '\'' || i + 1 >= n) return npos;
    const Char d = char_at(s, n, i + 1);
    const char x = contraction_letter(d);
    if (x == 0) return npos;
    const size_t j = i + 1 + d.len;
    if (x == 's' || x == 'd' || x == 'm' || x == 't') return j;
    if (j >= n) return npos;
    const char y = contraction_letter(char_at(s, n, j));
    if ((x == 'l' && y == 'l') || (x == 'v' && y == 'e') || (x == 'r' && y == 'e'))
        return j + char_at(s, n, j).len;
    return npos;
}

// Whitespace alternatives shared by GPT-2 and cl100k (cl100k adds \s*[\r\n]):
//   \s++$        the run reaches the end of the text: take all of it
//   \s*[\r\n]    (cl100k only) up to and including the run's last \r or \n
//   \s+(?!\S)    a run of >= 2 characters gives back its last one
//   \s           otherwise a single character
inline size_t whitespace_piece(const uint8_t* s, size_t n, size_t i, bool crlf_alt) {
    const WsRun r = ws_run(s, n, i);
    if (r.end == n) return n;
    if (crlf_alt && r.crlf_end != npos) return r.crlf_end;
    if (r.multi) return r.last_start;
    return r.end;
}

// GPT-2:  '(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s
[[gnu::always_inline]] inline size_t gpt2_piece(const uint8_t* s, size_t n, size_t i) {
    // '(?:[sdmt]|ll|ve|re) -- case-sensitive, ASCII only
    if (s[i] == '\'' && i + 1 < n) {
        const uint8_t b = s[i + 1];
        if (b == 's' || b == 'd' || b == 'm' || b == 't') return i + 2;
        if (i + 2 < n) {
            const uint8_t b2 = s[i + 2];
            if ((b == 'l' && b2 == 'l') || (b == 'v' && b2 == 'e') || (b == 'r' && b2 == 'e')) return i + 3;
        }
    }
    Char c = char_at(s, n, i);
    size_t j = i;
    // " ?" -- a space joins a following letter / number / other run
    if (c.cp == ' ' && i + 1 < n) {
        const Char d = char_at(s, n, i + 1);
        if (!(d.flags & kFlagS)) {
            c = d;
            j = i + 1;
        }
    }
    if (c.flags & kFlagL) return run_any(s, n, j + c.len, kFlagL);  //  ?\p{L}++
    if (c.flags & kFlagN) return run_any(s, n, j + c.len, kFlagN);  //  ?\p{N}++
    if (!(c.flags & kFlagS)) return run_other(s, n, j + c.len);     //  ?[^\s\p{L}\p{N}]++
    return whitespace_piece(s, n, i, false);
}

// cl100k:  '(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+
//          | ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s
[[gnu::always_inline]] inline size_t cl100k_piece(const uint8_t* s, size_t n, size_t i) {
    if (s[i] == '\'') {
        const size_t e = contraction_ci(s, n, i);
        if (e != npos) return e;
    }
    const Char c = char_at(s, n, i);
    // [^\r\n\p{L}\p{N}]?+\p{L}++
    if (c.flags & kFlagL) return run_any(s, n, i + c.len, kFlagL);
    if (!(c.flags & kFlagN) && !is_crlf(c.cp) && i + c.len < n) {
        const Char d = char_at(s, n, i + c.len);
        if (d.flags & kFlagL) return run_any(s, n, i + c.len + d.len, kFlagL);
    }
    // \p{N}{1,3}+
    if (c.flags & kFlagN) {
        size_t j = i + c.len;
        for (int k = 1; k < 3 && j < n; ++k) {
            const Char d = char_at(s, n, j);
            if (!(d.flags & kFlagN)) break;
            j += d.len;
        }
        return j;
    }
    //  ?[^\s\p{L}\p{N}]++[\r\n]*+
    {
        Char e = c;
        size_t j = i;
        if (c.cp == ' ' && i + 1 < n) {
            const Char d = char_at(s, n, i + 1);
            if (is_other(d.flags)) {
                e = d;
                j = i + 1;
            }
        }
        if (is_other(e.flags)) {
            size_t k = run_other(s, n, j + e.len);
            while (k < n && (s[k] == '\r' || s[k] == '\n')) ++k;
            return k;
        }
    }
    return whitespace_piece(s, n, i, true);
}

// o200k contraction suffix (?i:'s|'t|'re|'ve|'m|'ll|'d)? at position r.
inline size_t o200k_suffix(const uint8_t* s, size_t n, size_t r) {
    if (r >= n || s[r] != '\'') return r;  // most words: no call
    const size_t e = contraction_ci(s, n, r);
    return e == npos ? r : e;
}

inline bool ascii_upper(uint8_t b) { return static_cast<uint8_t>(b - 'A') < 26; }
inline bool ascii_lower(uint8_t b) { return static_cast<uint8_t>(b - 'a') < 26; }

// The letter alternatives of o200k_piece when the letters start with ASCII at j (j = i, or
// i + 1 after an ASCII prefix character): the end of the piece, npos when s[j] is no ASCII
// letter, or kAsk when a non-ASCII byte decides (o200k_piece then takes the general path).
constexpr size_t kAsk = npos - 1;
[[gnu::always_inline]] inline size_t o200k_ascii_letters(const uint8_t* s, size_t n, size_t j) {
    if (j >= n) return npos;
    const uint8_t b = s[j];
    if (!ascii_upper(b) && !ascii_lower(b)) return b < 0x80 ? npos : kAsk;
    // [Up]* over A-Z: ASCII capitals are Lu only (none is also Lo, so nothing to give back)
    size_t q = j;
    while (q + 8 <= n) {
        uint64_t w;
        std::memcpy(&w, s + q, 8);
        const unsigned k = ascii_in_range(w, 'A', 'Z');
        q += k;
        if (k < 8) break;
    }
    while (q < n && ascii_upper(s[q])) ++q;
    if (q < n && s[q] >= 0x80) return kAsk;  // a non-ASCII Up character may continue the run
    if (q < n && ascii_lower(s[q])) return o200k_suffix(s, n, run_any(s, n, q, kFlagLo));  // [Lo]+
    // no Lo after the capitals: [Up]*[Lo]+ fails, [Up]+[Lo]* takes the capitals (q > j here)
    return o200k_suffix(s, n, q);
}

// [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:...)? at p, with backtracking:
// Up* takes its maximal run [p, q); if the next character is Lo, Lo+ runs on from there.
// Otherwise Up* gives characters back until one that is also Lo (Lm/Lo/M) can be Lo+'s
// single character: the last Lo-class character of the run.
inline size_t o200k_letters_lower(const uint8_t* s, size_t n, size_t p) {
    size_t q = p, last_lo_end = npos;
    while (q < n) {
        const Char d = char_at_wide(s, n, q);
        if (!(d.flags & kFlagUp)) {
            if (d.flags & kFlagLo) return o200k_suffix(s, n, run_any(s, n, q + d.len, kFlagLo));
            break;
        }
        q += d.len;
        if (d.flags & kFlagLo) last_lo_end = q;
    }
    if (last_lo_end != npos) return o200k_suffix(s, n, last_lo_end);
    return npos;
}

// [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:...)? at p.
inline size_t o200k_letters_upper(const uint8_t* s, size_t n, size_t p) {
    if (p >= n) return npos;
    const Char d = char_at_wide(s, n, p);
    if (!(d.flags & kFlagUp)) return npos;
    const size_t q = run_any(s, n, p + d.len, kFlagUp);
    return o200k_suffix(s, n, run_any(s, n, q, kFlagLo));
}

// o200k (no possessive quantifiers; the regex backtracks):
//   [^\r\n\p{L}\p{N}]?[Up]*[Lo]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?
//  |[^\r\n\p{L}\p{N}]?[Up]+[Lo]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?
//  |\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
[[gnu::always_inline]] inline size_t o200k_piece(const uint8_t* s, size_t n, size_t i) {
    // ASCII fast path: a word, or a space / punctuation character and a word
    {
        const uint8_t b = s[i];
        if (b < 0x80) {
            const uint8_t f = ascii_flags(b);
            size_t r = npos;
            if (f & kFlagL) {
                r = o200k_ascii_letters(s, n, i);
            } else if (!(f & kFlagN) && b != '\r' && b != '\n') {
                r = o200k_ascii_letters(s, n, i + 1);
            }
            if (r < kAsk) return r;
        }
    }
    const Char c = char_at_wide(s, n, i);
    // The optional prefix is tried first (greedy), then without it.
    const bool prefix = !(c.flags & (kFlagL | kFlagN)) && !is_crlf(c.cp);
    const bool lettery = (c.flags & (kFlagUp | kFlagLo)) != 0;
    size_t r;
    if (prefix && i + c.len < n && (r = o200k_letters_lower(s, n, i + c.len)) != npos) return r;
    if (lettery && (r = o200k_letters_lower(s, n, i)) != npos) return r;
    if (prefix && i + c.len < n && (r = o200k_letters_upper(s, n, i + c.len)) != npos) return r;
    if (lettery && (r = o200k_letters_upper(s, n, i)) != npos) return r;
    // \p{N}{1,3}
    if (c.flags & kFlagN) {
        size_t j = i + c.len;
        for (int k = 1; k < 3 && j < n; ++k) {
            const Char d = char_at_wide(s, n, j);
            if (!(d.flags & kFlagN)) break;
            j += d.len;
        }
        return j;
    }
    //  ?[^\s\p{L}\p{N}]+[\r\n/]*
    {
        Char e = c;
        size_t j = i;
        if (c.cp == ' ' && i + 1 < n) {
            const Char d = char_at_wide(s, n, i + 1);
            if (is_other(d.flags)) {
                e = d;
                j = i + 1;
            }
        }
        if (is_other(e.flags)) {
            size_t k = run_other(s, n, j + e.len);
            while (k < n && (s[k] == '\r' || s[k] == '\n' || s[k] == '/')) ++k;
            return k;
        }
    }
    // \s*[\r\n]+ : \s* backs off to the run's last \r/\n, [\r\n]+ takes just that one.
    // \s+(?!\S) : the whole run at the end of text, else all but its last character.
    // \s+       : a single whitespace character followed by non-space.
    const WsRun w = ws_run(s, n, i);
    if (w.crlf_end != npos) return w.crlf_end;
    if (w.end == n) return n;
    if (w.multi) return w.last_start;
    return w.end;
}

// ---- ASCII pieces, 16 bytes at a time --------------------------------------------------------
// Most pieces of English text and source code are ASCII: a word with at most one character
// before it (" the", "(self"), a run of punctuation ("," or ");\n"), of whitespace, or up to
// three digits. ascii_piece_end finds such a piece from one 16-byte load and a few bit masks
// and declines (returns 0) whenever a character it does not classify could decide the match:
// a non-ASCII byte where the piece could go on (a letter, mark, digit, punctuation or space
// of another script), an apostrophe that may start a contraction, or a run that reaches the
// 16th byte. The caller then takes the general *_piece function; both give the same pieces
// (tests/test_core_fastpaths.py compares them on random text; tests/test_core_swar.py the
// SSE2 and SWAR builds of the masks).

// Bit k of each mask: byte k of the 16 at p is in the class.
#if defined(__SSE2__) && !defined(TOKCORE_NO_SIMD)
struct Bytes16 {
    __m128i x;
    explicit Bytes16(const uint8_t* p) : x(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))) {}
    // bytes in [lo, lo + count): x + (0x80 - lo) is then in [-128, -128 + count) as a signed byte
    uint32_t range(uint8_t lo, uint8_t count) const {
        const __m128i shifted = _mm_add_epi8(x, _mm_set1_epi8(static_cast<char>(0x80 - lo)));
        return static_cast<uint32_t>(
            _mm_movemask_epi8(_mm_cmplt_epi8(shifted, _mm_set1_epi8(static_cast<char>(-128 + count)))));
    }
    uint32_t equal(uint8_t c) const {
        return static_cast<uint32_t>(_mm_movemask_epi8(_mm_cmpeq_epi8(x, _mm_set1_epi8(static_cast<char>(c)))));
    }
    uint32_t high() const { return static_cast<uint32_t>(_mm_movemask_epi8(x)); }
};
#else
// The same masks from two 64-bit words (SWAR), for targets without SSE2.
struct Bytes16 {
    uint64_t w[2];
    explicit Bytes16(const uint8_t* p) { std::memcpy(w, p, 16); }
    static uint32_t top_bits(uint64_t m) { return static_cast<uint32_t>(((m >> 7) * 0x0102040810204080ull) >> 56); }
    template <class F>
    uint32_t each(F f) const {
        return top_bits(f(w[0])) | (top_bits(f(w[1])) << 8);
    }
    uint32_t range(uint8_t lo, uint8_t count) const {
        constexpr uint64_t k01 = 0x0101010101010101ull, k80 = 0x80 * k01;
        return each([&](uint64_t v) {
            const uint64_t low7 = v & ~k80;
            return (low7 + (0x80 - lo) * k01) & ~(low7 + (0x80 - lo - count) * k01) & ~v & k80;
        });
    }
    uint32_t equal(uint8_t c) const {
        constexpr uint64_t k01 = 0x0101010101010101ull, k80 = 0x80 * k01;
        return each([&](uint64_t v) {
            const uint64_t q = v ^ (c * k01);  // zero bytes where v has c
            return ~(((q & ~k80) + ~k80) | q) & k80;
        });
    }
    uint32_t high() const {
        return each([](uint64_t v) { return v & 0x8080808080808080ull; });
    }
};
#endif

// Bit 0: the byte may stand before an ASCII word in a cl100k piece, bit 1: in an o200k piece,
// i.e. [^\r\n\p{L}\p{N}] and ASCII (cl100k: not an apostrophe, whose contraction comes first).
struct WordPrefixTable {
    uint8_t bits[256];
    constexpr WordPrefixTable() : bits{} {
        for (int b = 0; b < 0x80; ++b) {
            const bool letter = (b >= 'A' && b <= 'Z') || (b >= 'a' && b <= 'z');
            const bool digit = b >= '0' && b <= '9';
            if (letter || digit || b == '\r' || b == '\n') continue;
            bits[b] = b == '\'' ? 2 : 3;
        }
    }
};
inline constexpr WordPrefixTable kWordPrefix{};

inline uint32_t ctz32(uint32_t m) { return static_cast<uint32_t>(__builtin_ctz(m)); }

// The pieces that are not a word: digits, punctuation, whitespace (see ascii_piece_end).
template <int Pattern>
inline size_t ascii_nonword_end(const Bytes16& v, uint32_t letters, uint8_t b0) {
    const uint32_t high = v.high();
    const uint32_t digit = v.range('0', 10);
    // \s over ASCII: \t \n \v \f \r and the space
    const uint32_t space = v.range('\t', 5) | v.equal(' ');
    if (digit & 1) {  // \p{N}{1,3}
        const uint32_t run = ctz32(~digit);
        if (run >= 3) return 3;
        return (high >> run) & 1 ? 0 : run;  // a digit of another script may follow
    }
    const uint32_t other = ~(letters | digit | space | high) & 0xFFFFu;
    if ((other & 1) || (b0 == ' ' && (other & 2))) {
        //  ?[^\s\p{L}\p{N}]++[\r\n]*+   (o200k:  ?[^\s\p{L}\p{N}]+[\r\n/]*)
        if (Pattern == kCl100k && b0 == '\'') return 0;  // a contraction comes first
        const uint32_t j = other & 1 ? 0 : 1;
        const uint32_t k = j + ctz32(~(other >> j));
        if (k >= 16 || ((high >> k) & 1)) return 0;
        uint32_t tail = v.equal('\r') | v.equal('\n');
        if (Pattern == kO200k) tail |= v.equal('/');
        const uint32_t e = k + ctz32(~(tail >> k));
        return e >= 16 ? 0 : e;
    }
    if (space & 1) {
        const uint32_t run = ctz32(~space);
        if (run >= 16 || ((high >> run) & 1)) return 0;  // a space of another script may follow
        // (the run ends before a non-space, so \s++$ cannot apply)
        // cl100k \s*[\r\n], o200k \s*[\r\n]+: up to the run's last \r or \n
        const uint32_t crlf = (v.equal('\r') | v.equal('\n')) & ((1u << run) - 1);
        if (crlf) return 32 - static_cast<uint32_t>(__builtin_clz(crlf));
        return run >= 2 ? run - 1 : 1;  // \s+(?!\S) gives back the last one; else \s (o200k \s+)
    }
    return 0;
}

// End (1..15) of the piece at p when it is ASCII and decided by these 16 bytes, else 0.
// Needs 16 readable bytes at p, and is used only where the text goes on past them (the run
// tests read "the byte after the run" inside the 16).
//   cl100k: [^\r\n\p{L}\p{N}]?+\p{L}++ (after the contraction alternative: no apostrophe at p)
//   o200k:  [^\r\n\p{L}\p{N}]?[Up]*[Lo]+(contraction)? | [^\r\n\p{L}\p{N}]?[Up]+[Lo]*(contraction)?
//           over ASCII: capitals, then small letters (ASCII capitals are not [Lo], so nothing is
//           given back); an apostrophe after the word declines.
template <int Pattern>
[[gnu::always_inline]] inline size_t ascii_piece_end(const uint8_t* p) {
    const Bytes16 v(p);
    const uint32_t upper = v.range('A', 26), lower = v.range('a', 26);
    const uint32_t letters = upper | lower;
    const uint8_t b0 = p[0];
    // The word starts at 1 after a prefix character, else at 0 (a letter there, or no word): one
    // branch on "a word", not one on each way of being one, which text makes unpredictable.
    const uint32_t start = (kWordPrefix.bits[b0] >> (Pattern == kCl100k ? 0 : 1)) & 1;
    if (!((letters >> start) & 1)) return ascii_nonword_end<Pattern>(v, letters, b0);
    uint32_t end;
    if (Pattern == kCl100k) {
        const uint32_t after = ~letters & (0xFFFFu << start) & 0xFFFFu;  // non-letters from `start` on
        if (after == 0) return 0;
        end = ctz32(after);
        if ((v.high() >> end) & 1) return 0;
    } else {
        const uint32_t q = start + ctz32(~(upper >> start));
        end = q + ctz32(~(lower >> q));
        if (end >= 16 || (((v.high() | v.equal('\'')) >> end) & 1)) return 0;
    }
    return end;
}

// ---- ASCII pieces, 64 bytes at a time ------------------------------------------------------
// Where the text is ASCII, the pieces of cl100k and o200k can be found for 64 bytes at once: each
// byte class becomes a 64-bit mask (bit k: byte k), and the bytes where a piece starts follow from
// a few shifts of those masks, with no branch per piece. `window_starts` gives them for a window
// that begins at a piece's start (the byte before it plays no part: it is taken to be none of the
// classes below). Over ASCII, a piece starts at:
//   * a letter whose byte before is no letter and no prefix: [^\r\n\p{L}\p{N}]? takes the byte
//     before a letter run when that byte starts a piece and is a space, \t \v \f, or punctuation
//     -- punctuation starts a piece where it follows no punctuation and no space (a space before
//     punctuation takes it:  ?[^\s\p{L}\p{N}]+);
//   * o200k: a capital after a small letter ([Up]*[Lo]+ and [Up]+[Lo]* end there);
//   * such punctuation. cl100k: an apostrophe among it may start a contraction, whose piece ends
//     2 or 3 bytes on ('s 'll), inside a letter run when letters follow. o200k: an apostrophe
//     right after a letter and followed by a contraction ends the letters' piece after it;
//   * the first digit of a run and every third digit after it (\p{N}{1,3});
//   * the first byte of a whitespace run -- but not the \r \n right after punctuation, which
//     [\r\n]* (o200k: [\r\n/]*) takes with it;
//   * the run's last byte when it is no \r or \n (\s+(?!\S) leaves it, and it starts the next
//     piece, alone or with a letter run or punctuation), and the byte after the run's last \r or
//     \n when more whitespace follows it up to the run's end (\s*[\r\n]).
// A piece's start at k is decided by bytes up to k + 1 and by the end of its whitespace run, so
// starts are trusted up to byte 62, and up to two bytes before the first non-ASCII byte.
// tests/test_core_fastpaths.py compares the pieces with the regex's and the general functions'.

struct Masks64 {
    uint64_t upper, lower, digit, space, tabs, crlf, apostrophe, slash;  // ASCII classes only
};

// Bit k of each mask: byte k of the 64 at p is in the class (tabs: \t \v \f; crlf: \r \n).
[[gnu::always_inline]] inline Masks64 classify64(const uint8_t* p) {
    Masks64 m{};
    for (unsigned c = 0; c < 4; ++c) {
        const Bytes16 v(p + 16 * c);
        const unsigned at = 16 * c;
        const uint32_t crlf = v.equal('\r') | v.equal('\n');
        m.upper |= uint64_t{v.range('A', 26)} << at;
        m.lower |= uint64_t{v.range('a', 26)} << at;
        m.digit |= uint64_t{v.range('0', 10)} << at;
        m.space |= uint64_t{v.equal(' ')} << at;
        m.tabs |= uint64_t{v.range('\t', 5) & ~crlf} << at;
        m.crlf |= uint64_t{crlf} << at;
        m.apostrophe |= uint64_t{v.equal('\'')} << at;
        m.slash |= uint64_t{v.equal('/')} << at;
    }
    return m;
}

#if TOKCORE_AVX2_WINDOW
// The same masks from two 32-byte loads, on CPUs with AVX2 (most x86-64 since 2013). Not
// inlined: the core is built for any x86-64, and a function compiled for AVX2 can only be
// called, behind the CPU check of `avx2_window()`.
[[gnu::target("avx2"), gnu::noinline]] inline Masks64 classify64_avx2(const uint8_t* p) {
    const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32));
    auto bits = [](__m256i a, __m256i b) __attribute__((target("avx2"))) {
        return static_cast<uint64_t>(static_cast<uint32_t>(_mm256_movemask_epi8(a))) |
               (static_cast<uint64_t>(static_cast<uint32_t>(_mm256_movemask_epi8(b))) << 32);
    };
    // bytes in [first, first + count): x + (0x80 - first) below -128 + count, as signed bytes
    auto range = [&](uint8_t first, uint8_t count) __attribute__((target("avx2"))) {
        const __m256i shift = _mm256_set1_epi8(static_cast<char>(0x80 - first));
        const __m256i limit = _mm256_set1_epi8(static_cast<char>(-128 + count));
        return bits(_mm256_cmpgt_epi8(limit, _mm256_add_epi8(lo, shift)),
                    _mm256_cmpgt_epi8(limit, _mm256_add_epi8(hi, shift)));
    };
    auto equal = [&](uint8_t c) __attribute__((target("avx2"))) {
        const __m256i x = _mm256_set1_epi8(static_cast<char>(c));
        return bits(_mm256_cmpeq_epi8(lo, x), _mm256_cmpeq_epi8(hi, x));
    };
    Masks64 m;
    m.crlf = equal('\r') | equal('\n');
    m.upper = range('A', 26);
    m.lower = range('a', 26);
    m.digit = range('0', 10);
    m.space = equal(' ');
    m.tabs = range('\t', 5) & ~m.crlf;
    m.apostrophe = equal('\'');
    m.slash = equal('/');
    return m;
}

// Whether windows classify with AVX2: the CPU has it, and TOKENMILL_NO_AVX2 is not set (the
// tests compare the two ways).
inline bool avx2_window() {
    static const bool on = __builtin_cpu_supports("avx2") && std::getenv("TOKENMILL_NO_AVX2") == nullptr;
    return on;
}
#endif

// Length of the contraction at the apostrophe p[0] ('s 'd 'm 't: 2; 'll 've 're: 3; any case),
// or 0.
inline unsigned ascii_contraction(const uint8_t* p) {
    const uint8_t x = p[1] | 0x20, y = p[2] | 0x20;  // | 0x20 gives these letters only from A-Z a-z
    if (x == 's' || x == 'd' || x == 'm' || x == 't') return 2;
    if ((x == 'l' && y == 'l') || (x == 'v' && y == 'e') || (x == 'r' && y == 'e')) return 3;
    return 0;
}

// GPT-2's contractions are case-sensitive: 's 'd 'm 't: 2; 'll 've 're: 3; else 0.
inline unsigned gpt2_contraction(const uint8_t* p) {
    const uint8_t x = p[1], y = p[2];
    if (x == 's' || x == 'd' || x == 'm' || x == 't') return 2;
    if ((x == 'l' && y == 'l') || (x == 'v' && y == 'e') || (x == 'r' && y == 'e')) return 3;
    return 0;
}

struct WindowStarts {
    uint64_t starts;  // bit k (1..62): a piece starts at byte k
    unsigned skip;    // past the window's last non-ASCII byte (0: none): the pieces up to there
                      // are left to the per-piece scanner, as a window would find few of them
};

inline uint64_t ctz64(uint64_t m) { return static_cast<uint64_t>(__builtin_ctzll(m)); }
inline unsigned top_bit(uint64_t m) { return 63 - static_cast<unsigned>(__builtin_clzll(m)); }

// The starts of the pieces among bytes 1..62 of the 64 at p, p[0] starting one. Reads 66 bytes
// (a contraction's letters past the window).
template <int Pattern>
inline WindowStarts window_starts(const uint8_t* p) {
    // Text of other scripts: most windows have a non-ASCII byte among their first three, which
    // one byte mask of the 64 shows before the others are made.
    uint64_t high = 0;
    for (unsigned c = 0; c < 4; ++c) high |= uint64_t{Bytes16(p + 16 * c).high()} << (16 * c);
    unsigned last = 62;
    if (high) {
        const unsigned h = static_cast<unsigned>(ctz64(high));
        if (h < 3) return {0, top_bit(high) + 1};
        last = h - 2 < last ? h - 2 : last;
    }
#if TOKCORE_AVX2_WINDOW
    const Masks64 m = avx2_window() ? classify64_avx2(p) : classify64(p);
#else
    const Masks64 m = classify64(p);
#endif
    const uint64_t letter = m.upper | m.lower;
    if constexpr (Pattern == kGpt2) {
        // ` ?` joins one space to the letter, digit or punctuation run after it (digit runs are
        // not cut); a whitespace run before any other byte leaves its last byte to the piece
        // after it (`\s+(?!\S)`); an apostrophe that starts a piece (not after a joined space)
        // takes the letters of a contraction, case-sensitive.
        const uint64_t ws = m.space | m.tabs | m.crlf;
        const uint64_t other = ~(letter | m.digit | ws | high);
        const uint64_t run_start = (letter & ~(letter << 1)) | (m.digit & ~(m.digit << 1)) | (other & ~(other << 1));
        const uint64_t joined = run_start & (m.space << 1);
        uint64_t starts = (run_start & ~joined) | (joined >> 1) | (ws & ~(ws << 1)) | (ws & ((letter | m.digit | other) >> 1));
        for (uint64_t a = m.apostrophe & run_start & ~joined; a; a &= a - 1) {
            const unsigned k = static_cast<unsigned>(ctz64(a));
            const unsigned c = gpt2_contraction(p + k);
            if (c == 0 || k > 61) continue;  // from 62 on, what it changes is past `last`
            starts &= ~(((uint64_t{1} << (c - 1)) - 1) << (k + 1));  // no start inside it
            starts |= uint64_t{1} << (k + c);                       // the letters after it start one
        }
        starts &= ((uint64_t{2} << last) - 1) & ~uint64_t{1};
        return {starts, high ? top_bit(high) + 1 : 0};
    }
    const uint64_t other = ~(letter | m.digit | m.space | m.tabs | m.crlf | high);
    // o200k: a contraction after letters belongs to the letters' piece (the apostrophe starts
    // none), unless those letters are another contraction's
    uint64_t suffix = 0, suffix_end = 0;
    if (Pattern == kO200k) {
        for (uint64_t a = m.apostrophe & (letter << 1); a; a &= a - 1) {
            const unsigned k = static_cast<unsigned>(ctz64(a));
            const unsigned c = ascii_contraction(p + k);
            if (c == 0 || ((suffix >> (k - 1)) & 1)) continue;  // after a contraction: a piece of its own
            suffix |= ((uint64_t{1} << c) - 1) << k;  // may drop bits past 63: beyond `last`
            if (k + c < 64) suffix_end |= uint64_t{1} << (k + c);
        }
    }
    // \r \n right after punctuation: [\r\n]* (o200k [\r\n/]*) takes them and the rest of their
    // run; a / it takes starts no piece. A run of those bytes is taken from its first \r \n after
    // punctuation (a / of the run is punctuation too) to its end: the add carries from the run's
    // start up to that byte, and the rest is taken.
    const uint64_t tail = Pattern == kO200k ? m.crlf | m.slash : m.crlf;
    const uint64_t first = m.crlf & (other << 1);
    const uint64_t until = tail & ~first;
    const uint64_t run_start = until & ~(tail << 1);
    const uint64_t taken = tail & ~(((until + run_start) ^ until) & until);
    const uint64_t punct = other & ~taken & ~suffix;
    const uint64_t other_start = punct & ~((punct | m.space) << 1);
    const uint64_t prefix = m.space | m.tabs | other_start;
    uint64_t letter_start = letter & ~(letter << 1);
    if (Pattern == kO200k) letter_start |= m.upper & (m.lower << 1);
    const uint64_t digit_start = m.digit & ~(m.digit << 1);
    const uint64_t blank = m.space | m.tabs;
    const uint64_t ws = (blank | m.crlf) & ~taken;
    uint64_t starts = (letter_start & ~(prefix << 1)) | other_start | digit_start | (ws & ~(ws << 1)) |
                      (blank & ~(ws >> 1));
    // After a \r or \n of a run: a start when no \r or \n follows in the run. The blank run from
    // there ends where the carry of the add lands: a \r or \n there voids it, a non-ASCII byte
    // (a space of another script may go on with the run) or the window's end leaves it unknown,
    // and the starts are trusted only up to it.
    uint64_t after_crlf = blank & ((m.crlf & ~taken) << 1);
    if (after_crlf) {
        const uint64_t sum = blank + after_crlf;
        if (sum < blank) {  // the last one's run reaches byte 63
            const unsigned top = top_bit(after_crlf);
            last = top - 1 < last ? top - 1 : last;
        }
        for (uint64_t end = sum & ~blank & (m.crlf | high); end; end &= end - 1) {
            const unsigned at = top_bit(after_crlf & ((end & -end) - 1));
            after_crlf &= ~(uint64_t{1} << at);
            if ((high & end & -end) && at - 1 < last) last = at - 1;
        }
        starts |= after_crlf;
    }
    // Digit runs of 4 or more: every third digit.
    if (m.digit & (m.digit << 1) & (m.digit << 2) & (m.digit << 3)) {
        for (uint64_t r = digit_start; r; r &= r - 1) {
            const unsigned s = static_cast<unsigned>(ctz64(r));
            const uint64_t rest = ~(m.digit >> s);
            const unsigned len = rest ? static_cast<unsigned>(ctz64(rest)) : 64 - s;
            for (unsigned k = s + 3; k < s + len; k += 3) starts |= uint64_t{1} << k;
        }
    }
    if (Pattern == kCl100k) {
        for (uint64_t a = m.apostrophe & other_start; a; a &= a - 1) {
            const unsigned k = static_cast<unsigned>(ctz64(a));
            const unsigned c = ascii_contraction(p + k);
            if (c != 0 && k + c < 64) starts |= uint64_t{1} << (k + c);
        }
    } else {
        starts = (starts & ~suffix) | suffix_end;
    }
    starts &= ((uint64_t{2} << last) - 1) & ~uint64_t{1};
    return {starts, high ? top_bit(high) + 1 : 0};
}

// Callers key a piece of n <= 15 bytes (an ASCII piece of the scanners, or any with 8 bytes
// readable at its start) by two words loaded at its start and at its end:
// head = first 8 bytes & head[n] (the bytes past the piece masked off), tail = last 8 bytes &
// tail[n] (0 for n <= 8); with n they name the piece. The masks come from a table and the tail's
// address from a conditional move: lengths vary from piece to piece, and a branch on them is
// often mispredicted.
struct WordKeyMasks {
    uint64_t head[16], tail[16];
    constexpr WordKeyMasks() : head{}, tail{} {
        for (int n = 0; n < 16; ++n) {
            head[n] = n >= 8 ? ~uint64_t{0} : (uint64_t{1} << (8 * n)) - 1;
            tail[n] = n > 8 ? ~uint64_t{0} : 0;
        }
    }
};
inline constexpr WordKeyMasks kWordKeyMasks{};

struct WordKey {
    uint64_t head, tail;
};
[[gnu::always_inline]] inline WordKey word_key(const uint8_t* p, size_t n) {
    return {detail::read64(p) & kWordKeyMasks.head[n], detail::read64(p + (n > 8 ? n - 8 : 0)) & kWordKeyMasks.tail[n]};
}

// Slot of such a key in a direct-mapped table of 2^bits entries: the top bits of a
// multiplicative hash.
inline size_t word_key_slot(uint64_t head, uint64_t tail, unsigned bits) {
    return static_cast<size_t>(((head ^ (tail * 0xC2B2AE3D27D4EB4Full)) * 0x9E3779B97F4A7C15ull) >> (64 - bits));
}

// Calls emit(begin, end) for each piece, or emit(begin, end, ascii) where `ascii` is
// std::true_type for a piece that a window or ascii_piece_end found (ASCII, at most 15 bytes,
// with 16 readable bytes at `begin`) and std::false_type for the others.
// ascii_first = false: only the general *_piece functions (the tests compare the two).
// The *_piece functions are forced inline, and callers force their `emit` inline too: one loop
// per pattern with no call per piece, which would cost about as much as finding an English
// word's piece.
template <class Emit>
[[gnu::always_inline]] inline void emit_piece(Emit& emit, size_t b, size_t e, bool ascii) {
    if constexpr (std::is_invocable_v<Emit&, size_t, size_t, std::true_type>) {
        if (ascii)
            emit(b, e, std::true_type{});
        else
            emit(b, e, std::false_type{});
    } else {
        emit(b, e);
    }
}

// The general end of the piece at i (no ASCII scanner).
template <int Pattern>
[[gnu::always_inline]] inline size_t piece_end(const uint8_t* s, size_t n, size_t i) {
    if constexpr (Pattern == kGpt2) return gpt2_piece(s, n, i);
    else if constexpr (Pattern == kCl100k) return cl100k_piece(s, n, i);
    else return o200k_piece(s, n, i);
}

// Every piece from the general functions of `Pattern`.
template <int Pattern, class Emit>
[[gnu::always_inline]] inline void split_general(const uint8_t* s, size_t n, Emit& emit) {
    for (size_t i = 0; i < n;) {
        const size_t e = piece_end<Pattern>(s, n, i);
        emit_piece(emit, i, e, false);
        i = e;
    }
}

// Bytes a window needs from its start: 64, 2 more for a contraction's letters, and the 16 that
// an ASCII piece starting at byte 62 needs readable.
constexpr size_t kWindowReach = 80;

// A window where one is worth trying, else a piece from one 16-byte load, else the general
// functions. After a window that met non-ASCII bytes, the next is tried past them.
template <int Pattern, class Emit>
[[gnu::always_inline]] inline void split_ascii_first(const uint8_t* s, size_t n, Emit& emit) {
    size_t i = 0;
    size_t window_at = 0;
    while (i + 16 < n) {
        if (i >= window_at && i + kWindowReach <= n) {
            const WindowStarts w = window_starts<Pattern>(s + i);
            window_at = i + w.skip;
            if (w.starts != 0) {
                size_t b = i;
                for (uint64_t m = w.starts; m != 0; m &= m - 1) {
                    const size_t e = i + ctz64(m);
                    emit_piece(emit, b, e, e - b < 16);
                    b = e;
                }
                i = b;
                continue;
            }
        }
        size_t e = 0;
        if constexpr (Pattern != kGpt2) {  // GPT-2 has windows only
            e = ascii_piece_end<Pattern>(s + i);
            if (e != 0) {
                emit_piece(emit, i, i + e, true);
                i += e;
                continue;
            }
        }
        e = piece_end<Pattern>(s, n, i);
        emit_piece(emit, i, e, false);
        i = e;
    }
    if (i >= n) return;
    // The last <= 16 bytes (all of a short text): the scanner reads a copy padded with 0x80
    // bytes, where every run it could not end itself declines (a non-ASCII byte follows), so the
    // end of the text is left to the general functions (\s++$). The pieces go out as general
    // ones: the 16 bytes after them are the copy's, not the text's.
    uint8_t pad[32];
    const size_t r = n - i;
    std::memcpy(pad, s + i, r);
    std::memset(pad + r, 0x80, sizeof pad - r);
    for (size_t j = 0; j < r;) {
        size_t e = 0;
        if constexpr (Pattern != kGpt2) e = ascii_piece_end<Pattern>(pad + j);
        e = e != 0 ? i + j + e : piece_end<Pattern>(s, n, i + j);
        emit_piece(emit, i + j, e, false);
        j = e - i;
    }
}

template <class Emit>
inline void split_with(const uint8_t* s, size_t n, int pattern, Emit&& emit, bool ascii_first = true) {
    switch (pattern) {
        case kGpt2:
            if (ascii_first)
                split_ascii_first<kGpt2>(s, n, emit);
            else
                split_general<kGpt2>(s, n, emit);
            break;
        case kCl100k:
            if (ascii_first)
                split_ascii_first<kCl100k>(s, n, emit);
            else
                split_general<kCl100k>(s, n, emit);
            break;
        case kNoSplit:
            if (n > 0) emit_piece(emit, size_t{0}, n, false);
            break;
        default:
            if (ascii_first)
                split_ascii_first<kO200k>(s, n, emit);
            else
                split_general<kO200k>(s, n, emit);
            break;
    }
}

}  // namespace pretok
}  // namespace tokcore
