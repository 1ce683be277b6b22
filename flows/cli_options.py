"""The stage configs as command-line options: one generator makes an option of every
described config field, and `configs_from_args` builds the configs back; which configs each
command takes (`RUN_CONFIGS` ...); the options every command shares (--store, --debug, the
task runner)."""

from __future__ import annotations

import argparse
import re
from typing import Any

from flows.cli_common import DEFAULT_STORE


def _add_store(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", default=DEFAULT_STORE, help="artifact store URL or path (default: %(default)s)")
    p.add_argument(
        "--storage-option",
        action="append",
        metavar="KEY=VALUE",
        help="fsspec option for the store and corpus, e.g. endpoint_url=http://127.0.0.1:9000 (repeatable); "
        "VALUE may be JSON. s3:// requests time out and retry by default (connect 10 s, read 20 s, 3 tries: "
        "pipeline_lib.fsio.S3_CONFIG_DEFAULTS); change them with config_kwargs='{\"read_timeout\": 120}'",
    )
    _add_debug(p, default=argparse.SUPPRESS)  # also after the command; the top-level flag sets the default


def _add_debug(p: argparse.ArgumentParser, default: Any = False) -> None:
    p.add_argument(
        "--debug",
        action="store_true",
        default=default,
        help="print the full traceback of a failure (also TOKENMILL_DEBUG=1)",
    )


def _add_runner(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workers", type=int, default=0, help="parallel workers for mapped stages (default: all cores)")
    p.add_argument(
        "--runner",
        choices=("threads", "processes", "dask"),
        default="threads",
        help="Prefect task runner (default: %(default)s)",
    )
    p.add_argument("--dask-address", help="existing Dask scheduler, e.g. tcp://10.0.0.5:8786 (with --runner dask)")


# Stage parameters are not written here: every field of a stage config (pipeline_lib.config)
# becomes an option, by one generator. Field `vocab_size` is `--vocab-size`; its description
# is the --help text, its default the option's default, a Literal its choices, a bool a
# --flag/--no-flag pair, a tuple a repeatable option. `configs_from_args` builds the configs
# back and validates them (a bad value is one `tokenmill: error:` line naming the flag).
# Flags whose name predates the configs and differs from the field's:
FLAG_ALIASES: dict[tuple[str, str], str] = {
    ("CorpusConfig", "sources"): "--corpus",
    ("CorpusConfig", "n_shards"): "--shards",
    ("TokenizerConfig", "special_tokens"): "--special-token",
    ("EncodeConfig", "workers"): "--threads-per-shard",  # --workers is the task runner's
    ("LMConfig", "preset"): "--lm-preset",
    ("LMConfig", "steps"): "--lm-steps",
    ("LMConfig", "minutes"): "--lm-minutes",
}


def _config_classes() -> dict[str, Any]:
    from pipeline_lib.lab import CompareConfig
    from pipeline_lib.stage_configs import stage_configs
    from pipeline_lib.sweep import SweepConfig

    return {**stage_configs(), "sweep": SweepConfig, "compare": CompareConfig}


# The configs each command takes, by the flow parameter they go to. "documents": one
# config per document stage (pipeline_lib.stages.documents: --dedup ...), the flows'
# `documents` parameter.
DOCUMENTS = "documents"


RUN_CONFIGS = ("corpus", DOCUMENTS, "count", "tokenizer", "encode", "lm")


TOKENIZER_CONFIGS = ("corpus", DOCUMENTS, "count", "tokenizer")


ENCODE_CONFIGS = ("corpus", DOCUMENTS, "encode")


LM_CONFIGS = ("lm",)


REPORT_CONFIGS = ("corpus", "report")


SAMPLE_CONFIGS = ("sample",)


SWEEP_CONFIGS = ("corpus", "count", "encode", "lm", "sweep")


COMPARE_CONFIGS = ("compare",)


def flag_of(cls: type, name: str) -> str:
    """A field's flag: an alias above, one the config declares (``__cli_flags__``), else --<field>."""
    declared = getattr(cls, "__cli_flags__", {}).get(name)
    return FLAG_ALIASES.get((cls.__name__, name)) or declared or "--" + name.replace("_", "-")


def _dest(cls: type, name: str) -> str:
    return f"{cls.__name__}.{name}"


def _parse_value(f, text: str) -> Any:
    if f.optional and text.strip().lower() in ("", "none"):
        return None
    try:
        return f.item_type(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid {f.item_type.__name__} value: {text!r}") from None


# The --help group of each config's options, in words.
CONFIG_TITLES = {
    "CorpusConfig": "corpus options (where the text comes from, how it is read and sharded)",
    "CountConfig": "counting options (how text is split into pieces and counted)",
    "TokenizerConfig": "tokenizer options (the vocabulary to learn)",
    "EncodeConfig": "encoding options (how documents become token shards)",
    "LMConfig": "language model options (the GPT to train and its budget)",
    "ReportConfig": "report options (compression against vocabulary size)",
    "SampleConfig": "sampling options (text from a trained model)",
    "SweepConfig": "sweep options (which tokenizers, and how their models get equal compute)",
    "CompareConfig": "compare options (tokenizers side by side on the same held-out text)",
}


def add_config_options(p: argparse.ArgumentParser, cls: type, defaults: Any = None, title: str | None = None) -> None:
    """One option per described field of config `cls` (defaults from `defaults`, an instance,
    else from the class)."""
    from pipeline_lib.config import fields_of

    group = p.add_argument_group(title or CONFIG_TITLES.get(cls.__name__, cls.__name__))
    for f in fields_of(cls):
        default = getattr(defaults, f.name) if defaults is not None else f.default
        shown = ", ".join(map(str, default)) if f.repeated and default else default
        help_text = f"{f.description} (default: {shown})".replace("%", "%%")
        kw: dict[str, Any] = {"dest": _dest(cls, f.name), "help": help_text}
        if f.type is bool:
            kw.update(action=argparse.BooleanOptionalAction, default=default)
        elif f.repeated:
            # Repeatable; numbers and choices may also be given comma-separated (--vocab-sizes 256,512).
            split = f.item_type in (int, float) or f.choices is not None
            kw.update(
                action="extend",
                default=None,
                metavar=f.name.upper().rstrip("S") or f.name.upper(),
                type=(lambda t, f=f: [_parse_value(f, x) for x in t.split(",")])
                if split
                else (lambda t, f=f: [_parse_value(f, t)]),
            )
        else:
            kw.update(
                type=lambda t, f=f: _parse_value(f, t),
                default=default,
                choices=f.choices,
                metavar=None if f.choices else f.name.upper(),
            )
        group.add_argument(flag_of(cls, f.name), **kw)
        if f.repeated and f.item_type is str and default:
            # A repeatable option only adds; this one says "none at all" (e.g. no special tokens).
            group.add_argument(
                "--no-" + flag_of(cls, f.name)[2:],
                dest=kw["dest"],
                action="store_const",
                const=[],
                help=f"none at all (instead of the default: {shown})".replace("%", "%%"),
            )
    p.set_defaults(**{f"_defaults.{cls.__name__}": defaults})


def configs_from_args(args: argparse.Namespace, names: tuple[str, ...]) -> dict[str, Any]:
    """``{flow parameter: config}`` built from the parsed options, validated.

    Raises:
        ConfigError: a value a config refuses; the message names the flag.
    """
    import dataclasses

    from pipeline_lib.config import fields_of, validate
    from pipeline_lib.errors import ConfigError, InputError

    classes = _config_classes()
    out: dict[str, Any] = {}
    for name in names:
        if name == DOCUMENTS:
            from pipeline_lib.stages.documents import DocumentStages, document_stages

            options = tuple(entry.option for entry in document_stages())
            out[name] = DocumentStages(**configs_from_args(args, options))
            continue
        cls = classes[name]
        defaults = getattr(args, f"_defaults.{cls.__name__}", None)
        values = {f.name: getattr(defaults, f.name) for f in dataclasses.fields(cls)} if defaults is not None else {}
        for f in fields_of(cls):
            value = getattr(args, _dest(cls, f.name))
            if value is not None or not f.repeated:
                values[f.name] = value
        try:
            out[name] = validate(cls, values, cls.__name__)
        except InputError as e:
            named = [f for f in fields_of(cls) if re.search(rf"(?<![\w]){f.name}(?![\w])", str(e))]
            if not named:
                raise ConfigError(str(e)) from e
            f = max(named, key=lambda f: len(f.name))
            value = values.get(f.name)
            shown = " ".join(map(str, value)) if isinstance(value, (list, tuple)) else value
            raise ConfigError(f"{flag_of(cls, f.name)} {shown}: {e}") from e
    return out


def _add_config_groups(p: argparse.ArgumentParser, names: tuple[str, ...], **defaults: Any) -> None:
    classes = _config_classes()
    for name in names:
        if name == DOCUMENTS:
            from pipeline_lib.stages.documents import document_stages

            for entry in document_stages():
                add_config_options(p, entry.stage.config, title=entry.title)
            continue
        add_config_options(p, classes[name], defaults.get(name))


def _report_corpus():
    from pipeline_lib.stages import REPORT_CORPUS

    return REPORT_CORPUS
