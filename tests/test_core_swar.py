"""The ASCII scanner's two builds agree: SSE2 (x86-64) and the SWAR fallback other targets compile.

`pretok::ascii_piece_end` reads 16 bytes as bit masks with SSE2 where the compiler has it and with
64-bit word arithmetic otherwise (`TOKCORE_NO_SIMD` forces the latter here). The extension is built
with one of them only, so this test compiles the header twice with the system's C++ compiler and
compares the two on random 16-byte windows drawn around every class boundary it tests.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parent.parent / "pipeline_lib" / "_core"

SCANNER = """
#include "pretokenize.h"
size_t NAME_cl(const uint8_t* p) { return tokcore::pretok::ascii_piece_end<tokcore::kCl100k>(p); }
size_t NAME_o2(const uint8_t* p) { return tokcore::pretok::ascii_piece_end<tokcore::kO200k>(p); }
"""

MAIN = r"""
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <random>
size_t simd_cl(const uint8_t*); size_t simd_o2(const uint8_t*);
size_t swar_cl(const uint8_t*); size_t swar_o2(const uint8_t*);
int main() {
    std::mt19937 rng(7);
    // letters at the ASCII ranges' edges, digits, spaces, \r \n, apostrophes, punctuation, NUL,
    // DEL, UTF-8 lead and continuation bytes
    const char alpha[] = "aAzZ@[`{ M'\r\n\t\x0b\x0c" "0123456789.,;/-()\x7f\x80\xc3\xa9\xe4\xb8\xad\xff";
    const size_t n_alpha = sizeof alpha - 1 + 1;  // with the NUL
    long decided = 0, mismatches = 0;
    for (int it = 0; it < 400000; ++it) {
        uint8_t w[16];
        for (auto& b : w) b = rng() % 4 == 0 ? uint8_t(rng() % 256) : uint8_t(alpha[rng() % n_alpha]);
        const size_t a = simd_cl(w), b = swar_cl(w), c = simd_o2(w), d = swar_o2(w);
        decided += (a != 0) + (c != 0);
        if (a != b || c != d) ++mismatches;
    }
    std::printf("%ld %ld\n", decided, mismatches);
    return 0;
}
"""


def compiler() -> str:
    cxx = shutil.which("g++") or shutil.which("c++")
    assert cxx, "a C++ compiler is needed (the core is built with one)"
    return cxx


def ints_printed(program: Path) -> list[int]:
    run = subprocess.run([program], capture_output=True, text=True, check=True)
    return [int(x) for x in run.stdout.split()]


def run_both_builds(tmp_path, code: str, main: str) -> list[int]:
    """`code` compiled twice, NAME_ functions as simd_ (SSE2) and swar_ (TOKCORE_NO_SIMD), linked
    with `main`, run: the integers it prints."""
    cxx = compiler()
    (tmp_path / "simd.cpp").write_text(code.replace("NAME", "simd"))
    (tmp_path / "swar.cpp").write_text(code.replace("NAME", "swar"))
    (tmp_path / "main.cpp").write_text(main)
    flags = ["-O1", "-std=c++17", f"-I{CORE}"]
    # Each build's own namespace: the headers' inline functions, not inlined, would otherwise be
    # one definition for the linker, which keeps either build's for both.
    subprocess.run([cxx, *flags, "-Dtokcore=tokcore_simd", "-c", "simd.cpp"], cwd=tmp_path, check=True)
    subprocess.run(
        [cxx, *flags, "-DTOKCORE_NO_SIMD", "-Dtokcore=tokcore_swar", "-c", "swar.cpp"], cwd=tmp_path, check=True
    )
    subprocess.run([cxx, *flags, "main.cpp", "simd.o", "swar.o", "-o", "compare"], cwd=tmp_path, check=True)
    return ints_printed(tmp_path / "compare")


def test_sse2_and_swar_scanners_agree(tmp_path):
    decided, mismatches = run_both_builds(tmp_path, SCANNER, MAIN)
    assert decided > 100_000  # the windows exercise the scanner, not only its declining
    assert mismatches == 0


MERGE_STEPS = """
#include "small_merge.h"
size_t NAME_lowest(const uint32_t* rk, size_t pairs, uint32_t& best) {
    return tokcore::small_merge::lowest_pair(rk, pairs, best);
}
void NAME_shift(uint32_t* a, size_t i, size_t end) { tokcore::small_merge::shift_down(a, i, end); }
"""

MERGE_MAIN = r"""
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
size_t simd_lowest(const uint32_t*, size_t, uint32_t&); size_t swar_lowest(const uint32_t*, size_t, uint32_t&);
void simd_shift(uint32_t*, size_t, size_t); void swar_shift(uint32_t*, size_t, size_t);
int main() {
    std::mt19937 rng(11);
    long wrong = 0, ties = 0;
    for (int it = 0; it < 200000; ++it) {
        const size_t pairs = 1 + rng() % 64;
        uint32_t rk[64 + 8];
        // few distinct ranks (ties), ranks with the top bit set, and "no pair"
        const uint32_t span = rng() % 2 ? 4 : 0xFFFFFFFFu;
        for (size_t k = 0; k < pairs; ++k) {
            const uint32_t high = 0x80000000u + rng() % 4;
            rk[k] = rng() % 8 == 0 ? 0xFFFFFFFFu : (rng() % 16 == 0 ? high : rng() % span);
        }
        for (size_t k = pairs; k < 64 + 8; ++k) rk[k] = 0xFFFFFFFFu;
        uint32_t want = 0xFFFFFFFFu;
        size_t want_at = 0;
        for (size_t k = 0; k < pairs; ++k)
            if (rk[k] < want) want = rk[k], want_at = k;
        size_t same = 0;
        for (size_t k = 0; k < pairs; ++k) same += rk[k] == want ? 1 : 0;
        ties += same > 1;
        uint32_t a = 0, b = 0;
        const size_t at_a = simd_lowest(rk, pairs, a), at_b = swar_lowest(rk, pairs, b);
        if (a != want || b != want || (want != 0xFFFFFFFFu && (at_a != want_at || at_b != want_at))) ++wrong;
        // the shift: entries before `end` move down by one, whatever the build
        uint32_t x[64 + 8], y[64 + 8], z[64 + 8];
        for (size_t k = 0; k < 64 + 8; ++k) x[k] = y[k] = z[k] = static_cast<uint32_t>(rng());
        const size_t end = rng() % 64, i = end == 0 ? 0 : rng() % (end + 1);
        simd_shift(x, i, end);
        swar_shift(y, i, end);
        for (size_t k = i; k < end; ++k) z[k] = z[k + 1];
        if (std::memcmp(x, z, end * sizeof(uint32_t)) != 0 || std::memcmp(y, z, end * sizeof(uint32_t)) != 0) ++wrong;
    }
    std::printf("%ld %ld\n", ties, wrong);
    return 0;
}
"""


def test_small_merge_steps_agree_with_a_plain_scan(tmp_path):
    """The short-piece BPE's lowest-pair scan (leftmost on ties, unsigned order) and its shift,
    in the SSE2 build and the plain one, against the obvious loops."""
    ties, wrong = run_both_builds(tmp_path, MERGE_STEPS, MERGE_MAIN)
    assert ties > 10_000  # leftmost-on-ties is exercised
    assert wrong == 0


WINDOW = """
#include "pretokenize.h"
uint64_t NAME_wcl(const uint8_t* p) {
    const auto w = tokcore::pretok::window_starts<tokcore::kCl100k>(p);
    return w.starts != 0 ? w.starts : w.skip;
}
uint64_t NAME_wo2(const uint8_t* p) {
    const auto w = tokcore::pretok::window_starts<tokcore::kO200k>(p);
    return w.starts != 0 ? w.starts : w.skip;
}
uint64_t NAME_wg2(const uint8_t* p) {
    const auto w = tokcore::pretok::window_starts<tokcore::kGpt2>(p);
    return w.starts != 0 ? w.starts : w.skip;
}
"""

WINDOW_MAIN = r"""
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <random>
uint64_t simd_wcl(const uint8_t*); uint64_t simd_wo2(const uint8_t*); uint64_t simd_wg2(const uint8_t*);
uint64_t swar_wcl(const uint8_t*); uint64_t swar_wo2(const uint8_t*); uint64_t swar_wg2(const uint8_t*);
int main() {
    std::mt19937 rng(13);
    // mostly ASCII of every class the window reads, now and then a non-ASCII byte
    const char alpha[] = "aAzZ@[`{ M'\r\n\t\x0b\x0c/sSlLvVeErRdDtT" "0123456789.,;-()\x7f\x80\xc3\xa9\xff";
    const size_t n_alpha = sizeof alpha - 1 + 1;  // with the NUL
    long starts = 0, mismatches = 0;
    for (int it = 0; it < 100000; ++it) {
        uint8_t w[80];
        for (auto& b : w) b = rng() % 64 == 0 ? uint8_t(0x80 + rng() % 128) : uint8_t(alpha[rng() % n_alpha]);
        const uint64_t a = simd_wcl(w), b = swar_wcl(w), c = simd_wo2(w), d = swar_wo2(w);
        const uint64_t e = simd_wg2(w), f = swar_wg2(w);
        starts += (a > 64) + (c > 64) + (e > 64);
        if (a != b || c != d || e != f) ++mismatches;
    }
    std::printf("%ld %ld\n", starts, mismatches);
    return 0;
}
"""


def test_sse2_and_swar_windows_agree(tmp_path):
    """The 64-byte window (`pretok::window_starts`) builds its masks from the same 16-byte loads."""
    starts, mismatches = run_both_builds(tmp_path, WINDOW, WINDOW_MAIN)
    assert starts > 75_000  # many windows find starts, not only the non-ASCII byte
    assert mismatches == 0


AVX2_MAIN = r"""
#include <cstdio>
#include <cstring>
#include <random>
#include "pretokenize.h"
using namespace tokcore::pretok;
int main() {
    if (!__builtin_cpu_supports("avx2")) { std::printf("-1 0\n"); return 0; }
    std::mt19937 rng(17);
    const char alpha[] = "aAzZ@[`{ M'\r\n\t\x0b\x0c/09.,;-()\x7f\x80\xc3\xa9\xff";
    const size_t n_alpha = sizeof alpha - 1 + 1;  // with the NUL
    long windows = 0, mismatches = 0;
    for (int it = 0; it < 100000; ++it) {
        uint8_t w[64];
        for (auto& b : w) b = rng() % 8 == 0 ? uint8_t(rng() % 256) : uint8_t(alpha[rng() % n_alpha]);
        const Masks64 a = classify64(w), b = classify64_avx2(w);
        ++windows;
        if (std::memcmp(&a, &b, sizeof a) != 0) ++mismatches;
    }
    std::printf("%ld %ld\n", windows, mismatches);
    return 0;
}
"""


def test_avx2_and_sse2_window_masks_agree(tmp_path):
    """On CPUs with AVX2 the window's byte classes come from two 32-byte loads
    (`pretok::classify64_avx2`); they must equal the 16-byte build's, byte class by byte class."""
    (tmp_path / "avx2.cpp").write_text(AVX2_MAIN)
    subprocess.run([compiler(), "-O1", "-std=c++17", f"-I{CORE}", "avx2.cpp", "-o", "avx2"], cwd=tmp_path, check=True)
    windows, mismatches = ints_printed(tmp_path / "avx2")
    if windows < 0:
        pytest.skip("this CPU has no AVX2: the core uses the 16-byte masks only")
    assert windows == 100_000
    assert mismatches == 0


UTF8_UNITS = """
#include "utf8_units.h"
size_t NAME_utf8(const void* units, size_t n, unsigned kind, uint8_t* out) {
    return tokcore::utf8_from_units(units, n, kind, out);
}
"""

UTF8_MAIN = r"""
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>
size_t simd_utf8(const void*, size_t, unsigned, uint8_t*); size_t swar_utf8(const void*, size_t, unsigned, uint8_t*);
// the plain encoding, code point by code point; SIZE_MAX at a surrogate
size_t plain(const uint32_t* cp, size_t n, uint8_t* o) {
    uint8_t* start = o;
    for (size_t i = 0; i < n; ++i) {
        const uint32_t c = cp[i];
        if (c >= 0xD800 && c < 0xE000) return SIZE_MAX;
        const int len = c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4;
        const uint8_t lead[] = {0, 0x00, 0xC0, 0xE0, 0xF0};
        for (int k = len - 1; k >= 1; --k) o[k] = uint8_t(0x80 | (c >> (6 * (len - 1 - k)) & 63));
        o[0] = uint8_t(lead[len] | c >> (6 * (len - 1)));
        o += len;
    }
    return size_t(o - start);
}
int main() {
    std::mt19937 rng(5);
    long converted = 0, refused = 0, wrong = 0;
    for (int it = 0; it < 60000; ++it) {
        const unsigned kind = 1u << (rng() % 3);
        const size_t n = rng() % 80;
        const uint32_t top = kind == 1 ? 0xFF : kind == 2 ? 0xFFFF : 0x10FFFF;
        // mostly ASCII, with other code points (edges of each UTF-8 length, surrogates) now and then
        const uint32_t edges[] = {0x7F,   0x80,   0xFF,   0x7FF,  0x800,   0xD7FF,
                                  0xD800, 0xDFFF, 0xE000, 0xFFFF, 0x10000, 0x10FFFF};
        std::vector<uint32_t> cp(n);
        const unsigned rate = 1 + rng() % 40;
        for (auto& c : cp) {
            c = rng() % rate != 0 ? rng() % 0x80 : (rng() % 2 ? edges[rng() % 12] : rng() % (top + 1));
            if (c > top) c = top;
            if (kind == 4 && c >= 0xD800 && c < 0xE000 && rng() % 4 != 0) c = 'x';
        }
        std::vector<uint8_t> units(n * kind + 16);
        for (size_t i = 0; i < n; ++i) std::memcpy(&units[i * kind], &cp[i], kind);  // little-endian
        std::vector<uint8_t> want(4 * n + 1), a(4 * n + 1), b(4 * n + 1);
        const size_t w = plain(cp.data(), n, want.data());
        const size_t x = simd_utf8(units.data(), n, kind, a.data()), y = swar_utf8(units.data(), n, kind, b.data());
        if (w == SIZE_MAX) {
            ++refused;
            wrong += x != SIZE_MAX || y != SIZE_MAX;
            continue;
        }
        ++converted;
        wrong += x != w || y != w || std::memcmp(a.data(), want.data(), w) != 0 ||
                 std::memcmp(b.data(), want.data(), w) != 0;
    }
    std::printf("%ld %ld %ld\n", converted, refused, wrong);
    return 0;
}
"""


def test_str_units_to_utf8_agree_with_a_plain_encoding(tmp_path):
    """A str's code units of 1, 2 and 4 bytes made UTF-8 (utf8_units.h: ASCII 16 bytes of units
    at a time), in the SSE2 build and the plain one, against the plain encoding of each code
    point: runs of ASCII broken at every offset, each UTF-8 length's edges, surrogates refused."""
    converted, refused, wrong = run_both_builds(tmp_path, UTF8_UNITS, UTF8_MAIN)
    assert converted > 30_000 and refused > 1_000
    assert wrong == 0
