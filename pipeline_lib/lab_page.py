"""The lab page: one self-contained HTML file to learn BPE in a browser (`tokenmill lab page`).

No server and no network: the page carries its data as JSON, its script and its styles
inline, and draws its plot as SVG. What it shows, for one text and one tokenizer:

* the text as coloured tokens, each token's id (and its bytes) on hover;
* a merge slider: the text after the first k merges, from the starting parts to the full
  encoding (the encode trace replayed: merges apply in rank order, so the parts after
  the first k merges are those left when every merge of a later rank is held back);
* compression (characters per token on the text) against vocabulary size: the tokenizer
  cut to smaller sizes, and the production encodings as labelled points;
* the compare table: the same text under character level, word level, the tokenizer and
  the production encodings.

No Prefect here.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pipeline_lib import lab

if TYPE_CHECKING:
    from pipeline_lib.tokenizer import Tokenizer


def train_for_page(corpus: str, n_merges: int, ties: str = "bytes") -> Tokenizer:
    """Byte-level BPE (cl100k split, no special token) learned from `corpus`'s paragraphs:
    the page's tokenizer when the learner names none."""
    from pipeline_lib.tokenizer import Tokenizer

    return Tokenizer.train(
        [p for p in corpus.split("\n\n") if p], 0, special_tokens=(), min_frequency=2, ties=ties, n_merges=n_merges
    )


def slider_data(tok: Tokenizer, text: str) -> dict[str, Any]:
    """Per piece, the parts (text and id) before any merge and after each merge that
    changes it, with that merge's rank; and the ranks the slider steps through."""
    ranks = tok.mergeable_ranks
    unknown = tok.special_tokens.get("<unk>")
    pieces = []
    used: set[int] = set()
    for entry in lab.encode_trace(tok, text):
        states = [{"rank": -1, "parts": entry["start"]}]
        for step in entry["steps"]:
            states.append({"rank": step["rank"], "parts": step["parts"]})
            used.add(step["rank"])
        pieces.append({"states": states, "ids": entry["ids"]})
    # Ids of the parts of every state: the text of a part is shown, its id looked up here.
    id_of = {lab.shown_bytes(tok, b): i for b, i in ranks.items()}
    if unknown is not None:
        id_of[lab.UNK_TEXT] = unknown
    merges = tok.merges
    if merges is not None:
        steps = [m[2] for m in merges]  # merge k makes id steps[k]: the slider's k-th stop
    else:
        steps = sorted(used)
    return {"pieces": pieces, "ids": id_of, "steps": steps}


def compression_curve(
    tok: Tokenizer, text: str, production: Mapping[str, Tokenizer], points: int = 8
) -> dict[str, Any]:
    """Characters per token of `text` for `tok` cut to `points` sizes (log-spaced up to its
    own) and for each production encoding."""
    from pipeline_lib.report import truncate

    n_chars = max(1, len(text))
    smallest = tok.vocab_size - len(tok.merges or [])
    sizes = sorted(
        {
            round(
                math.exp(
                    math.log(smallest + 1) + (math.log(tok.vocab_size) - math.log(smallest + 1)) * i / (points - 1)
                )
            )
            for i in range(points)
        }
    )
    ours = []
    for v in sizes:
        cut = truncate(tok, v) if tok.merges is not None and v < tok.vocab_size else tok
        ours.append({"vocab_size": cut.vocab_size, "chars_per_token": n_chars / max(1, len(cut.encode_ordinary(text)))})
    theirs = [
        {"name": name, "vocab_size": t.n_vocab, "chars_per_token": n_chars / max(1, len(t.encode_ordinary(text)))}
        for name, t in production.items()
    ]
    return {"ours": ours, "production": theirs}


def curve_svg(curve: Mapping[str, Any], name: str, width: int = 640, height: int = 300) -> str:
    """The curve as an inline SVG: log vocabulary size across, characters per token up."""
    points = [(p["vocab_size"], p["chars_per_token"]) for p in curve["ours"]] + [
        (p["vocab_size"], p["chars_per_token"]) for p in curve["production"]
    ]
    xs = [math.log10(max(2, v)) for v, _ in points]
    x0, x1 = min(xs) - 0.1, max(xs) + 0.1
    y1 = max(c for _, c in points) * 1.15
    left, right, top, bottom = 50, 20, 20, 40

    def at(v: float, c: float) -> tuple[float, float]:
        x = left + (math.log10(max(2, v)) - x0) / (x1 - x0) * (width - left - right)
        y = height - bottom - c / y1 * (height - top - bottom)
        return round(x, 1), round(y, 1)

    out = [
        f'<svg id="curve" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
        'aria-label="compression against vocabulary size">'
    ]
    out.append(f'<line x1="{left}" y1="{height - bottom}" x2="{width - right}" y2="{height - bottom}" stroke="#444"/>')
    out.append(f'<line x1="{left}" y1="{top}" x2="{left}" y2="{height - bottom}" stroke="#444"/>')
    for decade in range(math.ceil(x0), math.floor(x1) + 1):
        x, _ = at(10**decade, 0)
        out.append(
            f'<text x="{x}" y="{height - bottom + 16}" font-size="11" text-anchor="middle">{10**decade:,}</text>'
        )
    for tick in range(0, math.ceil(y1) + 1):
        _, y = at(10**x0, tick)
        out.append(f'<text x="{left - 8}" y="{y + 4}" font-size="11" text-anchor="end">{tick}</text>')
    out.append(
        f'<text x="{(left + width) / 2}" y="{height - 4}" font-size="12" text-anchor="middle">vocabulary size '
        "(log)</text>"
    )
    out.append(f'<text x="12" y="{top + 80}" font-size="12" transform="rotate(-90 12 {top + 80})">chars / token</text>')
    line = " ".join(f"{x},{y}" for x, y in (at(p["vocab_size"], p["chars_per_token"]) for p in curve["ours"]))
    out.append(f'<polyline points="{line}" fill="none" stroke="#1f77b4" stroke-width="2"/>')
    for p in curve["ours"]:
        x, y = at(p["vocab_size"], p["chars_per_token"])
        out.append(
            f'<circle cx="{x}" cy="{y}" r="3" fill="#1f77b4"><title>{html.escape(name)} at {p["vocab_size"]:,}: '
            f"{p['chars_per_token']:.2f}</title></circle>"
        )
    for k, p in enumerate(curve["production"]):
        x, y = at(p["vocab_size"], p["chars_per_token"])
        label = html.escape(p["name"])
        out.append(
            f'<circle class="production" cx="{x}" cy="{y}" r="4" fill="#d62728"><title>{label}: '
            f"{p['chars_per_token']:.2f}</title></circle>"
        )
        # neighbours' labels alternate above and below their points, so they do not overlap
        out.append(
            f'<text x="{x}" y="{y - 8 if k % 2 == 0 else y + 18}" font-size="11" text-anchor="middle">{label}</text>'
        )
    out.append("</svg>")
    return "\n".join(out)


def compare_rows(text: str, named: Sequence[tuple[str, Tokenizer]]) -> list[dict[str, Any]]:
    rows = []
    for row in lab.text_rows(text, named):
        c = lab.compression(text, len(row["cells"]))
        rows.append(
            {"name": row["name"], "cells": row["cells"], "tokens": c["tokens"], "chars_per_token": c["chars_per_token"]}
        )
    return rows


STYLE = """
body { font-family: system-ui, sans-serif; margin: 24px; color: #222; max-width: 1100px; }
h1 { font-size: 22px; } h2 { font-size: 17px; margin-top: 28px; }
.tokens { font-family: ui-monospace, monospace; font-size: 15px; line-height: 2.1; }
.tok { display: inline-block; padding: 0 1px; margin: 2px 2px 2px 0; border-radius: 3px; white-space: pre; line-height: 1.5; }
.c0 { background: #bcdcf5; } .c1 { background: #f5e1bc; } .c2 { background: #c8efc8; }
.c3 { background: #f5c6cb; } .c4 { background: #dcd0f5; } .c5 { background: #f5f0b0; }
table { border-collapse: collapse; width: 100%; table-layout: fixed; }
th:nth-child(1) { width: 180px; } th:nth-child(2), th:nth-child(3) { width: 100px; } td, th { padding: 4px 10px; border-bottom: 1px solid #ddd; text-align: left; vertical-align: top; }
#slider { width: 520px; } .muted { color: #666; font-size: 13px; }
"""

SCRIPT = """
const DATA = JSON.parse(document.getElementById('lab-data').textContent);
function cell(text, id, k) {
  const s = document.createElement('span');
  s.className = 'tok c' + (k % 6);
  s.textContent = text;
  s.title = id === undefined ? text : 'id ' + id + ': ' + text;
  s.dataset.id = id;
  return s;
}
function drawTokens(target, cells) {
  target.replaceChildren(...cells.map(([id, text], k) => cell(text, id, k)));
}
function partsAfter(k) {
  // the parts of every piece once the first k merges are made: the last state whose merge
  // rank is at most the k-th merge's id (-1: the starting parts)
  const limit = k === 0 ? -1 : DATA.slider.steps[k - 1];
  const out = [];
  for (const piece of DATA.slider.pieces) {
    let state = piece.states[0];
    for (const s of piece.states) if (s.rank <= limit) state = s;
    for (const p of state.parts) out.push([DATA.slider.ids[p], p]);
  }
  return out;
}
function onSlide() {
  const k = Number(document.getElementById('slider').value);
  const cells = partsAfter(k);
  drawTokens(document.getElementById('replay'), cells);
  const last = k === 0 ? 'no merge yet' : 'merge ' + (k - 1) + ' made id ' + DATA.slider.steps[k - 1];
  document.getElementById('slider-label').textContent = k + ' of ' + DATA.slider.steps.length + ' merges (' + last + '): ' + cells.length + ' tokens';
}
drawTokens(document.getElementById('tokens'), DATA.tokens);
const slider = document.getElementById('slider');
slider.max = DATA.slider.steps.length;
slider.value = DATA.slider.steps.length;
slider.addEventListener('input', onSlide);
onSlide();
for (const row of DATA.compare) drawTokens(document.getElementById('row-' + row.index), row.cells);
"""


def build_page(
    text: str, tok: Tokenizer, name: str, production: Mapping[str, Tokenizer], rows: list[dict[str, Any]] | None = None
) -> str:
    """The lab page for `text` under `tok` (called `name`), beside the `production`
    encodings; `rows`: `compare_rows` already made for them (else made here)."""
    ids = tok.encode_ordinary(text)
    tokens = list(zip(ids, lab.token_texts(tok, ids)))
    rows = rows if rows is not None else compare_rows(text, [(name, tok), *production.items()])
    for k, row in enumerate(rows):
        row["index"] = k
    curve = compression_curve(tok, text, production)
    data = {
        "tokens": tokens,
        "slider": slider_data(tok, text),
        "compare": [{"index": r["index"], "cells": r["cells"]} for r in rows],
    }
    c = lab.compression(text, len(ids))
    table = "\n".join(
        f"<tr><td>{html.escape(r['name'])}</td><td>{r['tokens']:,}</td><td>{r['chars_per_token']:.2f}</td><td "
        f'class="tokens" id="row-{r["index"]}"></td></tr>'
        for r in rows
    )
    # "</" cannot close the script element early: the JSON escapes it.
    payload = json.dumps(data, ensure_ascii=False).replace("</", "<\\/")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>tokenmill lab: {html.escape(name)}</title>
<style>{STYLE}</style></head>
<body>
<h1>tokenmill lab: {html.escape(name)}</h1>
<p class="muted">{tok.unit}-level BPE, pattern {html.escape(tok.pattern)}, {tok.vocab_size:,} ids ({len(tok.merges or []):,} merges).
{c["tokens"]:,} tokens for {c["chars"]:,} characters: {c["chars_per_token"]:.2f} chars/token. Hover a token for its id.</p>
<h2>Tokens</h2>
<div class="tokens" id="tokens"></div>
<h2>Merge by merge</h2>
<input type="range" id="slider" min="0" step="1"> <span id="slider-label" class="muted"></span>
<div class="tokens" id="replay"></div>
<h2>Compression against vocabulary size</h2>
{curve_svg(curve, name)}
<h2>The same text under other tokenizers</h2>
<table><tr><th>tokenizer</th><th>tokens</th><th>chars/token</th><th>tokens</th></tr>
{table}
</table>
<script type="application/json" id="lab-data">{payload}</script>
<script>{SCRIPT}</script>
</body></html>
"""
