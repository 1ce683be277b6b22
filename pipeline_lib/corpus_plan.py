"""Where a corpus is cut: shard boundaries at document boundaries by the bytes still to come
(`_ShardPlan`), sources in groups of a byte budget with the shards shared among them
(`source_groups`, `group_shard_counts`), shard names, and the shard-size spread."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np


def shard_name(i: int) -> str:
    return f"shard_{i:06d}"


class _ShardPlan:
    """Where the shard boundaries fall, decided one document at a time (streaming, deterministic;
    `place_batch` decides a batch of documents at once, with the same result).

    Each shard aims at the bytes still to come divided by the shards still to make, so a
    big early shard does not starve the later ones (cutting at fixed k/n marks of the
    running total made a 12-byte shard after a 6 MB document). The current shard is closed
    before a document when adding it would overshoot the target by more than leaving it out
    falls short, and after a document that brings it to the target. A document at least as
    large as a shard's share gets a shard of its own (flagged ``oversize`` in the manifest;
    documents are never split). The last shard takes what is left, so there are at most
    `n` shards. Sizes are source bytes walked, the unit of `total`, separators included.
    """

    def __init__(self, total: int, n: int):
        self.share = total / n
        self.remaining = total  # bytes not in a closed shard yet
        self.left = n  # shards still to make, the current one included
        self.current = 0  # bytes in the current shard
        self.oversize = False  # the current shard is one document larger than a shard's share

    def _close(self) -> None:
        self.remaining -= self.current
        self.left -= 1
        self.current = 0

    def place(self, size: int) -> tuple[bool, bool]:
        """(close the current shard before this document, close it after)."""
        before = after = False
        if self.current and self.left > 1:
            target = self.remaining / self.left
            if size >= target or self.current + size - target > target - self.current:
                self._close()
                before = True
        # a document alone in its shard and larger than a shard's share of the corpus (until another joins it)
        self.oversize = self.current == 0 and size > self.share
        target = self.remaining / self.left
        self.current += size
        if self.left > 1 and self.current >= target:
            self._close()
            after = True
        return before, after

    def place_batch(self, sizes: np.ndarray) -> list[tuple[int, bool, bool, bool]]:
        """`place` for consecutive documents of these sizes: (index, close before, close after,
        oversize) for each document where a shard closes (the others just join the current one).

        Only the document at which the current shard first reaches its target can close it:
        below the target, adding a document of size s < target - current neither overshoots
        by more than it falls short nor reaches it. So each close is one `searchsorted` over
        the cumulative sizes, then `place` on that document.
        """
        events: list[tuple[int, bool, bool, bool]] = []
        n = len(sizes)
        if n == 0:
            return events
        cum = np.cumsum(sizes, dtype=np.int64)
        i = 0  # next document
        walked = 0  # cum[i - 1]
        while i < n and self.left > 1:
            # first k with current + cum[k] - walked >= target (an int reaches a float at its ceiling)
            need = walked + math.ceil(self.remaining / self.left) - self.current
            k = max(i, int(np.searchsorted(cum, need, side="left")))
            if k >= n:
                break
            self.current += int(cum[k - 1]) - walked if k > i else 0
            before, after = self.place(int(sizes[k]))
            events.append((k, before, after, self.oversize))
            walked, i = int(cum[k]), k + 1
        if i < n:  # the rest joins the current shard
            before_last = self.current + (int(cum[n - 2]) - walked if n - 1 > i else 0)
            self.oversize = before_last == 0 and int(sizes[n - 1]) > self.share
            self.current += int(cum[n - 1]) - walked
        return events

    def skip(self, size: int) -> None:
        """Source bytes after the last document of a source (they belong to the current shard)."""
        self.current += size


def shard_balance(shards: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The shard-size spread of a corpus version (bytes of text per shard)."""
    sizes = [int(s["n_bytes"]) for s in shards]
    mean = sum(sizes) / len(sizes) if sizes else 0.0
    return {
        "n_shards": len(sizes),
        "min_bytes": min(sizes, default=0),
        "max_bytes": max(sizes, default=0),
        "mean_bytes": round(mean),
        "max_over_mean": round(max(sizes) / mean, 3) if mean else None,
        "oversize_shards": [s["name"] for s in shards if s.get("oversize")],
    }


def format_balance(balance: Mapping[str, Any]) -> str:
    text = (
        f"shard bytes min {balance['min_bytes']:,} / mean {balance['mean_bytes']:,} / max {balance['max_bytes']:,} "
        f"(max/mean {balance['max_over_mean']})"
    )
    if balance["oversize_shards"]:
        text += f", {len(balance['oversize_shards'])} holding one oversize document"
    return text


def source_groups(sizes: Sequence[int], group_bytes: int) -> list[range]:
    """Consecutive sources in groups of at most `group_bytes` bytes (a larger source alone);
    `group_bytes` 0: one group per source.

    >>> source_groups([10, 10, 10, 50, 5], 25)
    [range(0, 2), range(2, 3), range(3, 4), range(4, 5)]
    """
    groups: list[range] = []
    start, current = 0, 0
    for i, size in enumerate(sizes):
        if i > start and (group_bytes == 0 or current + size > group_bytes):
            groups.append(range(start, i))
            start, current = i, 0
        current += int(size)
    if len(sizes):
        groups.append(range(start, len(sizes)))
    return groups


def group_shard_counts(group_sizes: Sequence[int], n_shards: int) -> list[int]:
    """`n_shards` shared among source groups in proportion to their bytes (largest
    remainders, ties to the earlier group), at least one shard per group."""
    total = sum(group_sizes)
    if total == 0:
        return [1] * len(group_sizes)
    quotas = [n_shards * size / total for size in group_sizes]
    counts = [max(1, math.floor(q)) for q in quotas]
    order = sorted(range(len(quotas)), key=lambda g: (-(quotas[g] - math.floor(quotas[g])), g))
    for g in order[: max(0, n_shards - sum(counts))]:
        counts[g] += 1
    return counts


def group_shard_name(group: int, k: int, n_groups: int) -> str:
    """Shard `k` of source group `group`: ``shard_<k>`` when the corpus is one group (as a
    single sharder names them), else ``shard_<group>_<k>``."""
    return shard_name(k) if n_groups == 1 else f"shard_{group:06d}_{k:06d}"
