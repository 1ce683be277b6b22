"""Write pipeline_lib/data/lab/names.txt: a generated list of given names for the lab.

The names are made here from syllables with a fixed seed (no list is copied from
anywhere), so the file can be shipped under CC0; run again, it writes the same bytes.

    python tools/make_lab_names.py
"""

from __future__ import annotations

import os
import random

ONSETS = [
    "",
    "b",
    "ch",
    "d",
    "dh",
    "g",
    "h",
    "j",
    "k",
    "kr",
    "l",
    "m",
    "n",
    "p",
    "pr",
    "r",
    "s",
    "sh",
    "sr",
    "t",
    "v",
    "y",
]
VOWELS = ["a", "a", "aa", "e", "ee", "i", "i", "o", "u", "ya", "ia"]
CODAS = ["", "", "", "n", "m", "r", "sh", "l", "t", "v", "j", "th"]
ENDINGS = ["", "a", "i", "an", "esh", "ita", "ika", "ya", "un", "ansh", "ini"]
OUT = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pipeline_lib", "data", "lab", "names.txt"
)


def make_names(n: int = 5000, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    names: dict[str, None] = {}
    while len(names) < n:
        syllables = rng.choice([1, 2, 2, 2, 3])
        name = "".join(
            rng.choice(ONSETS) + rng.choice(VOWELS) + rng.choice(CODAS) for _ in range(syllables)
        ) + rng.choice(ENDINGS)
        if 3 <= len(name) <= 9 and name.isalpha():
            names.setdefault(name)
    return list(names)


if __name__ == "__main__":
    with open(OUT, "w", encoding="utf-8", newline="\n") as f:
        f.write("\n".join(make_names()) + "\n")
    print(OUT)
