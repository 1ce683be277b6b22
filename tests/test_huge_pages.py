"""`BigVector` (hashing.h): buffers of 1 MiB or more in whole 2 MiB pages, smaller ones as usual.

The vocabulary's maps and each thread's caches live in such buffers, so that their lookups cost
no page walk where the system gives transparent huge pages. Whether it gives them is the
system's choice (a hint, not a request), so what is checked here is what the allocator decides:
the alignment, the contents through growth and reallocation, and that the per-thread tables fit
one huge page.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

CORE = Path(__file__).resolve().parent.parent / "pipeline_lib" / "_core"

PROGRAM = r"""
#include <cstdint>
#include <cstdio>
#include "encode.h"
using tokcore::BigVector;
static unsigned long aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % (size_t{2} << 20) == 0; }
int main() {
    const size_t mib = size_t{1} << 20;
    BigVector<uint64_t> small(1000, 7);                    // 8 KB: the usual allocator
    BigVector<uint64_t> big(mib / 8, 0);                   // exactly 1 MiB: a huge page
    BigVector<uint8_t> odd(3 * mib + 1, 1);                // rounded up to 4 MiB, aligned
    BigVector<uint32_t> grown;                             // crosses 1 MiB while it grows
    for (uint32_t i = 0; i < 3 * mib / 4; ++i) grown.push_back(i * 2654435761u);
    unsigned long grown_ok = 1;
    for (uint32_t i = 0; i < grown.size(); ++i) grown_ok &= grown[i] == i * 2654435761u;
    for (auto& v : big) v = 5;
    unsigned long sums = 0;
    for (auto v : small) sums += v;
    for (auto v : big) sums += v;
    for (auto v : odd) sums += v;
    tokcore::PieceCache cache;
    unsigned long empty = cache.words()[0].len == 0 && cache.recent()[77].len == 0 &&
                          cache.recent_long()[123].len == 0 && cache.pair_memo()[9].key == ~uint64_t{0};
    std::printf("%lu %lu %lu %lu %lu %lu %lu\n", aligned(big.data()), aligned(odd.data()),
                aligned(grown.data()), grown_ok, sums, aligned(cache.tables.data()), empty);
    return 0;
}
"""


def test_big_buffers_in_whole_huge_pages(tmp_path):
    cxx = shutil.which("g++") or shutil.which("c++")
    assert cxx, "a C++ compiler is needed (the core is built with one)"
    (tmp_path / "big.cpp").write_text(PROGRAM)
    subprocess.run(
        [cxx, "-O1", "-std=c++17", "-Wall", "-Wextra", "-Werror", f"-I{CORE}", "big.cpp", "-o", "big", "-pthread"],
        cwd=tmp_path,
        check=True,
    )
    run = subprocess.run([tmp_path / "big"], capture_output=True, text=True, check=True)
    big, odd, grown, grown_ok, sums, cache_tables, empty = (int(x) for x in run.stdout.split())
    mib = 1 << 20
    assert (big, odd, grown) == (1, 1, 1)  # 2 MiB-aligned: each buffer starts a huge page
    assert grown_ok == 1  # the values survive the reallocations from the usual allocator to pages
    assert sums == 1000 * 7 + (mib // 8) * 5 + 3 * mib + 1
    assert cache_tables == 1  # a thread's four lookup tables: one page
    assert empty == 1  # a new cache's slots are empty (pair memos: key ~0)
