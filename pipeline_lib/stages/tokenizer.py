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
from pipeline_lib.store import ArtifactStore, VersionRef, split_key
from pipeline_lib.tokenizer import ENDOFTEXT, PieceTable, Tokenizer
from pipeline_lib.tokenizer.core import MAX_VOCAB_SIZE, UNIT_DESCRIPTIONS
from pipeline_lib.tokenizer.load import files as tokenizer_file_bytes

TOKENIZER_KIND = "tokenizer"


@dataclass(frozen=True)
class TokenizerConfig:
    __pydantic_config__ = STRICT

    vocab_size: Annotated[
        int, doc("total ids: the unit's alphabet (256 bytes, or the corpus's characters) + merges + special tokens")
    ] = 4096
    special_tokens: Annotated[tuple[str, ...], doc("special tokens, appended after the merges in this order")] = (
        ENDOFTEXT,
    )
    min_frequency: Annotated[int, doc("stop merging when the best pair occurs fewer times")] = 2
    unit: Annotated[
        Literal["byte", "char", "word"],
        doc(
            f"what BPE starts from. byte: {UNIT_DESCRIPTIONS['byte']}. char: {UNIT_DESCRIPTIONS['char']}. word: "
            f"{UNIT_DESCRIPTIONS['word']}"
        ),
    ] = "byte"
    unknown: Annotated[
        Literal["unk", "bytes"],
        doc(
            "char and word units: a character unseen at training becomes <unk> (an id), or its bytes (byte fallback: "
            "+256 ids at most)"
        ),
    ] = "unk"
    lowercase: Annotated[bool, doc("word unit: lowercase the words")] = False
    ties: Annotated[
        Literal["bytes", "first-seen"],
        doc(
            "equal counts: merge the pair whose bytes sort first (bytes), or the pair met first in the corpus, as the "
            "BPE tutorials do (first-seen)"
        ),
    ] = "bytes"
    merges: Annotated[
        int | None, doc("merges to learn; the vocabulary size then follows (alphabet + merges + special tokens)")
    ] = None

    def __post_init__(self):
        if self.unit == "byte" and self.vocab_size < 256 + len(self.special_tokens):
            raise InputError(
                f"vocab_size={self.vocab_size} is too small: need at least 256 + "
                f"{len(self.special_tokens)} special token(s)"
            )
        if self.vocab_size < len(self.special_tokens) + 2:
            raise InputError(
                f"vocab_size={self.vocab_size} is too small: need at least 2 + "
                f"{len(self.special_tokens)} special token(s)"
            )
        if self.vocab_size > MAX_VOCAB_SIZE:  # refused here, before any stage runs, not after counting
            raise InputError(
                f"vocab_size={self.vocab_size} is too large: the largest vocabulary is "
                f"{MAX_VOCAB_SIZE:,} ids (MAX_VOCAB_SIZE)"
            )
        if len(set(self.special_tokens)) != len(self.special_tokens):
            raise InputError(f"duplicate special tokens in {self.special_tokens}")
        if self.min_frequency < 1:
            raise InputError("min_frequency must be at least 1")
        if self.lowercase and self.unit != "word":
            raise InputError(f"lowercase is for the word unit (unit={self.unit!r} keeps case)")
        if self.merges is not None and self.merges < 0:
            raise InputError(f"merges={self.merges}: give 0 or more merges to learn")

    def params(self) -> dict[str, Any]:
        # The unit's fields enter the version id when they differ from byte-level BPE's, so
        # byte-level versions keep the ids they had before units existed.
        params = {**asdict(self), "special_tokens": list(self.special_tokens)}
        if self.unit == "byte":
            del params["unit"], params["unknown"], params["lowercase"]
        elif not self.lowercase:
            del params["lowercase"]
        # Defaults stay out of the id, so versions made before these options keep theirs.
        if self.ties == "bytes":
            del params["ties"]
        if self.merges is None:
            del params["merges"]
        return params


def tokenizer_files(tok: Tokenizer) -> dict[str, bytes]:
    return tokenizer_file_bytes(tok)


def load_tokenizer(store: ArtifactStore, ref: VersionRef) -> Tokenizer:
    return Tokenizer.load(store.local_dir(ref.kind, ref.version))


def pieces_in_corpus_order(
    store: ArtifactStore, counts_meta: dict[str, Any], pieces: list[bytes], counts: Any
) -> dict[bytes, int]:
    """The counts table as a dict in the order its pieces are first met in the corpus (what
    first-seen ties need; the counts file is sorted). Splits the corpus again in Python: for
    the small corpora of a lesson."""
    from pipeline_lib import bpe_reference as ref
    from pipeline_lib.corpus import iter_shard_buffers

    count_of = dict(zip(pieces, counts.tolist()))
    pattern = counts_meta["meta"]["pattern"]
    kind, version = split_key(counts_meta["parents"]["corpus"])
    ordered: dict[bytes, int] = {}
    for info in store.manifest(kind, version)["meta"]["shards"]:  # in shard order
        for batch in iter_shard_buffers(store.local_file(kind, version, info["file"])):
            ends = batch.offsets.tolist()
            for a, b in zip(ends, ends[1:]):
                for piece in ref.split_bytes(bytes(batch.data[a:b]), pattern):
                    if piece not in ordered and piece in count_of:
                        ordered[piece] = count_of[piece]
    return ordered


def _learn(ctx: Context) -> Output:
    counts, config = ctx.inputs["counts"], ctx.config
    cmeta = ctx.store.manifest(counts.kind, counts.version)
    path = os.path.join(ctx.store.local_dir(counts.kind, counts.version), COUNTS_FILE)
    pieces, cnt = counting.read_counts(path)
    table: PieceTable | dict[bytes, int] = PieceTable(pieces, cnt)
    if config.ties == "first-seen":
        table = pieces_in_corpus_order(ctx.store, cmeta, pieces, cnt)
    plan: list[str] = []

    def announce(p: Any) -> None:
        plan.append(p.line())

    tok = Tokenizer.train(
        table,
        config.vocab_size,
        pattern=cmeta["meta"]["pattern"],
        special_tokens=config.special_tokens,
        min_frequency=config.min_frequency,
        progress=ctx.progress,
        unit=config.unit,
        unknown=config.unknown,
        lowercase=config.lowercase,
        ties=config.ties,
        n_merges=config.merges,
        on_plan=announce,
    )
    from pipeline_lib import lab

    compression = lab.training_compression(tok, pieces, cnt)
    assert ctx.staging is not None  # the engine publishes this stage
    files = {name: ctx.staging.put_bytes(name, data) for name, data in tokenizer_files(tok).items()}
    notable = notable_tokens(tok, 10)
    meta = {
        **tok.metadata(),
        "unit_description": UNIT_DESCRIPTIONS[tok.unit],
        "n_merges": len(tok.merges or []),
        "requested_vocab_size": config.vocab_size,
        "plan": plan[0] if plan else "",
        "training_compression": compression,
        "ties": config.ties,
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
