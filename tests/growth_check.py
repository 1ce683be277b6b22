"""The growth check the growth tests share (tests/test_growth.py explains the numbers)."""

from __future__ import annotations

import time

FACTOR = 8  # the big input is FACTOR times the small one
LIMIT = 16.0  # twice linear growth: the margin for cache and page-fault effects


def growth(small_fn, big_fn, what: str, repeats: int = 5, clock=time.thread_time, limit: float = LIMIT) -> float:
    """Fastest time of big_fn over fastest time of small_fn, the two run alternately."""
    small_fn(), big_fn()
    small, big = [], []
    for _ in range(repeats):
        for fn, times in ((small_fn, small), (big_fn, big)):
            t0 = clock()
            fn()
            times.append(clock() - t0)
    s, b = min(small), min(big)
    print(f"{what}: {s:.4f} s -> {b:.4f} s, x{b / s:.2f} (limit {limit})")
    return b / s
