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


def test_sse2_and_swar_scanners_agree(tmp_path):
    cxx = shutil.which("g++") or shutil.which("c++")
    assert cxx, "a C++ compiler is needed (the core is built with one)"
    (tmp_path / "simd.cpp").write_text(SCANNER.replace("NAME", "simd"))
    (tmp_path / "swar.cpp").write_text(SCANNER.replace("NAME", "swar"))
    (tmp_path / "main.cpp").write_text(MAIN)
    flags = ["-O1", "-std=c++17", f"-I{CORE}"]
    subprocess.run([cxx, *flags, "-c", "simd.cpp"], cwd=tmp_path, check=True)
    subprocess.run([cxx, *flags, "-DTOKCORE_NO_SIMD", "-c", "swar.cpp"], cwd=tmp_path, check=True)
    subprocess.run([cxx, *flags, "main.cpp", "simd.o", "swar.o", "-o", "compare"], cwd=tmp_path, check=True)
    run = subprocess.run([tmp_path / "compare"], capture_output=True, text=True, check=True)
    decided, mismatches = map(int, run.stdout.split())
    assert decided > 100_000  # the windows exercise the scanner, not only its declining
    assert mismatches == 0
