"""Stage configs as the one description of every pipeline parameter. No Prefect here.

Each stage has one frozen dataclass (`CorpusConfig`, `CountConfig`, `TokenizerConfig`,
`EncodeConfig`, `LMConfig`, `ReportConfig`). A field is declared once, with its type, its
default and its description:

    vocab_size: Annotated[int, doc("total ids: 256 bytes + merges + special tokens")] = 4096
    pattern: Annotated[Literal["gpt2", "cl100k", "o200k"], doc("pre-tokenization split pattern")] = "cl100k"

and everything else is derived from it: the CLI's options (flows/cli_options.py walks `fields_of`),
the flows' parameter schema (pydantic reads the same `Annotated` descriptions and `Literal`
choices, so Prefect's UI renders each config as a form), and the validation of deployment
parameters (`validate`: an unknown field or choice is refused with the field's name).

This module only describes; the stage modules keep their own `__post_init__` checks and
their version-id params (`params()` / `shard_params()`). It imports no stage module (they
import it): `pipeline_lib.stage_configs` names every config.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union

import pydantic
from pydantic_core import ErrorDetails

from pipeline_lib.errors import ConfigError, InputError

# Unknown keys in a config dict are an error, not silently dropped (pydantic reads this
# attribute on stdlib dataclasses).
STRICT = pydantic.ConfigDict(extra="forbid")


def doc(description: str) -> Any:
    """The `Annotated` metadata that describes a config field (CLI --help, flow schema)."""
    return pydantic.Field(description=description)


@dataclass(frozen=True)
class FieldInfo:
    """One config field, as the CLI and the tests see it."""

    name: str
    type: Any  # the type without Annotated / Optional
    description: str
    default: Any
    optional: bool  # None is allowed
    choices: tuple[Any, ...] | None  # Literal choices
    repeated: bool  # tuple[...] / list[...]
    item_type: Any  # element type of a repeated field (else = type)


def _unwrap(tp: Any) -> tuple[Any, str, bool]:
    """(bare type, description, optional) of an annotation."""
    description = ""
    if typing.get_origin(tp) is Annotated:
        tp, *meta = typing.get_args(tp)
        for m in meta:
            if getattr(m, "description", None):
                description = m.description
    optional = False
    if typing.get_origin(tp) in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        optional = len(args) < len(typing.get_args(tp))
        tp = args[0] if len(args) == 1 else tp
    return tp, description, optional


@functools.cache
def fields_of(cls: type) -> tuple[FieldInfo, ...]:
    """The described fields of a config class (fields without a description are internal)."""
    hints = typing.get_type_hints(cls, include_extras=True)
    out = []
    for f in dataclasses.fields(cls):
        tp, description, optional = _unwrap(hints[f.name])
        if not description:
            continue
        default = (  # type: ignore[misc]
            f.default
            if f.default is not dataclasses.MISSING
            else (f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
        )
        origin = typing.get_origin(tp)
        choices = typing.get_args(tp) if origin is Literal else None
        repeated = origin in (tuple, list)
        item = typing.get_args(tp)[0] if repeated else tp
        if typing.get_origin(item) is Literal:
            choices, item = typing.get_args(item), type(typing.get_args(item)[0])
        elif choices:
            item = type(choices[0])
        out.append(FieldInfo(f.name, tp, description, default, optional, choices, repeated, item))
    return tuple(out)


def validate(cls: type, value: Any, what: str | None = None) -> Any:
    """`value` (a `cls`, a dict or None for the defaults) as a `cls`, validated.

    Raises:
        ConfigError: an unknown field, a value of the wrong type, a choice not offered, or a
            value the config's own checks refuse; the message names the field.
    """
    what = what or cls.__name__
    if value is None:
        value = {}
    if isinstance(value, cls):
        return value
    if not isinstance(value, dict):
        raise ConfigError(f"{what}: expected a mapping of {cls.__name__} fields, got {type(value).__name__}")
    try:
        return pydantic.TypeAdapter(cls).validate_python(value)
    except pydantic.ValidationError as e:
        problems = "; ".join(f"{'.'.join([what, *map(str, err['loc'])])}: {_message(err)}" for err in e.errors())
        raise ConfigError(problems) from None
    except InputError as e:
        raise ConfigError(f"{what}: {e}") from e


def _message(err: ErrorDetails) -> str:
    if err["type"] in ("extra_forbidden", "unexpected_keyword_argument"):
        return "unknown field"
    if err["type"] == "value_error":
        return str(err["msg"]).removeprefix("Value error, ")
    if err["type"] == "literal_error":
        return f"{err['msg'].lower()}, got {err.get('input')!r}"
    return err["msg"]


def check_vocab_sizes_limit(sizes: tuple[int, ...]) -> None:
    """Refuse vocabulary sizes above MAX_VOCAB_SIZE in a config, before any stage runs (the
    tokenizer would refuse them only after counting)."""
    from pipeline_lib.tokenizer.core import MAX_VOCAB_SIZE

    if sizes and max(sizes) > MAX_VOCAB_SIZE:
        raise InputError(
            f"vocab_sizes={list(sizes)}: {max(sizes)} is above the largest vocabulary, "
            f"{MAX_VOCAB_SIZE:,} ids (MAX_VOCAB_SIZE)"
        )


@dataclass(frozen=True)
class ReportConfig:
    """The tokenizer report: compression vs vocabulary size, fertility per language."""

    __pydantic_config__ = STRICT

    pattern: Annotated[
        Literal["gpt2", "cl100k", "o200k"], doc("pre-tokenization split pattern of the report's tokenizer")
    ] = "cl100k"
    vocab_sizes: Annotated[tuple[int, ...], doc("vocabulary sizes on the compression curve")] = (
        256,
        300,
        491,
        512,
        1024,
        2048,
        4096,
        8192,
        16384,
        32768,
    )

    def __post_init__(self):
        object.__setattr__(self, "vocab_sizes", tuple(int(v) for v in self.vocab_sizes))
        if not self.vocab_sizes or min(self.vocab_sizes) < 256:
            raise InputError(f"vocab_sizes={list(self.vocab_sizes)}: give sizes of at least 256")
        check_vocab_sizes_limit(self.vocab_sizes)


@dataclass(frozen=True)
class SampleConfig:
    """Sampling text from a trained model (`tokenmill lm sample`)."""

    __pydantic_config__ = STRICT

    prompt: Annotated[str, doc("prompt text (empty: start from the separator)")] = ""
    max_new_tokens: Annotated[int, doc("tokens to generate")] = 200
    temperature: Annotated[float, doc("softmax temperature; 0 is greedy")] = 0.8
    top_k: Annotated[int, doc("sample among the k most likely tokens (nanoGPT's default); 0: no top-k filter")] = 200
    seed: Annotated[int | None, doc("random seed (none: a fresh one)")] = None

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise InputError(f"max_new_tokens={self.max_new_tokens}: must be at least 1")
        if self.temperature < 0:
            raise InputError(f"temperature={self.temperature}: must be >= 0")
        if self.top_k < 0:
            raise InputError(f"top_k={self.top_k}: must be at least 0 (0: no top-k filter)")
