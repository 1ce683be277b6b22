"""The registry of document stages: stages between sharding and counting (no Prefect here).

A document stage takes corpus shards (its input role ``"corpus"``: the corpus, or the
output of the document stage before it) and writes corpus-shaped shards that counting and
encoding read in its place. Adding one is two files:

* a library module in `pipeline_lib` doing the work, with the stage's config (a frozen
  dataclass described as every stage config is, with an ``enabled()`` method: a stage is
  optional, and off unless its config says otherwise);
* a module here holding its `Stage` spec and one `register(DocumentStage(...))` call.

Everything else picks it up from `document_stages()`: the configs by name
(`pipeline_lib.stage_configs`, hence the CLI's options and the flows' forms), the flows'
``documents`` parameter (`documents_config`), the Prefect tasks and their artifacts
(`tasks.documents`), the run summary and the golden-output test.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pipeline_lib.config import STRICT
from pipeline_lib.stages.spec import Stage

# The input role a document stage reads and fills: corpus shards.
ROLE = "corpus"


@dataclass(frozen=True)
class DocumentStage:
    """A registered document stage.

    option: the config's name (the flows' ``documents.<option>``, `stage_configs()`'s key).
    title: the heading of its options in the CLI's --help.
    summary: its output manifest's meta -> the figures a run shows (a table artifact, the
        pipeline's summary).
    example: an enabled config, run by the golden-output test.
    """

    stage: Stage
    option: str
    title: str
    summary: Callable[[Mapping[str, Any]], Mapping[str, Any]]
    example: Any

    def enabled(self, config: Any) -> bool:
        return bool(config.enabled())


_REGISTERED: dict[str, DocumentStage] = {}


def register(entry: DocumentStage) -> DocumentStage:
    """Add a document stage (its module calls this once, at import)."""
    if entry.stage.inputs != (ROLE,):
        raise ValueError(
            f"document stage {entry.stage.name}: takes the inputs {entry.stage.inputs}, must take ({ROLE!r},)"
        )
    known = _REGISTERED.get(entry.option)
    if known is not None and known.stage.name != entry.stage.name:
        raise ValueError(f"document stage option {entry.option!r} is taken by {known.stage.name}")
    _REGISTERED[entry.option] = entry
    return entry


def unregister(option: str) -> None:
    _REGISTERED.pop(option, None)


@functools.cache
def _discover() -> None:
    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")


def document_stages() -> tuple[DocumentStage, ...]:
    """Every document stage, in the order they run (by option name: a fixed order)."""
    _discover()
    return tuple(_REGISTERED[k] for k in sorted(_REGISTERED))


# One class per set of stages: the flows' annotations keep the class they were given, so the
# same stages (again, after a test registers and removes one) must give that same class.
_CONFIG_CLASSES: dict[tuple[tuple[str, type], ...], type] = {}


def documents_config() -> type:
    """The flows' ``documents`` parameter type: a frozen dataclass with one field per
    document stage, its config (default: the config's default, i.e. off)."""
    stages = document_stages()
    key = tuple((e.option, e.stage.config) for e in stages)
    if key not in _CONFIG_CLASSES:
        _CONFIG_CLASSES[key] = _make_documents_config(stages)
    return _CONFIG_CLASSES[key]


def _make_documents_config(stages: tuple[DocumentStage, ...]) -> type:
    fields = [(e.option, e.stage.config, dataclasses.field(default_factory=e.stage.config)) for e in stages]
    cls = dataclasses.make_dataclass(
        "DocumentStages",
        fields,
        frozen=True,
        namespace={
            "__pydantic_config__": STRICT,
            "__doc__": "The optional stages between sharding and counting, each off unless enabled.",
        },
    )
    cls.__module__ = __name__  # found again by name (module __getattr__): a served flow pickles it by reference
    return cls


def __getattr__(name: str) -> Any:
    if name == "DocumentStages":
        return documents_config()
    raise AttributeError(name)


def enabled(documents: Any) -> list[tuple[DocumentStage, Any]]:
    """The document stages `documents` (a `documents_config()` instance) turns on, with
    their configs, in the order they run."""
    return [(e, getattr(documents, e.option)) for e in document_stages() if e.enabled(getattr(documents, e.option))]
