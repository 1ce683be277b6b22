"""The `tokenmill` commands that run the pipeline's flows and measure tokenizers: run, sweep,
encode, lm train / sample, report, compare, lab page / corpora."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from flows.cli_common import (
    _flow_api,
    _load_tokenizer,
    _print_summary,
    _ProgressBars,
    _read_text,
    _resolve,
    _runner,
    _storage_options,
    _store,
)
from flows.cli_options import (
    COMPARE_CONFIGS,
    DOCUMENTS,
    ENCODE_CONFIGS,
    LM_CONFIGS,
    REPORT_CONFIGS,
    RUN_CONFIGS,
    SAMPLE_CONFIGS,
    SWEEP_CONFIGS,
    configs_from_args,
)
from pipeline_lib.errors import InputError


def _check_separator(configs: dict[str, Any]) -> None:
    """The encoding's separator must be one of the special tokens the tokenizer will have:
    checked before any stage runs (the encoding stage would refuse it after training)."""
    from pipeline_lib.errors import ConfigError

    separator, specials = configs["encode"].separator, configs["tokenizer"].special_tokens
    if separator is not None and separator not in specials:
        raise ConfigError(
            f"--separator {separator}: not one of the tokenizer's special tokens "
            f"({', '.join(specials) or 'none: --no-special-token'});"
            f" add it with --special-token '{separator}', or give --separator none"
        )


def cmd_run(args) -> int:
    configs = configs_from_args(args, RUN_CONFIGS)  # every parameter checked before any work
    _check_separator(configs)
    with _flow_api():
        from flows.pipeline import tokenmill_pipeline

        flow = tokenmill_pipeline.with_options(task_runner=_runner(args))
        with _ProgressBars():
            summary = flow(
                **configs,
                store=args.store,
                train_model=not args.no_lm,
                storage_options=_storage_options(args.storage_option) or None,
            )
    _print_summary(summary)
    return 0


def cmd_sweep(args) -> int:
    configs = configs_from_args(args, SWEEP_CONFIGS)  # every parameter checked before any work
    with _flow_api():
        from flows.sweep import sweep_flow

        flow = sweep_flow.with_options(task_runner=_runner(args))
        with _ProgressBars():
            out = flow(**configs, store=args.store, storage_options=_storage_options(args.storage_option) or None)
    from pipeline_lib.sweep import summary_markdown

    ref = out["sweep"]
    print(summary_markdown(out["result"]))
    print(f"table: {_store(args).uri(ref['kind'], ref['version'], 'sweep.md')}")
    print(f"plot:  {_store(args).uri(ref['kind'], ref['version'], 'sweep.png')}")
    return 0


def cmd_encode(args) -> int:
    configs = configs_from_args(args, ENCODE_CONFIGS)
    store = _store(args)
    so = _storage_options(args.storage_option) or None
    k, v = _resolve(store, args.tokenizer, "tokenizer")
    with _flow_api():
        from flows.pipeline import encode_corpus_flow

        flow = encode_corpus_flow.with_options(task_runner=_runner(args))
        tokens = flow(
            configs["corpus"],
            store.ref(k, v),
            store=args.store,
            encode=configs["encode"],
            storage_options=so,
            documents=configs[DOCUMENTS],
        )
    print(f"tokens {tokens.key} -> {tokens.uri}")
    return 0


def cmd_lm_train(args) -> int:
    configs = configs_from_args(args, LM_CONFIGS)
    store = _store(args)
    tk, tv = _resolve(store, args.tokens, "tokens")
    tokens = store.ref(tk, tv)
    with _flow_api():
        from flows.pipeline import lm_flow

        model = lm_flow(
            tokens,
            store.parent(tokens, "tokenizer"),
            store=args.store,
            **configs,
            storage_options=_storage_options(args.storage_option) or None,
        )
    m = store.manifest(model.kind, model.version)["meta"]
    print(f"model {model.key} -> {model.uri}")
    print(json.dumps(m["metrics"], indent=2, default=str))
    return 0


def cmd_lm_sample(args) -> int:
    from pipeline_lib.model_stage import sample_text

    store = _store(args)
    _, mv = _resolve(store, args.model, "model")
    print(sample_text(store, mv, configs_from_args(args, SAMPLE_CONFIGS)["sample"], device=args.device))
    return 0


def cmd_report(args) -> int:
    configs = configs_from_args(args, REPORT_CONFIGS)
    with _flow_api():
        from flows.pipeline import report_flow

        ref = report_flow(**configs, store=args.store, storage_options=_storage_options(args.storage_option) or None)
    store = _store(args)
    print(store.read_bytes(ref.kind, ref.version, "report.md").decode())
    if args.tokenizer:
        print(_yours_in_report(args, store, ref))
    print(f"plot: {store.uri(ref.kind, ref.version, 'compression.png')}")
    return 0


def _yours_in_report(args, store, ref) -> str:
    """The report's "your tokenizers" section: each --tokenizer on the report's held-out
    shard (the corpus's last) and on the UDHR sample."""
    from pipeline_lib import lab
    from pipeline_lib.corpus import iter_shard_batches
    from pipeline_lib.report import MULTILINGUAL, udhr_sections

    named = [(r, _load_tokenizer(argparse.Namespace(**{**vars(args), "tokenizer": r}))) for r in args.tokenizer]
    corpus = store.parent(ref, "corpus")
    last = store.manifest(corpus.kind, corpus.version)["meta"]["shards"][-1]["file"]
    heldout = "\n\n".join(
        d.decode("utf-8")
        for docs in iter_shard_batches(store.local_file(corpus.kind, corpus.version, last))
        for d in docs
    )
    with open(MULTILINGUAL, encoding="utf-8") as f:
        sections = udhr_sections(f.read())
    return lab.yours_markdown(named, heldout, sections)


def cmd_lab_corpora(args) -> int:
    import shutil

    from pipeline_lib import lab

    for name, (file, what) in lab.LAB_CORPORA.items():
        path = lab.lab_corpus(name)
        if args.copy:
            os.makedirs(args.copy, exist_ok=True)
            path = shutil.copy(path, os.path.join(args.copy, file))
        print(f"{file:<18} {os.path.getsize(path):>7,} bytes  {what}  -> {path}")
    return 0


def cmd_lab_page(args) -> int:
    from pipeline_lib import lab_page
    from pipeline_lib.tokenizer import get_encoding

    text = args.text if args.text is not None else _read_text(args.input, "--input")
    if args.tokenizer:
        tok, name = _load_tokenizer(args), args.tokenizer
    else:
        from pipeline_lib.corpus import DEFAULT_CORPUS

        if args.merges < 1:
            raise InputError(f"--merges {args.merges}: give at least 1 merge to learn")
        corpus = (
            _read_text(args.corpus, "--corpus")
            if args.corpus
            else open(DEFAULT_CORPUS, encoding="utf-8").read()[:200_000]
        )
        tok = lab_page.train_for_page(corpus, args.merges, args.ties)
        name = f"byte-level BPE, {len(tok.merges or [])} merges on {args.corpus or 'tiny Shakespeare'}"
    production = {n: get_encoding(n) for n in ("gpt2", "cl100k_base", "o200k_base")}
    rows = lab_page.compare_rows(text, [(name, tok), *production.items()])
    page = lab_page.build_page(text, tok, name, production, rows)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(page)
    print(f"lab page -> {args.out} ({len(page.encode()):,} bytes; open it in a browser, no server needed)")
    if args.flow:  # a Prefect run whose artifacts link the page and hold its compare table
        with _flow_api():
            from flows.lab import lab_page_flow

            table = [{k: r[k] for k in ("name", "tokens", "chars_per_token")} for r in rows]
            print(f"attached to a Prefect run: {lab_page_flow(args.out, f'tokenmill lab: {name}', table)}")
    return 0


def cmd_compare(args) -> int:
    from pipeline_lib import lab
    from pipeline_lib.corpus import DEFAULT_CORPUS
    from pipeline_lib.fsio import read_bytes
    from pipeline_lib.report import MULTILINGUAL

    config = configs_from_args(args, COMPARE_CONFIGS)["compare"]
    yours = {
        ref: _load_tokenizer(argparse.Namespace(**{**vars(args), "tokenizer": ref})) for ref in args.tokenizer or []
    }
    if args.show or args.text is not None:
        if args.text is None or not args.show:
            raise InputError("compare --show draws one text: give both --show and --text '...'")
        from pipeline_lib.tokenizer import get_encoding

        named = [*yours.items(), *((name, get_encoding(name)) for name in ("gpt2", "cl100k_base", "o200k_base"))]
        colour = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
        import shutil

        print(
            lab.show_text_rows(
                args.text, lab.text_rows(args.text, named), width=shutil.get_terminal_size().columns, colour=colour
            )
        )
        return 0
    files: dict[str, str] = {}
    for pair in args.encoding_file or []:
        name, sep, path = pair.partition("=")
        if not sep or not path:
            raise InputError(f"--encoding-file {pair!r}: expected NAME=PATH, e.g. cl100k_base=./cl100k_base.tiktoken")
        files[name] = path
    options = _storage_options(args.storage_option)
    source = args.corpus or DEFAULT_CORPUS
    if args.flow:  # the same measuring, as a Prefect flow run with its artifacts
        if yours:
            raise InputError(
                "--tokenizer is measured by the command itself: leave out --flow to compare your tokenizers"
            )
        with _flow_api():
            from flows.lab import compare_flow

            result = compare_flow(source, config, args.multilingual, files, None, options or None)
    else:

        def read(url: str, flag: str) -> str:
            try:
                return read_bytes(url, **options).decode("utf-8", "replace")
            except InputError as e:
                raise InputError(f"{flag} {e}") from e

        text = read(source, "--corpus")
        multilingual = (
            read(args.multilingual or MULTILINGUAL, "--multilingual")
            if (args.multilingual or "").lower() != "none"
            else None
        )
        result = lab.compare(
            text,
            config,
            source,
            multilingual,
            files,
            progress=lambda message: print(message, file=sys.stderr, flush=True),
            tokenizers=yours,
        )
    print(lab.compare_text(result))
    paths = lab.write_comparison(result, args.out)
    print(f"table: {paths['md']}, figures: {paths['json']}, plot: {paths['png']}")
    return 0
