"""`tokenmill`: the command line.

    tokenmill run                       # the whole chain on the bundled corpus, store ./artifacts
    tokenmill run --corpus 's3://bucket/data/*.jsonl.zst' --store s3://bucket/tm --vocab-size 32768
    tokenmill tokenizer train|encode|merges|vocab|decode|inspect|export
    tokenmill encode --tokenizer REF    # encode a corpus with an existing tokenizer
    tokenmill compare | report          # tokenizers side by side; compression vs vocabulary size
    tokenmill lab page | corpora        # the BPE lab as one HTML page; the tutorials' small corpora
    tokenmill lm train|sample
    tokenmill sweep --vocab-sizes 512,1024,4096   # which tokenizer makes the better model, at equal compute
    tokenmill versions | show REF | verify REF | gc
    tokenmill serve                     # run the deployments (schedules) from this process

A REF names a version in the store: ``kind/version``, a unique version-id prefix, or
``latest:KIND``. Commands that run flows use Prefect's API when PREFECT_API_URL is set, else
tokenmill's local Prefect server: started in the background by the first such command (on
127.0.0.1), reused by the next ones, stopped after 15 minutes unused or by `tokenmill server
stop`. With TOKENMILL_WARM=1, a warm runner beside it (flows/warm.py) runs later commands in a
process that has made their imports already. They keep their database (prefect.db), logs and the
runs' task results in $PREFECT_HOME/tokenmill (default ~/.prefect/tokenmill), and nothing else
in $PREFECT_HOME; `tokenmill gc --prefect-home` removes them. TOKENMILL_PREFECT_SERVER=temporary
uses Prefect's per-command server instead.

A failure prints one ``tokenmill: error:`` line naming the file, URL or store and what to
do; the traceback goes to a log file ($TOKENMILL_LOG_DIR, default $PREFECT_HOME/logs) and
to Prefect's run logs (--debug or TOKENMILL_DEBUG=1 prints it too). Exit status: 0 done,
2 bad input, 1 any other failure, 130 interrupted (Ctrl-C), 143 terminated (SIGTERM).
"""

from __future__ import annotations

import argparse
from typing import Any, TypeAlias

from flows.cli_common import DEFAULT_STORE
from flows.cli_options import (
    COMPARE_CONFIGS,
    ENCODE_CONFIGS,
    LM_CONFIGS,
    REPORT_CONFIGS,
    RUN_CONFIGS,
    SAMPLE_CONFIGS,
    SWEEP_CONFIGS,
    TOKENIZER_CONFIGS,
    _add_config_groups,
    _add_debug,
    _add_runner,
    _add_store,
    _report_corpus,
)
from flows.cli_pipeline import (
    cmd_compare,
    cmd_encode,
    cmd_lab_corpora,
    cmd_lab_page,
    cmd_lm_sample,
    cmd_lm_train,
    cmd_report,
    cmd_run,
    cmd_sweep,
)
from flows.cli_store import (
    cmd_export_llmc,
    cmd_export_nanogpt,
    cmd_gc,
    cmd_rm,
    cmd_server,
    cmd_show,
    cmd_verify,
    cmd_versions,
)
from flows.cli_tokenizer import (
    cmd_tokenizer_decode,
    cmd_tokenizer_encode,
    cmd_tokenizer_export,
    cmd_tokenizer_inspect,
    cmd_tokenizer_merges,
    cmd_tokenizer_train,
    cmd_tokenizer_vocab,
)


def _command_path(argv: list[str] | None) -> tuple[str, ...] | None:
    """The command words `argv` starts with, e.g. ``("tokenizer", "train")``; None for all."""
    if argv is None:
        return None
    return tuple(a for a in argv if not a.startswith("-"))[:2]


# The subparsers object `add_subparsers` returns, to which each command group adds its commands.
Subcommands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def _add_configs(
    p: argparse.ArgumentParser,
    path: tuple[str, ...] | None,
    command: tuple[str, ...],
    names: tuple[str, ...],
    **defaults: Any,
) -> None:
    """Add the stage options `names` to `p` when the command line (its command words `path`,
    None for all) names `command`: they import the stages' config classes (numpy, pyarrow...)."""
    if path is None or path[: len(command)] == command:
        _add_config_groups(p, names, **{k: v() for k, v in defaults.items()})


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser; given the command line, it has the stage options only of the command
    that line names: they import the stages' config classes (numpy, pyarrow...)."""
    path = _command_path(argv)
    parser = argparse.ArgumentParser(
        prog="tokenmill",
        description="Raw text -> byte-level BPE tokenizer -> token shards -> GPT, as versioned Prefect flows.",
        epilog=__doc__.split("\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_debug(parser)
    sub = parser.add_subparsers(dest="command", required=True)
    _add_pipeline_commands(sub, path)
    _add_tokenizer_commands(sub, path)
    _add_encode_command(sub, path)
    _add_lm_commands(sub, path)
    _add_store_commands(sub)
    _add_server_command(sub)
    _add_export_commands(sub)
    _add_lab_commands(sub)
    _add_report_commands(sub, path)
    if path is None or not path or path[0] not in sub.choices:
        add_plugin_commands(sub, path)
    return parser


def _add_pipeline_commands(sub: Subcommands, path: tuple[str, ...] | None) -> None:
    """run and sweep: the whole chain, and tokenizers compared through the models trained on them."""
    p = sub.add_parser("run", help="run the whole pipeline (default: bundled tiny Shakespeare into ./artifacts)")
    _add_store(p)
    _add_configs(p, path, ("run",), RUN_CONFIGS)
    _add_runner(p)
    p.add_argument("--no-lm", action="store_true", help="stop after the token shards")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser(
        "sweep",
        help="which tokenizer makes the better model: tokenizers at several vocabulary sizes, "
        "the same GPT on each at equal compute",
    )
    _add_store(p)
    _add_configs(p, path, ("sweep",), SWEEP_CONFIGS)
    _add_runner(p)
    p.set_defaults(func=cmd_sweep)


def _add_tokenizer_commands(sub: Subcommands, path: tuple[str, ...] | None) -> None:
    """tokenizer train|encode|merges|vocab|decode|inspect|export."""
    tp = sub.add_parser("tokenizer", help="train, use and export tokenizers").add_subparsers(dest="sub", required=True)
    p = tp.add_parser("train", help="count and learn merges from a corpus")
    _add_store(p)
    _add_configs(p, path, ("tokenizer", "train"), TOKENIZER_CONFIGS)
    _add_runner(p)
    p.add_argument("--out", help="also save the tokenizer files into this directory")
    p.add_argument(
        "--log-merges",
        type=int,
        default=0,
        metavar="N",
        help="log every N-th merge: the pair, the new token, its count when merged (default: none)",
    )
    p.add_argument(
        "--trace",
        action="store_true",
        help="print the training pieces (the 20 most frequent) after each merge; kept as a run artifact too",
    )
    p.set_defaults(func=cmd_tokenizer_train)
    p = tp.add_parser("encode", help="encode text with a tokenizer")
    _add_store(p)
    p.add_argument(
        "--tokenizer",
        default="latest:tokenizer",
        help="REF in the store, a saved tokenizer directory, or a HF tokenizer.json of byte-level BPE, or a "
        "production encoding: gpt2, r50k_base, p50k_base, cl100k_base, o200k_base",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--text")
    src.add_argument("--input", help="text file to encode")
    p.add_argument("--output", help="write ids as .npy instead of printing")
    p.add_argument(
        "--allow-special",
        action="append",
        metavar="TOKEN",
        help="special token allowed in the text (repeatable; 'all': every one)",
    )
    p.add_argument(
        "--special-as-text",
        action="store_true",
        help="encode special-token text the --allow-special flags do not name as ordinary text (the library's "
        "encode_ordinary), instead of refusing it",
    )
    p.add_argument(
        "--show",
        action="store_true",
        help="draw each token's text above its id (whitespace visible, coloured in a terminal) and the compression",
    )
    p.add_argument(
        "--trace",
        action="store_true",
        help="per piece: its starting parts, then each merge applied (lowest rank first) with its rank",
    )
    p.set_defaults(func=cmd_tokenizer_encode)
    tokenizer_help = "REF in the store, a saved tokenizer directory, or a production encoding (gpt2, cl100k_base, ...)"
    p = tp.add_parser("merges", help="every merge as text under a header: pair, new token, id, count when merged")
    _add_store(p)
    p.add_argument("--tokenizer", default="latest:tokenizer", help=tokenizer_help)
    p.set_defaults(func=cmd_tokenizer_merges)
    p = tp.add_parser("vocab", help="id <-> token: every token by id, or those containing --search, or one --id")
    _add_store(p)
    p.add_argument("--tokenizer", default="latest:tokenizer", help=tokenizer_help)
    p.add_argument("--search", help="only the tokens whose text contains this (a space matches ␣)")
    p.add_argument("--id", type=int, help="only this id")
    p.set_defaults(func=cmd_tokenizer_vocab)
    p = tp.add_parser("decode", help="decode token ids (a .npy or .json file, text, or stdin) back to text")
    _add_store(p)
    p.add_argument(
        "--tokenizer",
        default="latest:tokenizer",
        help="REF in the store, a saved tokenizer directory or a HF tokenizer.json of byte-level BPE",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--ids", help="ids separated by spaces or commas, as 'tokenizer encode' prints them")
    src.add_argument(
        "--input",
        help="a .npy array of ids ('tokenizer encode --output'), a .json list, or a text file of ids ('-': stdin)",
    )
    p.add_argument("--output", help="write the decoded bytes to this file instead of printing the text")
    p.set_defaults(func=cmd_tokenizer_decode)
    p = tp.add_parser(
        "inspect", help="shortest, longest, first and last tokens, tokens per length, tokens never used in training"
    )
    _add_store(p)
    p.add_argument(
        "--tokenizer",
        default="latest:tokenizer",
        help="REF in the store (its training counts are known) or a saved tokenizer directory",
    )
    p.add_argument("--top", type=int, default=10, help="tokens shown in each list (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.set_defaults(func=cmd_tokenizer_inspect)
    p = tp.add_parser(
        "export",
        help="export to HF tokenizer.json, a transformers directory, GPT-2's vocab.json + "
        "merges.txt or a .tiktoken ranks file",
    )
    _add_store(p)
    p.add_argument(
        "--tokenizer",
        default="latest:tokenizer",
        help="REF in the store, a saved tokenizer directory or a HF tokenizer.json of byte-level BPE",
    )
    p.add_argument(
        "--format",
        choices=("hf", "tiktoken", "transformers", "gpt2"),
        required=True,
        help="transformers and gpt2 write into the directory --out",
    )
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_tokenizer_export)


def _add_encode_command(sub: Subcommands, path: tuple[str, ...] | None) -> None:
    """encode: a corpus into token shards with an existing tokenizer."""
    p = sub.add_parser("encode", help="encode a corpus into token shards with an existing tokenizer")
    _add_store(p)
    _add_configs(p, path, ("encode",), ENCODE_CONFIGS)
    _add_runner(p)
    p.add_argument("--tokenizer", default="latest:tokenizer", help="tokenizer REF (default: %(default)s)")
    p.set_defaults(func=cmd_encode)


def _add_lm_commands(sub: Subcommands, path: tuple[str, ...] | None) -> None:
    """lm train|sample."""
    lp = sub.add_parser("lm", help="train and sample the language model").add_subparsers(dest="sub", required=True)
    p = lp.add_parser("train", help="train a GPT on a tokens version")
    _add_store(p)
    _add_configs(p, path, ("lm", "train"), LM_CONFIGS)
    p.add_argument("--tokens", default="latest:tokens", help="tokens REF (default: %(default)s)")
    p.set_defaults(func=cmd_lm_train)
    p = lp.add_parser("sample", help="generate text from a trained model")
    _add_store(p)
    p.add_argument("--model", default="latest:model", help="model REF (default: %(default)s)")
    p.add_argument(
        "--device",
        default="auto",
        help="auto (CUDA, else MPS, else CPU), cpu, cuda, cuda:N or mps (default: %(default)s)",
    )
    _add_configs(p, path, ("lm", "sample"), SAMPLE_CONFIGS)
    p.set_defaults(func=cmd_lm_sample)


def _add_store_commands(sub: Subcommands) -> None:
    """versions, show, verify, rm, gc: what the store holds."""
    p = sub.add_parser("versions", help="list the versions in a store")
    _add_store(p)
    p.add_argument("--kind", help="only this kind (raw, corpus, counts, tokenizer, tokens, model, report, sweep)")
    p.set_defaults(func=cmd_versions)
    for name, func, helptext in (
        ("show", cmd_show, "print a version's manifest"),
        ("verify", cmd_verify, "re-hash a version's files against its manifest"),
    ):
        p = sub.add_parser(name, help=helptext)
        _add_store(p)
        p.add_argument(
            "ref", nargs="?" if name == "verify" else None, help="kind/version, a version prefix, or latest:KIND"
        )
        if name == "verify":
            p.add_argument(
                "--all",
                action="store_true",
                help="verify every published version and list what the store did not write; exit 1 on any fault",
            )
        p.set_defaults(func=func)
    p = sub.add_parser(
        "rm", help="delete a published version (refused while others derive from it, unless --with-dependents)"
    )
    _add_store(p)
    p.add_argument("ref", help="kind/version, a version prefix, or latest:KIND")
    p.add_argument(
        "--with-dependents", action="store_true", help="also remove every version derived from it (listed first)"
    )
    p.add_argument(
        "--with-unused-parents",
        action="store_true",
        help="also remove the versions it derives from that no remaining version uses (e.g. the raw copy of a corpus)",
    )
    p.add_argument("--dry-run", action="store_true", help="print what would be removed, remove nothing")
    p.set_defaults(func=cmd_rm)
    p = sub.add_parser(
        "gc",
        help="remove the unpublished leftovers the store wrote (staging areas, work dirs, stale "
        "claims); list and keep everything else",
    )
    _add_store(p)
    p.add_argument("--dry-run", action="store_true")
    p.add_argument(
        "--min-age",
        type=float,
        default=3600,
        help="spare leftovers younger than this many seconds: a running flow's staging area (default: %(default)s)",
    )
    p.add_argument(
        "--prefect-home",
        action="store_true",
        help="instead of the store: remove what tokenmill's local Prefect server left in $PREFECT_HOME/tokenmill (its "
        "database, log, task results older than --min-age; it is stopped first unless a tokenmill command is using it) "
        "and tokenmill's failure logs ($PREFECT_HOME/logs/tokenmill-*.log) older than --min-age; nothing else",
    )
    p.set_defaults(func=cmd_gc)


def _add_server_command(sub: Subcommands) -> None:
    """server status|start|stop: tokenmill's local Prefect server."""
    p = sub.add_parser(
        "server", help="tokenmill's local Prefect server, used when PREFECT_API_URL is unset: status, start or stop it"
    )
    p.add_argument("action", choices=("status", "start", "stop"))
    _add_debug(p, default=argparse.SUPPRESS)
    p.set_defaults(func=cmd_server)


def _add_export_commands(sub: Subcommands) -> None:
    """export-nanogpt, export-llmc: a tokens version as other trainers read it."""
    p = sub.add_parser("export-nanogpt", help="write nanoGPT's train.bin / val.bin from a tokens version")
    _add_store(p)
    p.add_argument("--tokens", default="latest:tokens")
    p.add_argument("--out", required=True)
    p.add_argument(
        "--val-fraction",
        type=float,
        help="checked against the split the tokens version records (decided at encoding by its --val-fraction); "
        "default: that split",
    )
    p.set_defaults(func=cmd_export_nanogpt)
    p = sub.add_parser("export-llmc", help="write llm.c's <prefix>_train.bin / <prefix>_val.bin from a tokens version")
    _add_store(p)
    p.add_argument("--tokens", default="latest:tokens")
    p.add_argument("--out", required=True)
    p.add_argument(
        "--val-fraction",
        type=float,
        help="checked against the split the tokens version records (decided at encoding by its --val-fraction); "
        "default: that split",
    )
    p.add_argument("--prefix", default="tokens")
    p.add_argument(
        "--separator-placement",
        choices=("append", "prepend"),
        help="separator after or before each document (default: as encoded; llm.c's scripts prepend)",
    )
    p.set_defaults(func=cmd_export_llmc)


def _add_lab_commands(sub: Subcommands) -> None:
    """lab page|corpora: the tokenizer lab."""
    lab_parsers = sub.add_parser("lab", help="the tokenizer lab: learn BPE in a browser").add_subparsers(
        dest="sub", required=True
    )
    p = lab_parsers.add_parser(
        "page",
        help="one self-contained HTML page: coloured tokens, a merge slider, compression vs vocabulary, compare table",
    )
    _add_store(p)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", help="the text the page shows")
    src.add_argument("--input", help="text file the page shows")
    p.add_argument(
        "--tokenizer",
        help="REF in the store, a saved directory or a production encoding name (default: train one on --corpus)",
    )
    p.add_argument(
        "--corpus",
        help="with no --tokenizer: text file to train byte-level BPE on (default: the bundled tiny Shakespeare)",
    )
    p.add_argument(
        "--merges", type=int, default=500, help="with no --tokenizer: merges to learn (default: %(default)s)"
    )
    p.add_argument(
        "--ties",
        choices=("bytes", "first-seen"),
        default="bytes",
        help="with no --tokenizer: the tie rule (default: %(default)s)",
    )
    p.add_argument("--out", default="lab.html", help="the HTML file to write (default: %(default)s)")
    p.add_argument(
        "--flow",
        action="store_true",
        help="also attach the page to a Prefect run: a link artifact and the compare table",
    )
    p.set_defaults(func=cmd_lab_page)
    p = lab_parsers.add_parser(
        "corpora", help="the small corpora shipped for the tutorials: list them, or copy them into a directory"
    )
    p.add_argument("--copy", metavar="DIR", help="copy every one into DIR (as NAME.txt)")
    p.set_defaults(func=cmd_lab_corpora)


def _add_report_commands(sub: Subcommands, path: tuple[str, ...] | None) -> None:
    """report and compare: tokenizers measured on the same held-out text."""
    p = sub.add_parser("report", help="compression vs vocabulary size, fertility per language, notable tokens")
    _add_store(p)
    p.add_argument(
        "--tokenizer",
        action="append",
        metavar="REF",
        help="a tokenizer you trained (REF, directory or encoding name), measured on the held-out text, repeatable",
    )
    _add_configs(p, path, ("report",), REPORT_CONFIGS, corpus=_report_corpus)
    p.set_defaults(func=cmd_report)
    p = sub.add_parser(
        "compare",
        help="character level, word level, BPE trained at several sizes (ours, HF's) and GPT-2 / cl100k / o200k, "
        "measured on the same held-out text",
    )
    p.add_argument(
        "--corpus",
        metavar="URL",
        help="text file (path or fsspec URL) to train on and hold out from (default: the bundled tiny Shakespeare)",
    )
    p.add_argument(
        "--multilingual",
        metavar="URL",
        help="UDHR sample for fertility per language (default: the bundled one; 'none': leave it out)",
    )
    p.add_argument(
        "--encoding-file",
        action="append",
        metavar="NAME=PATH",
        help="ranks file of a production encoding, e.g. cl100k_base=./cl100k_base.tiktoken",
    )
    p.add_argument(
        "--out",
        default="./compare",
        help="directory for compare.md, compare.json and compare.png (default: %(default)s)",
    )
    p.add_argument(
        "--storage-option", action="append", metavar="KEY=VALUE", help="fsspec option for the corpus URL (repeatable)"
    )
    p.add_argument(
        "--flow",
        action="store_true",
        help="run as a Prefect flow: the table and the plot also become the run's artifacts",
    )
    p.add_argument(
        "--tokenizer",
        action="append",
        metavar="REF",
        help="a tokenizer you trained (REF in --store, or a saved directory) measured beside the others; repeatable",
    )
    p.add_argument(
        "--store", default=DEFAULT_STORE, help="artifact store holding the --tokenizer REFs (default: %(default)s)"
    )
    p.add_argument(
        "--text",
        help="with --show: this text as tokens under character level, word level, your "
        "tokenizers and gpt2 / cl100k / o200k",
    )
    p.add_argument(
        "--show",
        action="store_true",
        help="draw --text under each tokenizer (coloured in a terminal) instead of measuring a corpus",
    )
    _add_configs(p, path, ("compare",), COMPARE_CONFIGS)
    _add_debug(p, default=argparse.SUPPRESS)
    p.set_defaults(func=cmd_compare)


# Commands of the layers above the flows (the deployments' `serve` and `deploy`): each
# registers a function that adds its commands to the parser's subcommands, as an entry point
# of this group in pyproject.toml. Loaded only for a command that is not the flows' own.
COMMANDS_GROUP = "tokenmill.commands"


def add_plugin_commands(sub: Any, path: tuple[str, ...] | None) -> None:
    """Add the commands registered under `COMMANDS_GROUP` to the subparsers `sub`; each gets
    the command words (`path`, None for all) to add only the options that command needs."""
    from importlib.metadata import entry_points

    for entry in sorted(entry_points(group=COMMANDS_GROUP), key=lambda e: e.name):
        entry.load()(sub, path)
