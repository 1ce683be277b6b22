#!/usr/bin/env python3
"""Generate pipeline_lib/_core/unicode_tables.h: per-code-point class flags for the
hand-written pre-tokenizers of the compiled core.

For every code point 0..0x10FFFF we ask a regex engine which of the classes the split
patterns use it belongs to: ``\\s``, ``\\p{L}``, ``\\p{N}``, and (for o200k)
``\\p{Lu} \\p{Lt} \\p{Lm} \\p{Lo} \\p{Ll} \\p{M}``. Two engines can answer:

* ``regex`` -- the Python `regex` module, which the pure-Python reference
  (`pipeline_lib.bpe_reference`) splits with;
* ``tiktoken`` -- tiktoken's Rust `fancy-regex`/`regex` engine. It is asked through a
  throw-away ``tiktoken.Encoding`` whose pattern is just the class (``pat_str=r"\\p{L}"``)
  and whose vocabulary is the 256 single bytes: tiktoken drops text that the pattern does
  not match, so encoding the string of all code points and decoding the ids back gives
  exactly the members of the class.

The two engines can ship different Unicode versions. tiktoken is the ground truth for
GPT-2 / cl100k / o200k compatibility, so by default the tables follow tiktoken, and the
script prints every code point where the engines disagree (the tests check the same
difference explicitly). ``--source regex`` builds the tables from the `regex` module alone.

Also generated: the non-ASCII code points that case-insensitively match one of the
contraction letters ``s d m t l v r e`` (``(?i:s)`` matches U+017F LATIN SMALL LETTER LONG S).

Surrogates U+D800..U+DFFF (category Cs) get no class: the reference decodes bytes that are
not valid UTF-8 to U+DC80..U+DCFF (``surrogateescape``), and they must be "neither letter,
number nor space". The native code never looks them up (it treats invalid bytes directly),
but the table says the same.

Usage: python tools/gen_unicode_tables.py [--source tiktoken|regex] [--out PATH]
"""

from __future__ import annotations

import argparse
import os
import sys

import regex

MAX_CP = 0x110000
BLOCK = 256

# Flag bits; keep in sync with pipeline_lib/_core/unicode.h (which includes the header).
F_L = 1  # \p{L}
F_N = 2  # \p{N}
F_S = 4  # \s
F_UP = 8  # [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]  (o200k "upper" class)
F_LO = 16  # [\p{Ll}\p{Lm}\p{Lo}\p{M}]        (o200k "lower" class)
F_M = 32  # \p{M} (informational)

CLASSES = {
    "S": r"\s",
    "L": r"\p{L}",
    "N": r"\p{N}",
    "Lu": r"\p{Lu}",
    "Lt": r"\p{Lt}",
    "Lm": r"\p{Lm}",
    "Lo": r"\p{Lo}",
    "Ll": r"\p{Ll}",
    "M": r"\p{M}",
}
CONTRACTION_LETTERS = "sdmtlvre"


def _all_chars(include_surrogates: bool) -> str:
    return "".join(chr(c) for c in range(MAX_CP) if include_surrogates or not (0xD800 <= c < 0xE000))


def classes_from_regex() -> dict[str, set[int]]:
    text = _all_chars(include_surrogates=True)
    out = {name: {ord(m) for m in regex.findall(pat, text)} for name, pat in CLASSES.items()}
    for x in CONTRACTION_LETTERS:
        out["ci_" + x] = {ord(m) for m in regex.findall("(?i:%s)" % x, text)}
    return out


def classes_from_tiktoken() -> dict[str, set[int]]:
    import tiktoken

    text = _all_chars(include_surrogates=False)  # tiktoken cannot take lone surrogates
    ranks = {bytes([i]): i for i in range(256)}

    def members(pat: str) -> set[int]:
        enc = tiktoken.Encoding(name="probe", pat_str=pat, mergeable_ranks=ranks, special_tokens={})
        return {ord(c) for c in bytes(enc.encode_ordinary(text)).decode("utf-8")}

    out = {name: members(pat) for name, pat in CLASSES.items()}
    for x in CONTRACTION_LETTERS:
        out["ci_" + x] = members("(?i:%s)" % x)
    return out


def flags_of(cls: dict[str, set[int]]) -> bytearray:
    flags = bytearray(MAX_CP)
    up = cls["Lu"] | cls["Lt"] | cls["Lm"] | cls["Lo"] | cls["M"]
    lo = cls["Ll"] | cls["Lm"] | cls["Lo"] | cls["M"]
    for bit, members in ((F_L, cls["L"]), (F_N, cls["N"]), (F_S, cls["S"]), (F_UP, up), (F_LO, lo), (F_M, cls["M"])):
        for c in members:
            flags[c] |= bit
    for c in range(0xD800, 0xE000):
        flags[c] = 0
    return flags


def ranges(cps: set[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for c in sorted(cps):
        if out and out[-1][1] == c - 1:
            out[-1] = (out[-1][0], c)
        else:
            out.append((c, c))
    return out


def fmt_ranges(cps: set[int], limit: int = 12) -> str:
    rs = ranges(cps)
    parts = [f"U+{a:04X}" if a == b else f"U+{a:04X}..U+{b:04X}" for a, b in rs[:limit]]
    if len(rs) > limit:
        parts.append(f"... ({len(rs)} ranges)")
    return ", ".join(parts)


def describe_differences(rx: dict[str, set[int]], tk: dict[str, set[int]]) -> list[str]:
    lines = []
    for name in list(CLASSES) + ["ci_" + x for x in CONTRACTION_LETTERS]:
        only_rx, only_tk = rx[name] - tk[name], tk[name] - rx[name]
        only_rx = {c for c in only_rx if not (0xD800 <= c < 0xE000)}
        if only_rx or only_tk:
            lines.append(f"{name}: regex-only {len(only_rx)} [{fmt_ranges(only_rx)}]")
            lines.append(f"{' ' * len(name)}  tiktoken-only {len(only_tk)} [{fmt_ranges(only_tk)}]")
        else:
            lines.append(f"{name}: identical ({len(rx[name])} code points)")
    return lines


def emit_header(flags: bytearray, folds: dict[int, str], comment: list[str]) -> str:
    blocks: dict[bytes, int] = {}
    stage1: list[int] = []
    stage2: list[bytes] = []
    for start in range(0, MAX_CP, BLOCK):
        blk = bytes(flags[start : start + BLOCK])
        if blk not in blocks:
            blocks[blk] = len(stage2)
            stage2.append(blk)
        stage1.append(blocks[blk])
    assert stage1[0] == 0 and len(stage2) < 65536

    out = []
    out.append("// GENERATED by tools/gen_unicode_tables.py -- do not edit by hand.")
    for line in comment:
        out.append("// " + line if line else "//")
    out.append("#pragma once")
    out.append("#include <cstdint>")
    out.append("")
    out.append("namespace tokcore::tables {")
    out.append("")
    out.append(f"constexpr uint8_t kFlagL = {F_L};   // \\p{{L}}")
    out.append(f"constexpr uint8_t kFlagN = {F_N};   // \\p{{N}}")
    out.append(f"constexpr uint8_t kFlagS = {F_S};   // \\s")
    out.append(f"constexpr uint8_t kFlagUp = {F_UP};  // [\\p{{Lu}}\\p{{Lt}}\\p{{Lm}}\\p{{Lo}}\\p{{M}}]")
    out.append(f"constexpr uint8_t kFlagLo = {F_LO}; // [\\p{{Ll}}\\p{{Lm}}\\p{{Lo}}\\p{{M}}]")
    out.append(f"constexpr uint8_t kFlagM = {F_M};  // \\p{{M}}")
    out.append(f"constexpr int kBlockShift = {BLOCK.bit_length() - 1};")
    out.append("")
    out.append(f"// stage 1: code point >> {BLOCK.bit_length() - 1} -> block number")
    out.append(f"inline constexpr uint16_t kStage1[{len(stage1)}] = {{")
    for i in range(0, len(stage1), 16):
        out.append("    " + ", ".join(str(v) for v in stage1[i : i + 16]) + ",")
    out.append("};")
    out.append("")
    out.append(f"// stage 2: {len(stage2)} distinct blocks of {BLOCK} flag bytes")
    out.append(f"inline constexpr uint8_t kStage2[{len(stage2) * BLOCK}] = {{")
    for blk in stage2:
        for i in range(0, BLOCK, 32):
            out.append("    " + ",".join(str(v) for v in blk[i : i + 32]) + ",")
    out.append("};")
    out.append("")
    out.append("// Non-ASCII code points that (?i:x) matches, for the contraction letters x.")
    out.append("struct CaseFold { uint32_t cp; char letter; };")
    items = sorted(folds.items())
    out.append(f"inline constexpr int kNumFolds = {len(items)};")
    out.append(f"inline constexpr CaseFold kFolds[{max(1, len(items))}] = {{")
    for cp, letter in items:
        out.append(f"    {{0x{cp:04X}, '{letter}'}},")
    if not items:
        out.append("    {0, 0},")
    out.append("};")
    out.append("")
    out.append("}  // namespace tokcore::tables")
    out.append("")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", choices=["tiktoken", "regex"], default="tiktoken")
    default_out = os.path.join(os.path.dirname(__file__), "..", "pipeline_lib", "_core", "unicode_tables.h")
    ap.add_argument("--out", default=os.path.normpath(default_out))
    args = ap.parse_args()

    rx = classes_from_regex()
    comment = [f"Classes asked of: {args.source} (see the generator's docstring)."]
    comment.append(f"regex module {regex.__version__}.")
    if args.source == "tiktoken":
        import tiktoken

        tk = classes_from_tiktoken()
        comment.append(f"tiktoken {tiktoken.__version__}.")
        diff = describe_differences(rx, tk)
        comment.append("")
        comment.append("Where the regex module and tiktoken disagree (these tables follow tiktoken):")
        comment.extend("  " + d for d in diff)
        print("\n".join(diff), file=sys.stderr)
        cls = tk
    else:
        cls = rx

    for x in CONTRACTION_LETTERS:
        expect = {ord(x), ord(x.upper())}
        if not expect <= cls["ci_" + x]:
            raise SystemExit(f"(?i:{x}) does not match {x!r}/{x.upper()!r}?")
    folds = {}
    for x in CONTRACTION_LETTERS:
        for c in cls["ci_" + x]:
            if c >= 0x80:
                if c in folds:
                    raise SystemExit(f"U+{c:04X} folds to two contraction letters")
                folds[c] = x

    header = emit_header(flags_of(cls), folds, comment)
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(header)
    print(f"wrote {args.out} ({len(header)} bytes)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
