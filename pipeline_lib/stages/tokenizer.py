"""Stage: learn BPE merges from a counts version; publish the tokenizer files."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Annotated, Any, Literal

from pipeline_lib import counting
from pipeline_lib.config import STRICT, doc
from pipeline_lib.counting import COUNTS_FILE
from pipeline_lib.fsio import InputError
from pipeline_lib.report import notable_tokens
from pipeline_lib.stages import spec
from pipeline_lib.stages.spec import Context, Output, Stage
from pipeline_lib.store import ArtifactStore, VersionRef
from pipeline_lib.tokenizer import ENDOFTEXT, PieceTable, Tokenizer
from pipeline_lib.tokenizer.core import MAX_VOCAB_SIZE, UNIT_DESCRIPTIONS
from pipeline_lib.tokenizer.load import files as tokenizer_file_bytes

TOKENIZER_KIND = "tokenizer"


@dataclass(frozen=True)
class TokenizerConfig:
    __pydantic_config__ = STRICT

    vocab_size: Annotated[int, doc("total ids: the unit's alphabet (256 bytes, or the corpus's characters) + merges + special tokens")] = 4096
    special_tokens: Annotated[tuple[str, ...], doc("special tokens, appended after the merges in this order")] = (ENDOFTEXT,)
    min_frequency: Annotated[int, doc("stop merging when the best pair occurs fewer times")] = 2
    unit: Annotated[
        Literal["byte", "char", "word"],
        doc(f"what BPE starts from. byte: {UNIT_DESCRIPTIONS['byte']}. char: {UNIT_DESCRIPTIONS['char']}. word: {UNIT_DESCRIPTIONS['word']}"),
    ] = "byte"
    unknown: Annotated[
        Literal["unk", "bytes"],
        doc("char and word units: a character unseen at training becomes <unk> (an id), or its bytes (byte fallback: +256 ids at most)"),
    ] = "unk"
    lowercase: Annotated[bool, doc("word unit: lowercase the words")] = False

    def __post_init__(self):
        if self.unit == "byte" and self.vocab_size < 256 + len(self.special_tokens):
            raise InputError(f"vocab_size={self.vocab_size} is too small: need at least 256 + {len(self.special_tokens)} special token(s)")
        if self.vocab_size < len(self.special_tokens) + 2:
            raise InputError(f"vocab_size={self.vocab_size} is too small: need at least 2 + {len(self.special_tokens)} special token(s)")
        if self.vocab_size > MAX_VOCAB_SIZE:  # refused here, before any stage runs, not after counting
            raise InputError(f"vocab_size={self.vocab_size} is too large: the largest vocabulary is {MAX_VOCAB_SIZE:,} ids (MAX_VOCAB_SIZE)")
        if len(set(self.special_tokens)) != len(self.special_tokens):
            raise InputError(f"duplicate special tokens in {self.special_tokens}")
        if self.min_frequency < 1:
            raise InputError("min_frequency must be at least 1")
        if self.lowercase and self.unit != "word":
            raise InputError(f"lowercase is for the word unit (unit={self.unit!r} keeps case)")

    def params(self) -> dict[str, Any]:
        # The unit's fields enter the version id when they differ from byte-level BPE's, so
        # byte-level versions keep the ids they had before units existed.
        params = {**asdict(self), "special_tokens": list(self.special_tokens)}
        if self.unit == "byte":
            del params["unit"], params["unknown"], params["lowercase"]
        elif not self.lowercase:
            del params["lowercase"]
        return params


def tokenizer_files(tok: Tokenizer) -> dict[str, bytes]:
    return tokenizer_file_bytes(tok)


def load_tokenizer(store: ArtifactStore, ref: VersionRef) -> Tokenizer:
    return Tokenizer.load(store.local_dir(ref.kind, ref.version))


def _learn(ctx: Context) -> Output:
    counts, config = ctx.inputs["counts"], ctx.config
    cmeta = ctx.store.manifest(counts.kind, counts.version)
    path = os.path.join(ctx.store.local_dir(counts.kind, counts.version), COUNTS_FILE)
    pieces, cnt = counting.read_counts(path)
    tok = Tokenizer.train(
        PieceTable(pieces, cnt),
        config.vocab_size,
        pattern=cmeta["meta"]["pattern"],
        special_tokens=config.special_tokens,
        min_frequency=config.min_frequency,
        progress=ctx.progress,
        unit=config.unit,
        unknown=config.unknown,
        lowercase=config.lowercase,
    )
    assert ctx.staging is not None  # the engine publishes this stage
    files = {name: ctx.staging.put_bytes(name, data) for name, data in tokenizer_files(tok).items()}
    notable = notable_tokens(tok, 10)
    meta = {
        **tok.metadata(),
        "unit_description": UNIT_DESCRIPTIONS[tok.unit],
        "n_merges": len(tok.merges or []),
        "requested_vocab_size": config.vocab_size,
        "first_merges": notable["first"],
        "last_merges": notable["last"],
        "longest_tokens": notable["longest"],
    }
    return Output(files=files, meta=meta)


TOKENIZER = Stage(
    name="learn_merges",
    kind=TOKENIZER_KIND,
    inputs=("counts",),
    config=TokenizerConfig,
    output_version=1,
    run=_learn,
)


def tokenizer_version(counts: VersionRef, config: TokenizerConfig) -> str:
    version = TOKENIZER.version({"counts": counts}, config)
    assert version is not None  # a stage with params: never content-addressed
    return version


def learn_tokenizer(store: ArtifactStore, counts: VersionRef, config: TokenizerConfig, progress=None) -> VersionRef:
    """Learn merges from a counts version; publish the tokenizer files."""
    return spec.produce(TOKENIZER, store, {"counts": counts}, config, progress=progress)
