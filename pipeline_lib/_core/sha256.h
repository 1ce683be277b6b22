// SHA-256 (FIPS 180-4) of many short byte strings: the doc table's per-document hash,
// computed without a Python object per document. On x86-64 CPUs with the SHA extensions the
// blocks go through SHA256RNDS2 (chosen at run time); elsewhere through the portable rounds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#define TOKCORE_SHA_NI 1
#endif

namespace tokcore::sha256 {

alignas(64) inline constexpr uint32_t kRound[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

inline uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

inline uint32_t load_be32(const uint8_t* p) {
    return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

// Compress `blocks` consecutive 64-byte blocks into `state`.
inline void compress_portable(uint32_t state[8], const uint8_t* p, size_t blocks) {
    uint32_t w[64];
    for (; blocks > 0; --blocks, p += 64) {
        for (int t = 0; t < 16; ++t) w[t] = load_be32(p + 4 * t);
        for (int t = 16; t < 64; ++t) {
            const uint32_t s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
            const uint32_t s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
            w[t] = w[t - 16] + s0 + w[t - 7] + s1;
        }
        uint32_t a = state[0], b = state[1], c = state[2], d = state[3];
        uint32_t e = state[4], f = state[5], g = state[6], h = state[7];
        for (int t = 0; t < 64; ++t) {
            const uint32_t t1 = h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + kRound[t] + w[t];
            const uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
            h = g;
            g = f;
            f = e;
            e = d + t1;
            d = c;
            c = b;
            b = a;
            a = t1 + t2;
        }
        state[0] += a, state[1] += b, state[2] += c, state[3] += d;
        state[4] += e, state[5] += f, state[6] += g, state[7] += h;
    }
}

#ifdef TOKCORE_SHA_NI
// The same with the SHA extensions: the state is held as (A, B, E, F) and (C, D, G, H), each
// SHA256RNDS2 does two rounds, the message schedule is 4 words at a time (SHA256MSG1/MSG2).
__attribute__((target("sha,sse4.1,ssse3"))) inline void compress_ni(uint32_t state[8], const uint8_t* p,
                                                                     size_t blocks) {
    const __m128i byte_swap = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
    const __m128i dcba = _mm_shuffle_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(state)), 0xB1);
    const __m128i efgh = _mm_shuffle_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(state + 4)), 0x1B);
    __m128i abef = _mm_alignr_epi8(dcba, efgh, 8);
    __m128i cdgh = _mm_blend_epi16(efgh, dcba, 0xF0);
    for (; blocks > 0; --blocks, p += 64) {
        const __m128i abef_in = abef, cdgh_in = cdgh;
        __m128i w[4];  // message words 4r .. 4r + 3 of group r, kept in w[r % 4]
        for (int r = 0; r < 16; ++r) {
            if (r < 4) {
                w[r] = _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * r)), byte_swap);
            } else {
                __m128i next = _mm_sha256msg1_epu32(w[r % 4], w[(r + 1) % 4]);
                next = _mm_add_epi32(next, _mm_alignr_epi8(w[(r + 3) % 4], w[(r + 2) % 4], 4));
                w[r % 4] = _mm_sha256msg2_epu32(next, w[(r + 3) % 4]);
            }
            __m128i msg = _mm_add_epi32(w[r % 4], _mm_load_si128(reinterpret_cast<const __m128i*>(kRound + 4 * r)));
            cdgh = _mm_sha256rnds2_epu32(cdgh, abef, msg);
            msg = _mm_shuffle_epi32(msg, 0x0E);
            abef = _mm_sha256rnds2_epu32(abef, cdgh, msg);
        }
        abef = _mm_add_epi32(abef, abef_in);
        cdgh = _mm_add_epi32(cdgh, cdgh_in);
    }
    const __m128i feba = _mm_shuffle_epi32(abef, 0x1B);
    const __m128i dchg = _mm_shuffle_epi32(cdgh, 0xB1);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(state), _mm_blend_epi16(feba, dchg, 0xF0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(state + 4), _mm_alignr_epi8(dchg, feba, 8));
}

inline bool cpu_has_sha_ni() {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_SSE4_1) || !(c & bit_SSSE3)) return false;
    return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b & bit_SHA);
}
#endif

using CompressFn = void (*)(uint32_t*, const uint8_t*, size_t);

inline CompressFn compress_fn() {
#ifdef TOKCORE_SHA_NI
    static const CompressFn fn = cpu_has_sha_ni() ? &compress_ni : &compress_portable;
    return fn;
#else
    return &compress_portable;
#endif
}

// SHA-256 of data[0:n] into out[0:32].
inline void digest(const uint8_t* data, size_t n, uint8_t out[32], CompressFn compress = compress_fn()) {
    uint32_t state[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                         0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    const size_t full = n / 64;
    if (full) compress(state, data, full);
    uint8_t tail[128] = {};
    const size_t rest = n - 64 * full;
    if (rest) std::memcpy(tail, data + 64 * full, rest);
    tail[rest] = 0x80;
    const size_t tail_blocks = rest < 56 ? 1 : 2;
    const uint64_t bits = static_cast<uint64_t>(n) * 8;
    for (int k = 0; k < 8; ++k) tail[64 * tail_blocks - 1 - k] = static_cast<uint8_t>(bits >> (8 * k));
    compress(state, tail, tail_blocks);
    for (int k = 0; k < 8; ++k) {
        out[4 * k] = static_cast<uint8_t>(state[k] >> 24);
        out[4 * k + 1] = static_cast<uint8_t>(state[k] >> 16);
        out[4 * k + 2] = static_cast<uint8_t>(state[k] >> 8);
        out[4 * k + 3] = static_cast<uint8_t>(state[k]);
    }
}

}  // namespace tokcore::sha256
