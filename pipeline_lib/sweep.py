"""Which tokenizer makes the better model: one GPT per tokenizer, trained at equal compute,
compared in bits per byte. No Prefect here (flows/sweep.py runs it).

A sweep has one arm per (unit, vocabulary size): a tokenizer trained on the corpus, the
corpus encoded with it, and the same GPT (architecture, batch, schedule shape) trained on
those tokens. The arms get the same compute, one of two ways (`SweepConfig.compute`):

* ``flops`` (default; machine-independent): the same training FLOPs per arm. FLOPs per
  token are the model's own count, 6 N + 12 L d T (`GPT.flops_per_token`), where N
  includes the token table: it is also the output layer (tied), and the unembedding matmul
  costs 6 V d per token. A bigger vocabulary pays more per token and so trains on fewer
  tokens, each of which covers more text. The budget is `flops_per_arm`, or by default
  what the LM's step count costs on the arm with the smallest vocabulary, so no arm trains
  more steps than asked. Each arm's step count is the budget over its cost per step,
  rounded to whole steps (the spend is equal within half a step), and its LR schedule
  (warmup, cosine) completes there. The LM's time budget does not apply.
* ``time``: the same wall-clock budget per arm (the LM's minutes): what each arm reaches
  depends on its throughput on the machine that trains it.

Arms are compared in validation bits per byte (the model's val loss in nats per token over
the bytes its target tokens encode, `pipeline_lib.lm.trainer.evaluate`): a loss per token
depends on what a token is, a loss per byte of text does not. Beside it the table gives
compression (bytes per token), tokens and bytes seen, training FLOPs, throughput and the
parameter counts (total, and the embedding tables').

The comparison is a stage of its own (`sweep_stage`): its inputs are the arms' model
versions, its output a ``sweep`` version (sweep.json, sweep.md, sweep.png) made by the
stage engine like every other.
"""

from __future__ import annotations

import base64
import dataclasses
import io
import json
import math
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pipeline_lib.config import STRICT, check_vocab_sizes_limit, doc
from pipeline_lib.errors import ConfigError, InputError
from pipeline_lib.stages.spec import Context, Output, Stage
from pipeline_lib.store import ArtifactStore, VersionRef, split_key

SWEEP_KIND = "sweep"
# Bump when the comparison files (sweep.json / .md / .png) change for the same models and config.
SWEEP_OUTPUT_VERSION = 1


def available_units() -> tuple[str, ...]:
    """The tokenizer units the tokenizer stage offers (its config's `unit` choices), byte first."""
    from pipeline_lib.stages import TokenizerConfig

    hints = typing.get_type_hints(TokenizerConfig, include_extras=True)
    if "unit" not in hints:
        return ("byte",)
    tp = hints["unit"]
    while typing.get_origin(tp) is Annotated:
        tp = typing.get_args(tp)[0]
    choices = typing.get_args(tp) if typing.get_origin(tp) is Literal else ()
    return tuple(sorted(choices, key=lambda u: u != "byte")) or ("byte",)


@dataclass(frozen=True)
class SweepConfig:
    """The sweep: which tokenizers, and how their models get equal compute."""

    __pydantic_config__ = STRICT

    vocab_sizes: Annotated[tuple[int, ...], doc("vocabulary sizes of the tokenizers compared (comma-separated)")] = (
        512,
        1024,
        4096,
    )
    units: Annotated[
        tuple[Literal["byte", "char", "word"], ...],
        doc(
            "tokenizer units compared, each at every vocabulary size (comma-separated; char and word where the "
            "tokenizer offers them)"
        ),
    ] = ("byte",)
    compute: Annotated[
        Literal["flops", "time"],
        doc(
            "equal compute per arm: flops (same training FLOPs, embedding and unembedding counted; "
            "machine-independent) or time (same --lm-minutes)"
        ),
    ] = "flops"
    flops_per_arm: Annotated[
        float | None,
        doc(
            "training FLOPs per arm with --compute flops (none: what --lm-steps steps cost with the smallest "
            "vocabulary)"
        ),
    ] = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "vocab_sizes", tuple(int(v) for v in self.vocab_sizes))
        object.__setattr__(self, "units", tuple(str(u) for u in self.units))
        if not self.vocab_sizes:
            raise InputError("vocab_sizes is empty: give at least one vocabulary size")
        if len(set(self.vocab_sizes)) != len(self.vocab_sizes):
            raise InputError(f"vocab_sizes={list(self.vocab_sizes)}: each size once")
        check_vocab_sizes_limit(self.vocab_sizes)
        offered = available_units()
        unknown = [u for u in self.units if u not in offered]
        if not self.units or unknown:
            raise InputError(f"units={list(self.units)}: choose among {', '.join(offered)}")
        if len(set(self.units)) != len(self.units):
            raise InputError(f"units={list(self.units)}: each unit once")
        if self.flops_per_arm is not None and not (math.isfinite(self.flops_per_arm) and self.flops_per_arm > 0):
            raise InputError(f"flops_per_arm={self.flops_per_arm!r}: give a number of FLOPs > 0 (or none)")
        from pipeline_lib.stages import TokenizerConfig

        arms(self, TokenizerConfig())  # every arm's tokenizer config is valid (default special tokens)

    def params(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "vocab_sizes": list(self.vocab_sizes), "units": list(self.units)}


# --------------------------------------------------------------------------- arms
@dataclass(frozen=True)
class Arm:
    """One tokenizer of the sweep and the tokenizer config that makes it."""

    unit: str
    vocab_size: int  # as asked; the tokenizer may have fewer ids (min_frequency)
    tokenizer: Any  # TokenizerConfig

    @property
    def name(self) -> str:
        return f"{self.unit}-{self.vocab_size}"


def arms(config: SweepConfig, tokenizer: Any) -> list[Arm]:
    """The sweep's arms, unit by unit, vocabulary sizes ascending: `tokenizer` (the other
    fields of every arm's tokenizer config) with each size and unit.

    Raises:
        InputError: a vocabulary size too small for a unit (naming `vocab_sizes`).
    """
    has_units = any(f.name == "unit" for f in dataclasses.fields(tokenizer))
    out = []
    for unit in config.units:
        for size in sorted(config.vocab_sizes):
            try:
                tok = dataclasses.replace(tokenizer, vocab_size=size, **({"unit": unit} if has_units else {}))
            except InputError as e:
                raise InputError(f"vocab_sizes: {size} does not make a {unit}-level tokenizer: {e}") from None
            out.append(Arm(unit, size, tok))
    return out


# --------------------------------------------------------------------------- equal compute
@dataclass(frozen=True)
class ModelCost:
    """What one model costs: parameters and training FLOPs per token and per step."""

    n_params: int  # every parameter, tied tables once (`GPT.num_params(non_embedding=False)`)
    n_embedding: int  # the token table (also the output layer) and the position table
    flops_per_token: float  # forward + backward, `GPT.flops_per_token`
    tokens_per_step: int  # `TrainConfig.tokens_per_step`

    @property
    def flops_per_step(self) -> float:
        return self.flops_per_token * self.tokens_per_step


def model_cost(train_config: Any, vocab_size: int) -> ModelCost:
    """The cost of `train_config`'s GPT with `vocab_size` ids, counted by the model's own
    code on torch's meta device (no memory, no weights)."""
    import torch

    from pipeline_lib.lm.model import GPT, build_model

    with torch.device("meta"):
        model = build_model(train_config.model.with_vocab(vocab_size))
    # as the model counts it: rows padded for the GPU's tiles are not
    token_table = vocab_size * train_config.model.n_embd
    if isinstance(model, GPT):
        embedding = token_table + model.transformer.wpe.weight.numel()
    else:  # the MLP's output layer is its own, not the token table: count it too
        embedding = token_table + model.output.weight.numel() + model.output.bias.numel()
    return ModelCost(
        model.num_params(non_embedding=False), embedding, float(model.flops_per_token()), train_config.tokens_per_step
    )


@dataclass(frozen=True)
class Plan:
    """Each arm's LM config (by arm name) and the compute every arm gets."""

    compute: str
    lm: dict[str, Any]  # arm name -> LMConfig
    flops_per_arm: float | None  # compute == "flops"
    minutes_per_arm: float | None  # compute == "time"

    def describe(self) -> str:
        """One line for the log: the compute per arm and what it buys each arm."""
        if self.compute == "time":
            return f"{self.minutes_per_arm:g} min per arm"
        per_arm = ", ".join(f"{name} {cfg.train_config().max_steps} steps" for name, cfg in self.lm.items())
        return f"{si(self.flops_per_arm)} training FLOPs per arm ({per_arm})"


def plan(config: SweepConfig, lm: Any, vocab_sizes: Mapping[str, int]) -> Plan:
    """The LM config of every arm (`vocab_sizes`: arm name -> ids of its token set).

    Raises:
        ConfigError: --compute time without --lm-minutes; a FLOPs budget that buys an arm
            no step.
    """
    if config.compute == "time":
        if lm.minutes is None:
            raise ConfigError("--compute time gives every arm the same --lm-minutes, and it is none: give --lm-minutes")
        return Plan("time", {name: lm for name in vocab_sizes}, None, float(lm.minutes))
    base = dataclasses.replace(lm, minutes=None)  # a time budget would cut arms short unequally
    costs = {name: model_cost(base.train_config(), v) for name, v in vocab_sizes.items()}
    budget = config.flops_per_arm
    if budget is None:
        cheapest = min(costs.values(), key=lambda c: c.flops_per_step)
        budget = base.train_config().max_steps * cheapest.flops_per_step
    per_arm = {}
    for name, cost in costs.items():
        steps = round(budget / cost.flops_per_step)
        if steps < 1:
            raise ConfigError(
                f"--flops-per-arm {budget:.3g} buys arm {name} no training step (one costs "
                f"{cost.flops_per_step:.3g} FLOPs): give more"
            )
        per_arm[name] = dataclasses.replace(base, steps=steps)
    return Plan("flops", per_arm, float(budget), None)


# --------------------------------------------------------------------------- the comparison
def arm_row(store: ArtifactStore, name: str, model: VersionRef) -> dict[str, Any]:
    """One arm's figures, read from its model version and the token set it trained on."""
    from pipeline_lib.lm.config import TrainConfig
    from pipeline_lib.stages import compression_summary

    manifest = store.manifest(model.kind, model.version)
    tmeta = store.manifest(*split_key(manifest["parents"]["tokens"]))["meta"]
    metrics, run = manifest["meta"]["metrics"], manifest["meta"].get("run") or {}
    train_config = TrainConfig.from_dict(manifest["params"])
    cost = model_cost(train_config, tmeta["vocab_size"])
    # separators included, as trained
    stream_bytes_per_token = tmeta["totals"]["n_bytes"] / max(1, tmeta["totals"]["n_tokens"])
    steps = int(metrics["steps"])
    tokens_seen = steps * cost.tokens_per_step
    tps = run.get("tokens_per_s")
    unit, _, _ = name.partition("-")
    # The untrained model's val bits/byte (its step-0 evaluation): where each arm starts.
    history = json.loads(store.read_bytes(model.kind, model.version, "history.json"))
    start_bpb = next((h["val_bpb"] for h in history if h.get("step") == 0 and h.get("val_bpb") is not None), None)
    return {
        "arm": name,
        "unit": unit,
        "vocab_size": tmeta["vocab_size"],
        "bytes_per_token": compression_summary(tmeta)["bytes_per_token"],
        "params": cost.n_params,
        "embedding_params": cost.n_embedding,
        "steps": steps,
        "tokens_seen": tokens_seen,
        "bytes_seen": tokens_seen * stream_bytes_per_token,
        "train_flops": tokens_seen * cost.flops_per_token,
        "val_loss": metrics.get("final_val_loss"),
        "start_val_bpb": start_bpb,
        "val_bpb": metrics.get("val_bpb"),
        "tokens_per_s": tps,
        "bytes_per_s": tps * stream_bytes_per_token if tps else None,
        "model": model.key,
        "tokens_per_step": cost.tokens_per_step,
        "flops_per_token": cost.flops_per_token,
    }


def si(x: float | None, digits: int = 3) -> str:
    if x is None:
        return "-"
    for div, suffix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.{digits}g}{suffix}"
    return f"{x:.{digits}g}"


TABLE_COLUMNS = (
    ("arm", "arm"),
    ("vocab", "vocab_size"),
    ("bytes/token", "bytes_per_token"),
    ("params", "params"),
    ("embedding", "embedding_params"),
    ("steps", "steps"),
    ("tokens seen", "tokens_seen"),
    ("bytes seen", "bytes_seen"),
    ("train FLOPs", "train_flops"),
    ("tokens/s", "tokens_per_s"),
    ("bytes/s", "bytes_per_s"),
    ("val loss", "val_loss"),
    ("start bpb", "start_val_bpb"),
    ("val bpb", "val_bpb"),
)


def format_cell(key: str, value: Any) -> str:
    if value is None:
        return "-"
    if key in ("bytes_per_token",):
        return f"{value:.3f}"
    if key in ("val_loss", "val_bpb", "start_val_bpb"):
        return f"{value:.4f}"
    if key in ("params", "embedding_params", "tokens_seen", "bytes_seen", "train_flops", "tokens_per_s", "bytes_per_s"):
        return si(value)
    return str(value)


def table_markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    """The comparison as a markdown table, the best val bits/byte in bold."""
    scored = [r["val_bpb"] for r in rows if r.get("val_bpb") is not None]
    best = min(scored) if scored else None
    lines = [
        "| " + " | ".join(h for h, _ in TABLE_COLUMNS) + " |",
        "|" + "|".join("---" if k == "arm" else "---:" for _, k in TABLE_COLUMNS) + "|",
    ]
    for r in rows:
        cells = [format_cell(k, r.get(k)) for _, k in TABLE_COLUMNS]
        if best is not None and r.get("val_bpb") == best:
            cells[-1] = f"**{cells[-1]}**"
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary_markdown(result: Mapping[str, Any], image: str | None = None) -> str:
    """The sweep's report: what was compared at what compute, the table, and the plot
    (`image`: its file name or a data URI; `plot_data_uri` makes one)."""
    rows = result["rows"]
    if result["compute"] == "flops":
        how = (
            f"equal training FLOPs: {si(result['flops_per_arm'])} per arm (6·N·T + attention, token table counted; "
            f"spent within {result['flops_spread']:.1%} in whole steps)"
        )
    else:
        how = f"equal wall-clock budget: {result['minutes_per_arm']:g} min per arm"
    best = min((r for r in rows if r.get("val_bpb") is not None), key=lambda r: r["val_bpb"], default=None)
    verdict = (
        f"Best: **{best['arm']}** at {best['val_bpb']:.4f} val bits/byte."
        if best
        else ("No arm reported a val bits/byte (no val split).")
    )
    plot = f"\n\n![sweep]({image})" if image else ""
    return (
        f"## Which tokenizer makes the better model\n\n{len(rows)} arms, {how}. "
        f"{verdict}\n\n{table_markdown(rows)}{plot}\n"
    )


def plot_data_uri(png: bytes) -> str:
    return f"data:image/png;base64,{base64.b64encode(png).decode()}"


def write_plot(rows: Sequence[Mapping[str, Any]], curves: Mapping[str, Sequence[tuple[float, float]]]) -> bytes:
    """PNG: val bits/byte against training FLOPs per arm (left); final val bits/byte and
    bytes/token against vocabulary size per unit (right). matplotlib's Agg canvas, no pyplot."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.5), dpi=100)
    FigureCanvasAgg(fig)
    left, right = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    for name, points in curves.items():
        if points:
            left.plot(*zip(*points), marker=".", label=name)
    left.set_xlabel("training FLOPs")
    left.set_ylabel("val bits/byte")
    left.set_title("val bits/byte during training")
    left.grid(True, alpha=0.3)
    if curves:
        left.legend(fontsize=8)
    compression = right.twinx()
    for unit in dict.fromkeys(r["unit"] for r in rows):
        mine = sorted((r for r in rows if r["unit"] == unit), key=lambda r: r["vocab_size"])
        scored = [(r["vocab_size"], r["val_bpb"]) for r in mine if r.get("val_bpb") is not None]
        if scored:
            right.plot(*zip(*scored), marker="o", label=f"{unit}: val bits/byte")
        compression.plot(
            [r["vocab_size"] for r in mine],
            [r["bytes_per_token"] for r in mine],
            linestyle="--",
            marker="x",
            alpha=0.6,
            label=f"{unit}: bytes/token",
        )
    right.set_xscale("log", base=2)
    right.set_xlabel("vocabulary size")
    right.set_ylabel("final val bits/byte")
    compression.set_ylabel("bytes/token")
    right.set_title("at equal compute")
    right.grid(True, alpha=0.3)
    handles, labels = right.get_legend_handles_labels()
    h2, l2 = compression.get_legend_handles_labels()
    if handles or h2:
        right.legend(handles + h2, labels + l2, fontsize=8, loc="best")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def _curve(store: ArtifactStore, model: VersionRef, row: Mapping[str, Any]) -> list[tuple[float, float]]:
    history = json.loads(store.read_bytes(model.kind, model.version, "history.json"))
    flops_per_step = row["flops_per_token"] * row["tokens_per_step"]
    return [(h["step"] * flops_per_step, h["val_bpb"]) for h in history if h.get("val_bpb") is not None]


def _compare(ctx: Context) -> Output:
    config, store, staging = ctx.config, ctx.store, ctx.staging
    assert staging is not None  # the engine publishes this stage
    rows = [arm_row(store, name, ref) for name, ref in ctx.inputs.items()]
    curves = {r["arm"]: _curve(store, ctx.inputs[r["arm"]], r) for r in rows}
    result: dict[str, Any] = {
        "compute": config.compute,
        "flops_per_arm": None,
        "flops_spread": None,
        "minutes_per_arm": None,
        "rows": rows,
    }
    if config.compute == "flops":
        # The budget: as given, or what the cheapest arm per step spent (its whole step count, by `plan`).
        cheapest = min(rows, key=lambda r: r["flops_per_token"])
        budget = config.flops_per_arm or cheapest["train_flops"]
        result["flops_per_arm"] = budget
        result["flops_spread"] = max(abs(r["train_flops"] / budget - 1.0) for r in rows)
    if config.compute == "time":
        from pipeline_lib.lm.config import TrainConfig

        first = next(iter(ctx.inputs.values()))
        budget = TrainConfig.from_dict(store.manifest(first.kind, first.version)["params"]).time_budget_s
        result["minutes_per_arm"] = (budget or 0.0) / 60.0
    png = write_plot(rows, curves)
    files = {
        "sweep.json": staging.put_bytes("sweep.json", json.dumps(result, indent=2, sort_keys=True).encode()),
        "sweep.md": staging.put_bytes("sweep.md", summary_markdown(result, "sweep.png").encode()),
        "sweep.png": staging.put_bytes("sweep.png", png),
    }
    best = min((r for r in rows if r.get("val_bpb") is not None), key=lambda r: r["val_bpb"], default=None)
    return Output(
        files=files,
        meta={"compute": config.compute, "arms": [r["arm"] for r in rows], "best": best["arm"] if best else None},
    )


def sweep_stage(arm_names: Sequence[str]) -> Stage:
    """The comparison stage of a sweep over these arms: one model version per arm as input
    (named by the arm), a ``sweep`` version as output."""
    return Stage(
        name="compare_arms",
        kind=SWEEP_KIND,
        inputs=tuple(arm_names),
        config=SweepConfig,
        output_version=SWEEP_OUTPUT_VERSION,
        run=_compare,
    )


def compare(store: ArtifactStore, models: Mapping[str, VersionRef], config: SweepConfig) -> VersionRef:
    """The ``sweep`` version comparing `models` (arm name -> model version)."""
    from pipeline_lib.stages.spec import produce

    return produce(sweep_stage(list(models)), store, models, config)
