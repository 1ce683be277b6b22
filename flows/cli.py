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
``latest:KIND``. Commands that run flows use Prefect's API when PREFECT_API_URL is set,
else tokenmill's local Prefect server: started in the background by the first such command
(on 127.0.0.1), reused by the next ones, stopped after 15 minutes unused or by
`tokenmill server stop`. With TOKENMILL_WARM=1, a warm runner beside it (flows/warm.py) runs
later commands in a process that has made their imports already. They keep their
database (prefect.db), logs and the runs' task results in $PREFECT_HOME/tokenmill (default
~/.prefect/tokenmill), and nothing else in $PREFECT_HOME; `tokenmill gc --prefect-home` removes them. TOKENMILL_PREFECT_SERVER=temporary uses Prefect's per-command server instead.

A failure prints one ``tokenmill: error:`` line naming the file, URL or store and what to
do; the traceback goes to a log file ($TOKENMILL_LOG_DIR, default $PREFECT_HOME/logs) and
to Prefect's run logs (--debug or TOKENMILL_DEBUG=1 prints it too). Exit status: 0 done,
2 bad input, 1 any other failure, 130 interrupted (Ctrl-C), 143 terminated (SIGTERM).
"""

from __future__ import annotations

if __name__ == "__main__":  # `python -m flows.cli`: the warm runner first, before the imports below
    import sys as _sys

    from flows.warm import run_warm as _run_warm

    _status = _run_warm(_sys.argv[1:])
    if _status is not None:
        _sys.exit(_status)

import argparse
import contextlib
import datetime as dt
import json
import os
import re
import sys
from typing import Any

from flows.failures import ENV_DEBUG, ENV_LOG_DIR, EXIT_BROKEN_PIPE, EXIT_FAILURE, PREFECT_CONSOLE_CLASS, _error_line_printed, _log_dir, report_failure
from flows.home import prefect_home
from flows.signals import _command, _sigterm_raises
from pipeline_lib.errors import InputError

DEFAULT_STORE = "./artifacts"


# --------------------------------------------------------------------------- helpers
def _storage_options(pairs: list[str] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs or []:
        if "=" not in pair:
            raise InputError(f"--storage-option {pair!r}: expected KEY=VALUE")
        k, v = pair.split("=", 1)
        try:
            out[k] = json.loads(v)
        except json.JSONDecodeError:
            out[k] = v
    if "endpoint_url" in out:  # s3fs takes it inside client_kwargs
        out.setdefault("client_kwargs", {})["endpoint_url"] = out.pop("endpoint_url")
    from pipeline_lib.storage_secrets import redact, remember

    # Secrets go through the environment, never into flow parameters (the API keeps those).
    shown, secrets = redact(out)
    remember(secrets)
    return shown


def _store(args):
    from pipeline_lib.store import ArtifactStore

    return ArtifactStore(args.store, **_storage_options(args.storage_option))


def _resolve(store, ref: str, kind: str | None = None) -> tuple[str, str]:
    if ref.startswith("latest"):
        k = ref.split(":", 1)[1] if ":" in ref else kind
        if not k:
            raise InputError("use latest:KIND, e.g. latest:tokenizer")
        m = store.latest(k)
        if m is None:
            raise InputError(f"no {k} version in {store.url}")
        return k, m["version"]
    k, v = store.find(ref)
    if kind and k != kind:
        raise InputError(f"{ref} is a {k} version, not {kind}")
    if not store.exists(k, v):
        raise InputError(f"{k}/{v} is not a published version in {store.url}")
    return k, v


def _load_tokenizer(args):
    from pipeline_lib.tokenizer import Tokenizer, get_encoding
    from pipeline_lib.tokenizer.registry import ENCODINGS

    if args.tokenizer.endswith(".json") and os.path.isfile(args.tokenizer):  # a HF tokenizer.json
        return Tokenizer.from_hf_json(args.tokenizer)
    if _is_tokenizer_dir(args.tokenizer):
        return Tokenizer.load(args.tokenizer)
    if args.tokenizer in ENCODINGS:  # a production encoding by name (gpt2, cl100k_base, ...)
        return get_encoding(args.tokenizer)
    store = _store(args)
    k, v = _resolve(store, args.tokenizer, "tokenizer")
    return Tokenizer.load(store.local_dir(k, v))


def _is_tokenizer_dir(ref: str) -> bool:
    """Whether --tokenizer names a saved tokenizer directory (else a REF in the store)."""
    from pipeline_lib.tokenizer import META_FILE

    if os.path.isdir(ref) and os.path.exists(os.path.join(ref, META_FILE)):
        return True
    if ref.startswith(("/", "./", "../", "~")) or os.path.isfile(ref):  # a path, never a REF
        raise InputError(f"--tokenizer {ref}: not a saved tokenizer directory (no {META_FILE} there); give one, or a REF in the store (latest:tokenizer)")
    return False


def _flow_api():
    """The Prefect API for the flows a command runs (flows.prefect_api)."""
    from flows.prefect_api import flow_api

    return flow_api()


def _runner(args):
    from flows.runners import make_task_runner

    return make_task_runner(args.runner, args.workers, args.dask_address)


def _print_summary(summary: dict[str, Any]) -> None:
    print("\n== tokenmill: artifacts ==")
    for k, v in summary["artifacts"].items():
        print(f"  {k:<11} {v}")
    print("== headline figures ==")
    notes = {"bytes_per_token": "(byte level: 1.0)", "chars_per_token": "(character level: 1.0)", "val_bpb": "(bits per byte)"}
    for k, v in summary["figures"].items():
        shown = f"{v:.4f}" if isinstance(v, float) else v
        print(f"  {k:<16} {shown} {notes.get(k, '')}".rstrip())
    if summary.get("sample"):
        print("== sample ==")
        print(summary["sample"])


# --------------------------------------------------------------------------- commands
class _ProgressBars:
    """Rich progress bars fed by the tasks running in this process."""

    def __init__(self):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.bars = Progress(TextColumn("{task.description:<22}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), transient=False)
        self.ids: dict[str, int] = {}

    def __call__(self, name: str, *, done=None, advance=0, total=None) -> None:
        if name not in self.ids:
            self.ids[name] = self.bars.add_task(name, total=total)
        self.bars.update(self.ids[name], completed=done, advance=advance or None, total=total)

    def __enter__(self):
        from tasks.common import add_progress_listener

        add_progress_listener(self)
        self.bars.start()
        return self

    def __exit__(self, *exc):
        self.bars.stop()


def _check_separator(configs: dict[str, Any]) -> None:
    """The encoding's separator must be one of the special tokens the tokenizer will have:
    checked before any stage runs (the encoding stage would refuse it after training)."""
    from pipeline_lib.errors import ConfigError

    separator, specials = configs["encode"].separator, configs["tokenizer"].special_tokens
    if separator is not None and separator not in specials:
        raise ConfigError(
            f"--separator {separator}: not one of the tokenizer's special tokens ({', '.join(specials) or 'none: --no-special-token'});"
            f" add it with --special-token '{separator}', or give --separator none"
        )


def cmd_run(args) -> int:
    configs = configs_from_args(args, RUN_CONFIGS)  # every parameter checked before any work
    _check_separator(configs)
    with _flow_api():
        from flows.pipeline import tokenmill_pipeline

        flow = tokenmill_pipeline.with_options(task_runner=_runner(args))
        with _ProgressBars():
            summary = flow(**configs, store=args.store, train_model=not args.no_lm, storage_options=_storage_options(args.storage_option) or None)
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


def cmd_tokenizer_train(args) -> int:
    configs = configs_from_args(args, TOKENIZER_CONFIGS)
    if args.log_merges < 0:
        raise InputError(f"--log-merges {args.log_merges}: give a step of at least 1 (0: no merge log)")
    if args.out:
        _check_out_outside_store(_store(args), args.out)
    so = _storage_options(args.storage_option) or None
    with _flow_api():
        from flows.pipeline import tokenizer_train_flow

        tok = tokenizer_train_flow.with_options(task_runner=_runner(args))(
            **configs, store=args.store, storage_options=so, log_merges=args.log_merges, trace=args.trace
        )
    print(f"tokenizer {tok.key} -> {tok.uri}")
    if args.out:
        from pipeline_lib.tokenizer import Tokenizer

        store = _store(args)
        Tokenizer.load(store.local_dir(tok.kind, tok.version)).save(args.out)
        print(f"saved to {args.out}")
    return 0


def cmd_tokenizer_encode(args) -> int:
    from pipeline_lib import lab

    tok = _load_tokenizer(args)
    allow = args.allow_special or []
    if args.input is not None and not args.special_as_text:
        _refuse_special_in_file(tok, args.input, lab.check_special_tokens(tok, "", allow, f"--input {args.input}"))
    if args.input is not None and args.output and not args.show and not args.trace:
        # streamed: the file is read in blocks and the ids written as they come
        allowed = lab.check_special_tokens(tok, "", allow, f"--input {args.input}")
        output = args.output if args.output.endswith(".npy") else args.output + ".npy"  # as np.save names it
        try:
            n = tok.encode_file_to_npy(args.input, output, allowed_special=allowed)
        except IsADirectoryError as e:
            flag = f"--input {args.input}" if e.filename == args.input else f"--output {output}"
            raise InputError(f"{flag}: is a directory, not a file") from None
        except FileNotFoundError as e:
            flag = f"--input {args.input}: no such file" if e.filename == args.input else f"--output {output}: no such directory"
            raise InputError(flag) from None
        n_bytes, n_chars = _utf8_extent(args.input)
        per_token = f": {n_chars / n:.2f} chars/token, {n_bytes / n:.2f} bytes/token" if n else ""
        print(f"{n} tokens -> {output} ({n_chars:,} characters, {n_bytes:,} bytes{per_token})")
        return 0
    text = args.text if args.text is not None else _read_text(args.input, "--input")
    if args.special_as_text:  # tiktoken's encode(text, allowed_special=..., disallowed_special=())
        allowed = lab.check_special_tokens(tok, "", allow, "--text")
        ids = tok.encode_to_numpy(text, allowed_special=allowed, disallowed_special=())
    else:
        allowed = lab.check_special_tokens(tok, text, allow, "--text" if args.text is not None else f"--input {args.input}")
        ids = tok.encode_to_numpy(text, allowed_special=allowed)
    if args.trace:
        print(lab.encode_trace_text(lab.encode_trace(tok, text)))
    if args.show:
        import shutil

        colour = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
        print(lab.show_tokens(tok, text, ids.tolist(), width=shutil.get_terminal_size().columns, colour=colour))
    if args.output:
        import numpy as np

        np.save(args.output, ids, allow_pickle=False)
        ratio = ""
        if args.input is not None:
            c = lab.compression(text, len(ids))
            ratio = f" ({c['chars']:,} characters, {c['bytes']:,} bytes: {c['chars_per_token']:.2f} chars/token, {c['bytes_per_token']:.2f} bytes/token)"
        print(f"{len(ids)} tokens -> {args.output}{ratio}")
    elif args.input is not None and not args.show:
        print(" ".join(map(str, ids.tolist())))
        c = lab.compression(text, len(ids))
        print(
            f"{c['tokens']:,} tokens for {c['chars']:,} characters ({c['bytes']:,} bytes): {c['chars_per_token']:.2f} chars/token, {c['bytes_per_token']:.2f} bytes/token"
        )
    elif not args.show and not args.trace:
        print(" ".join(map(str, ids.tolist())))
    return 0


def _utf8_extent(path: str, block: int = 16 << 20) -> tuple[int, int]:
    """(bytes, characters) of a UTF-8 file, read a block at a time: every byte that does not
    continue a character (10xxxxxx) starts one."""
    import numpy as np

    n_bytes = n_chars = 0
    with open(path, "rb") as f:
        while chunk := f.read(block):
            data = np.frombuffer(chunk, dtype=np.uint8)
            n_bytes += len(data)
            n_chars += len(data) - int(np.count_nonzero((data & 0xC0) == 0x80))
    return n_bytes, n_chars


def cmd_tokenizer_merges(args) -> int:
    from pipeline_lib import lab

    print(lab.merges_text(_load_tokenizer(args), args.tokenizer))
    return 0


def cmd_tokenizer_vocab(args) -> int:
    from pipeline_lib import lab

    tok = _load_tokenizer(args)
    rows = lab.vocab_rows(tok, args.search)
    if args.id is not None:
        rows = [(i, t) for i, t in rows if i == args.id]
        if not rows:
            raise InputError(f"--id {args.id}: not an id of this tokenizer (0 to {tok.vocab_size - 1})")
    for i, text in rows:
        print(f"{i}\t{text}")
    if args.search and not rows:
        print(f"no token contains {args.search!r}", file=sys.stderr)
    return 0


def cmd_tokenizer_decode(args) -> int:
    tok = _load_tokenizer(args)
    source = "--ids" if args.ids is not None else f"--input {args.input}"
    ids = _read_ids(args.ids, "--ids") if args.ids is not None else _read_ids_file(args.input)
    try:
        data = tok.decode_bytes(ids)
    except (InputError, TypeError) as e:
        raise InputError(f"{source}: {e}") from None
    if args.output:
        with open(args.output, "wb") as f:
            f.write(data)
        print(f"{len(ids)} tokens -> {len(data)} bytes -> {args.output}")
    else:
        sys.stdout.write(data.decode("utf-8", "replace"))
        sys.stdout.write("\n")
    return 0


def _read_ids_file(path: str) -> list[int]:
    """Ids from a .npy array (no pickle), a .json list, or text (``-``: stdin): integers
    separated by whitespace or commas, as `tokenizer encode` prints them."""
    import numpy as np

    flag = f"--input {path}"
    try:
        if path.endswith(".npy"):
            try:
                array = np.load(path, allow_pickle=False)
            except ValueError as e:
                raise InputError(f"{flag}: not a .npy array of ids ({e})") from None
            if array.ndim != 1 or array.dtype.kind not in "iu":
                raise InputError(f"{flag}: expected a one-dimensional integer array, got shape {array.shape} of {array.dtype}")
            return array.tolist()
        if path == "-":
            text = sys.stdin.read()
        else:
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read()
    except FileNotFoundError:
        raise InputError(f"{flag}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{flag}: is a directory, not a file of ids") from None
    if path.endswith(".json"):
        try:
            ids = json.loads(text)
        except json.JSONDecodeError as e:
            raise InputError(f"{flag}: not valid JSON ({e})") from None
        if not isinstance(ids, list) or not all(type(i) is int for i in ids):
            raise InputError(f"{flag}: expected a JSON list of integer ids")
        return ids
    return _read_ids(text, flag)


def _read_ids(text: str, flag: str) -> list[int]:
    words = text.replace(",", " ").split()
    bad = next((w for w in words if not w.isdigit()), None)
    if bad is not None:
        raise InputError(f"{flag}: {bad[:40]!r} is not a token id (give non-negative integers separated by spaces or commas)")
    return [int(w) for w in words]


def _refuse_special_in_file(tok, path: str, allowed) -> None:
    """Refuse a --input file holding a special token that is not allowed, reading it a block
    at a time: before the whole file is read and encoded."""
    from pipeline_lib.tokenizer.load import find_special_in_file

    refused = [] if allowed == "all" else [t for t in tok.special_tokens if t not in allowed]
    try:
        found = find_special_in_file(path, refused)
    except FileNotFoundError:
        raise InputError(f"--input {path}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"--input {path}: is a directory, not a text file") from None
    if found:
        token, offset = found
        raise InputError(
            f"--input {path} holds the special token {token!r} (at byte {offset:,}), which text may only hold when allowed: "
            f"pass --allow-special '{token}' to encode it as its id {tok.special_tokens[token]}, or --special-as-text to encode it as ordinary text"
        )


def _read_text(path: str, flag: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as f:
            return f.read()
    except FileNotFoundError:
        raise InputError(f"{flag} {path}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{flag} {path}: is a directory, not a text file") from None


def cmd_tokenizer_inspect(args) -> int:
    from pipeline_lib import lab
    from pipeline_lib.tokenizer import Tokenizer

    if args.top < 1:
        raise InputError(f"--top {args.top}: must be at least 1")
    counts = None
    if args.tokenizer.endswith(".json") and os.path.isfile(args.tokenizer):  # a HF tokenizer.json
        tok = Tokenizer.from_hf_json(args.tokenizer)
    elif _is_tokenizer_dir(args.tokenizer):
        tok = Tokenizer.load(args.tokenizer)
    else:  # a store version: its counts parent holds the training pieces
        from pipeline_lib.counting import COUNTS_FILE, read_counts

        store = _store(args)
        k, v = _resolve(store, args.tokenizer, "tokenizer")
        tok = Tokenizer.load(store.local_dir(k, v))
        if store.manifest(k, v)["parents"].get("counts"):
            parent = store.parent(store.ref(k, v), "counts")
            counts = read_counts(os.path.join(store.local_dir(parent.kind, parent.version), COUNTS_FILE))
    report = lab.inspect_tokenizer(tok, args.top, counts)
    print(json.dumps(report, indent=2, ensure_ascii=False) if args.json else lab.inspect_text(report))
    return 0


def cmd_tokenizer_export(args) -> int:
    _check_out_outside_store(_store(args), args.out)
    tok = _load_tokenizer(args)
    if args.format == "hf":
        tok.to_hf_json(args.out)
    elif args.format == "transformers":
        tok.to_transformers(args.out)
    elif args.format == "gpt2":
        tok.to_gpt2(args.out)
    else:
        from pipeline_lib.tokenizer.export import tiktoken_ranks_file

        data = tiktoken_ranks_file(tok)  # before anything is written: a char/word tokenizer is refused
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "wb") as f:
            f.write(data)
    print(f"{args.format} export -> {args.out}")
    return 0


def cmd_encode(args) -> int:
    configs = configs_from_args(args, ENCODE_CONFIGS)
    store = _store(args)
    so = _storage_options(args.storage_option) or None
    k, v = _resolve(store, args.tokenizer, "tokenizer")
    with _flow_api():
        from flows.pipeline import encode_corpus_flow

        flow = encode_corpus_flow.with_options(task_runner=_runner(args))
        tokens = flow(configs["corpus"], store.ref(k, v), store=args.store, encode=configs["encode"], storage_options=so, documents=configs[DOCUMENTS])
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


# The kinds tokenmill's stages publish (pipeline_lib's *_KIND constants, spelled here so
# that `versions` needs none of their modules).
PIPELINE_KINDS = ("raw", "corpus", "counts", "tokenizer", "tokens", "model", "report", "sweep")


def cmd_versions(args) -> int:
    store = _store(args)
    if args.kind is not None and args.kind not in PIPELINE_KINDS:
        in_store = sorted({m["kind"] for m in store.list()} - set(PIPELINE_KINDS))
        if args.kind not in in_store:
            raise InputError(f"--kind {args.kind}: not a kind of version; choose one of {', '.join([*PIPELINE_KINDS, *in_store])}")
    rows = store.list(args.kind)
    if not rows:
        print(f"no versions in {store.url}")
        return 0
    print(f"{'kind':<10} {'version':<21} {'created':<26} parents / key figures")
    for m in rows:
        parents = ",".join(f"{k}={v.split('/')[-1][:8]}" for k, v in m["parents"].items())
        print(f"{m['kind']:<10} {m['version']:<21} {m['created']:<26} {parents} {_headline(m)}")
    return 0


def _headline(m: dict[str, Any]) -> str:
    meta = m.get("meta", {})
    if m["kind"] == "tokenizer":
        return f"vocab={meta.get('vocab_size')} pattern={meta.get('pattern')}"
    if m["kind"] == "tokens":
        return f"tokens={meta.get('totals', {}).get('n_tokens')} dtype={meta.get('dtype')}"
    if m["kind"] == "corpus":
        return f"docs={meta.get('n_docs')} bytes={meta.get('n_bytes')} shards={len(meta.get('shards', []))}"
    if m["kind"] == "model":
        return f"val_loss={meta.get('metrics', {}).get('final_val_loss')}"
    if m["kind"] == "counts":
        return f"pieces={meta.get('n_pieces')}"
    return f"bytes={meta.get('n_bytes')}"


def cmd_show(args) -> int:
    store = _store(args)
    k, v = _resolve(store, args.ref)
    print(json.dumps(store.manifest(k, v), indent=2, ensure_ascii=False))
    return 0


def _verify_one(store, k: str, v: str) -> dict[str, Any]:
    m = store.verify(k, v)
    if k == "tokens":  # (a remote version is checked in its hash-checked local cache)
        from pipeline_lib.token_shards import check_shards

        check_shards(store.local_dir(k, v), m["meta"])
    return m


def cmd_verify(args) -> int:
    store = _store(args)
    if args.all == bool(args.ref):
        raise InputError("verify: give a version (kind/version, a version prefix or latest:KIND) or --all")
    if not args.all:
        k, v = _resolve(store, args.ref)
        m = _verify_one(store, k, v)
        print(f"{k}/{v}: {len(m['files'])} files OK")
        return 0
    if not store.is_store():
        raise InputError(f"{store.url} is not a tokenmill store: check --store")
    from pipeline_lib.errors import StoreError
    from pipeline_lib.store import split_key

    faults = 0
    results = store.verify_all()
    for key, fault in results:
        if fault is None:
            try:
                m = _verify_one(store, *split_key(key))
                print(f"{key}: {len(m['files'])} files OK")
                continue
            except (StoreError, InputError, OSError) as e:
                fault = str(e)
        faults += 1
        print(f"{key}: FAULT: {fault}")
    foreign = store.foreign_entries()
    for path in foreign:
        print(f"foreign (not written by the store, kept): {path}")
    print(f"{len(results)} version(s), {faults} fault(s), {len(foreign)} foreign item(s) in {store.url}")
    if faults:
        print(f"tokenmill: error: {faults} version(s) in {store.url} failed verification (listed above)", file=sys.stderr)
        return EXIT_FAILURE
    return 0


def cmd_rm(args) -> int:
    store = _store(args)
    k, v = _resolve(store, args.ref)
    removed = store.remove_version(k, v, with_dependents=args.with_dependents, dry_run=args.dry_run, with_unused_parents=args.with_unused_parents)
    for key in removed:
        print(("would remove " if args.dry_run else "removed ") + key)
    return 0


def cmd_gc(args) -> int:
    if not args.prefect_home:
        store = _store(args)
        removed = store.gc(dry_run=args.dry_run, min_age_s=args.min_age)
        for path in removed:
            print(("would remove " if args.dry_run else "removed ") + path)
        foreign = store.foreign_entries()
        for path in foreign:
            print(f"kept (not written by the store): {path}")
        print(f"{len(removed)} unpublished item(s)" + (f"; {len(foreign)} foreign item(s) kept" if foreign else ""))
    else:
        from pathlib import Path

        from flows.prefect_api import LocalServer, server_dir

        log_dir = None if os.environ.get(ENV_LOG_DIR) else Path(_log_dir())  # a log directory of the user's own is theirs
        local = LocalServer(server_dir())
        removed, notes = local.gc(args.min_age, args.dry_run, log_dir)
        for note in notes:
            print(note)
        for path in removed:
            print(("would remove " if args.dry_run else "removed ") + path)
        print(f"{len(removed)} file(s) of tokenmill's local Prefect server and logs ({local.directory})")
    return 0


def _duration(delta: dt.timedelta) -> str:
    whole_minutes = int(delta.total_seconds()) // 60
    return f"{whole_minutes // 60} h {whole_minutes % 60} min" if whole_minutes >= 60 else f"{whole_minutes} min"


def cmd_server(args) -> int:
    from flows import warm
    from flows.prefect_api import DEFAULT_STARTUP_TIMEOUT_S, ENV_IDLE_TIMEOUT, ENV_STARTUP_TIMEOUT, LocalServer, read_float_env, server_dir

    local = LocalServer(server_dir())
    if args.action == "start":
        state = local.ensure(read_float_env(ENV_STARTUP_TIMEOUT, DEFAULT_STARTUP_TIMEOUT_S))
        warm.spawn(str(local.directory), state["pid"])
        print(f"tokenmill's local Prefect server: {state['api_url']} (pid {state['pid']}, files in {local.directory})")
    elif args.action == "stop":
        pid = local.stop()
        print(f"stopped tokenmill's local Prefect server (pid {pid})" if pid else f"no local Prefect server was running ({local.directory})")
    else:
        status = local.status()
        if status is None:
            print(f"not running; tokenmill starts it in {local.directory} when a command runs flows without PREFECT_API_URL")
        else:
            clients = local.live_clients()
            since = dt.datetime.fromtimestamp(status["started"])
            idle = float(status.get("idle_timeout_s") or 0)
            print(f"running: {status['api_url']} (pid {status['pid']}, since {since:%Y-%m-%d %H:%M:%S}, up {_duration(dt.datetime.now() - since)})")
            print(f"  idle time-out: {f'{idle / 60:g} min without a command' if idle > 0 else 'none'} ({ENV_IDLE_TIMEOUT})")
            runner = warm.runner_pid(str(local.directory))
            if runner is None:
                print(f"  warm runner: none ({warm.ENV_WARM}=1 starts one)")
            else:
                runner_since = dt.datetime.fromtimestamp(float(warm.read_info(str(local.directory)).get("started") or 0))
                print(f"  warm runner: pid {runner}, since {runner_since:%Y-%m-%d %H:%M:%S}")
            print(f"  files:    {local.directory} (database {local.db_path.name}, log {local.log_path.name}, results {local.storage_dir.name}/)")
            print(f"  commands: {len(clients)} running" + (f" (pid {', '.join(map(str, clients))})" if clients else ""))
            print(f"  use it elsewhere: export PREFECT_API_URL={status['api_url']} PREFECT_API_AUTH_STRING=$(cat {local.auth_path})")
    return 0


def _check_out_outside_store(store, out: str) -> None:
    """Exports never go where gc and verify look: refuse an --out inside the store."""
    if store.contains_local_path(out):
        raise InputError(f"--out {out} is inside the store {store.url}: the store keeps only what it writes; choose an --out outside it")


def cmd_export_nanogpt(args) -> int:
    from pipeline_lib.stages import load_tokenizer
    from pipeline_lib.store import split_key
    from pipeline_lib.token_shards import export_nanogpt

    store = _store(args)
    _check_out_outside_store(store, args.out)
    k, v = _resolve(store, args.tokens, "tokens")
    meta = store.manifest(k, v)["meta"]
    tok = load_tokenizer(store, store.ref(*split_key(meta["tokenizer"]["version"])))  # the tokens' tokenizer, "tokenizer/<id>"
    token_bytes: list[bytes | None] = []
    for i in range(tok.vocab_size):
        try:
            token_bytes.append(tok.decode_single_token_bytes(i))
        except KeyError:  # an id no token uses
            token_bytes.append(None)
    written = export_nanogpt(store.local_dir(k, v), meta, args.out, args.val_fraction, token_bytes=token_bytes)
    print(f"train.bin: {written['train']:,} tokens, val.bin: {written['val']:,} tokens -> {args.out}")
    return 0


def cmd_export_llmc(args) -> int:
    from pipeline_lib.token_shards import export_llmc

    store = _store(args)
    _check_out_outside_store(store, args.out)
    k, v = _resolve(store, args.tokens, "tokens")
    written = export_llmc(
        store.local_dir(k, v), store.manifest(k, v)["meta"], args.out, args.val_fraction, args.prefix, separator_placement=args.separator_placement
    )
    print(f"{args.prefix}_train.bin: {written['train']:,} tokens, {args.prefix}_val.bin: {written['val']:,} tokens -> {args.out}")
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
    heldout = "\n\n".join(d.decode("utf-8") for docs in iter_shard_batches(store.local_file(corpus.kind, corpus.version, last)) for d in docs)
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
        corpus = _read_text(args.corpus, "--corpus") if args.corpus else open(DEFAULT_CORPUS, encoding="utf-8").read()[:200_000]
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

            print(
                f"attached to a Prefect run: {lab_page_flow(args.out, f'tokenmill lab: {name}', [{k: r[k] for k in ('name', 'tokens', 'chars_per_token')} for r in rows])}"
            )
    return 0


def cmd_compare(args) -> int:
    from pipeline_lib import lab
    from pipeline_lib.corpus import DEFAULT_CORPUS
    from pipeline_lib.fsio import read_bytes
    from pipeline_lib.report import MULTILINGUAL

    config = configs_from_args(args, COMPARE_CONFIGS)["compare"]
    yours = {ref: _load_tokenizer(argparse.Namespace(**{**vars(args), "tokenizer": ref})) for ref in args.tokenizer or []}
    if args.show or args.text is not None:
        if args.text is None or not args.show:
            raise InputError("compare --show draws one text: give both --show and --text '...'")
        from pipeline_lib.tokenizer import get_encoding

        named = [*yours.items(), *((name, get_encoding(name)) for name in ("gpt2", "cl100k_base", "o200k_base"))]
        colour = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
        import shutil

        print(lab.show_text_rows(args.text, lab.text_rows(args.text, named), width=shutil.get_terminal_size().columns, colour=colour))
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
            raise InputError("--tokenizer is measured by the command itself: leave out --flow to compare your tokenizers")
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
        multilingual = read(args.multilingual or MULTILINGUAL, "--multilingual") if (args.multilingual or "").lower() != "none" else None
        result = lab.compare(text, config, source, multilingual, files, progress=lambda message: print(message, file=sys.stderr, flush=True), tokenizers=yours)
    print(lab.compare_text(result))
    paths = lab.write_comparison(result, args.out)
    print(f"table: {paths['md']}, figures: {paths['json']}, plot: {paths['png']}")
    return 0


def cmd_serve(args) -> int:
    from deployments.serve import serve

    serve(
        store=args.store,
        corpus=args.corpus,
        storage_options=_storage_options(args.storage_option) or None,
        runner=args.runner,
        workers=args.workers,
        dask_address=args.dask_address,
        paused=args.paused,
    )
    return 0


def cmd_deploy(args) -> int:
    from deployments.deploy import run

    return run(args)


# --------------------------------------------------------------------------- parser
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
    p.add_argument("--debug", action="store_true", default=default, help="print the full traceback of a failure (also TOKENMILL_DEBUG=1)")


def _add_runner(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workers", type=int, default=0, help="parallel workers for mapped stages (default: all cores)")
    p.add_argument("--runner", choices=("threads", "processes", "dask"), default="threads", help="Prefect task runner (default: %(default)s)")
    p.add_argument("--dask-address", help="existing Dask scheduler, e.g. tcp://10.0.0.5:8786 (with --runner dask)")


# --------------------------------------------------------------------------- config options
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
                type=(lambda t, f=f: [_parse_value(f, x) for x in t.split(",")]) if split else (lambda t, f=f: [_parse_value(f, t)]),
            )
        else:
            kw.update(type=lambda t, f=f: _parse_value(f, t), default=default, choices=f.choices, metavar=None if f.choices else f.name.upper())
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


def _command_path(argv: list[str] | None) -> tuple[str, ...] | None:
    """The command words `argv` starts with, e.g. ``("tokenizer", "train")``; None for all."""
    if argv is None:
        return None
    return tuple(a for a in argv if not a.startswith("-"))[:2]


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser; given the command line, it has the stage options only of the command
    that line names: they import the stages' config classes (numpy, pyarrow...)."""
    path = _command_path(argv)

    def _add_configs(p: argparse.ArgumentParser, command: tuple[str, ...], names: tuple[str, ...], **defaults: Any) -> None:
        if path is None or path[: len(command)] == command:
            _add_config_groups(p, names, **{k: v() for k, v in defaults.items()})

    parser = argparse.ArgumentParser(
        prog="tokenmill",
        description="Raw text -> byte-level BPE tokenizer -> token shards -> GPT, as versioned Prefect flows.",
        epilog=__doc__.split("\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_debug(parser)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("run", help="run the whole pipeline (default: bundled tiny Shakespeare into ./artifacts)")
    _add_store(p)
    _add_configs(p, ("run",), RUN_CONFIGS)
    _add_runner(p)
    p.add_argument("--no-lm", action="store_true", help="stop after the token shards")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("sweep", help="which tokenizer makes the better model: tokenizers at several vocabulary sizes, the same GPT on each at equal compute")
    _add_store(p)
    _add_configs(p, ("sweep",), SWEEP_CONFIGS)
    _add_runner(p)
    p.set_defaults(func=cmd_sweep)

    tp = sub.add_parser("tokenizer", help="train, use and export tokenizers").add_subparsers(dest="sub", required=True)
    p = tp.add_parser("train", help="count and learn merges from a corpus")
    _add_store(p)
    _add_configs(p, ("tokenizer", "train"), TOKENIZER_CONFIGS)
    _add_runner(p)
    p.add_argument("--out", help="also save the tokenizer files into this directory")
    p.add_argument(
        "--log-merges", type=int, default=0, metavar="N", help="log every N-th merge: the pair, the new token, its count when merged (default: none)"
    )
    p.add_argument("--trace", action="store_true", help="print the training pieces (the 20 most frequent) after each merge; kept as a run artifact too")
    p.set_defaults(func=cmd_tokenizer_train)
    p = tp.add_parser("encode", help="encode text with a tokenizer")
    _add_store(p)
    p.add_argument(
        "--tokenizer",
        default="latest:tokenizer",
        help="REF in the store, a saved tokenizer directory, or a HF tokenizer.json of byte-level BPE, or a production encoding: gpt2, r50k_base, p50k_base, cl100k_base, o200k_base",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--text")
    src.add_argument("--input", help="text file to encode")
    p.add_argument("--output", help="write ids as .npy instead of printing")
    p.add_argument("--allow-special", action="append", metavar="TOKEN", help="special token allowed in the text (repeatable; 'all': every one)")
    p.add_argument(
        "--special-as-text",
        action="store_true",
        help="encode special-token text the --allow-special flags do not name as ordinary text (the library's encode_ordinary), instead of refusing it",
    )
    p.add_argument("--show", action="store_true", help="draw each token's text above its id (whitespace visible, coloured in a terminal) and the compression")
    p.add_argument("--trace", action="store_true", help="per piece: its starting parts, then each merge applied (lowest rank first) with its rank")
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
    p.add_argument("--tokenizer", default="latest:tokenizer", help="REF in the store, a saved tokenizer directory or a HF tokenizer.json of byte-level BPE")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--ids", help="ids separated by spaces or commas, as 'tokenizer encode' prints them")
    src.add_argument("--input", help="a .npy array of ids ('tokenizer encode --output'), a .json list, or a text file of ids ('-': stdin)")
    p.add_argument("--output", help="write the decoded bytes to this file instead of printing the text")
    p.set_defaults(func=cmd_tokenizer_decode)
    p = tp.add_parser("inspect", help="shortest, longest, first and last tokens, tokens per length, tokens never used in training")
    _add_store(p)
    p.add_argument("--tokenizer", default="latest:tokenizer", help="REF in the store (its training counts are known) or a saved tokenizer directory")
    p.add_argument("--top", type=int, default=10, help="tokens shown in each list (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.set_defaults(func=cmd_tokenizer_inspect)
    p = tp.add_parser("export", help="export to HF tokenizer.json, a transformers directory, GPT-2's vocab.json + merges.txt or a .tiktoken ranks file")
    _add_store(p)
    p.add_argument("--tokenizer", default="latest:tokenizer", help="REF in the store, a saved tokenizer directory or a HF tokenizer.json of byte-level BPE")
    p.add_argument("--format", choices=("hf", "tiktoken", "transformers", "gpt2"), required=True, help="transformers and gpt2 write into the directory --out")
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_tokenizer_export)

    p = sub.add_parser("encode", help="encode a corpus into token shards with an existing tokenizer")
    _add_store(p)
    _add_configs(p, ("encode",), ENCODE_CONFIGS)
    _add_runner(p)
    p.add_argument("--tokenizer", default="latest:tokenizer", help="tokenizer REF (default: %(default)s)")
    p.set_defaults(func=cmd_encode)

    lp = sub.add_parser("lm", help="train and sample the language model").add_subparsers(dest="sub", required=True)
    p = lp.add_parser("train", help="train a GPT on a tokens version")
    _add_store(p)
    _add_configs(p, ("lm", "train"), LM_CONFIGS)
    p.add_argument("--tokens", default="latest:tokens", help="tokens REF (default: %(default)s)")
    p.set_defaults(func=cmd_lm_train)
    p = lp.add_parser("sample", help="generate text from a trained model")
    _add_store(p)
    p.add_argument("--model", default="latest:model", help="model REF (default: %(default)s)")
    p.add_argument("--device", default="auto", help="auto (CUDA, else MPS, else CPU), cpu, cuda, cuda:N or mps (default: %(default)s)")
    _add_configs(p, ("lm", "sample"), SAMPLE_CONFIGS)
    p.set_defaults(func=cmd_lm_sample)

    p = sub.add_parser("versions", help="list the versions in a store")
    _add_store(p)
    p.add_argument("--kind", help="only this kind (raw, corpus, counts, tokenizer, tokens, model, report, sweep)")
    p.set_defaults(func=cmd_versions)
    for name, func, helptext in (("show", cmd_show, "print a version's manifest"), ("verify", cmd_verify, "re-hash a version's files against its manifest")):
        p = sub.add_parser(name, help=helptext)
        _add_store(p)
        p.add_argument("ref", nargs="?" if name == "verify" else None, help="kind/version, a version prefix, or latest:KIND")
        if name == "verify":
            p.add_argument("--all", action="store_true", help="verify every published version and list what the store did not write; exit 1 on any fault")
        p.set_defaults(func=func)
    p = sub.add_parser("rm", help="delete a published version (refused while others derive from it, unless --with-dependents)")
    _add_store(p)
    p.add_argument("ref", help="kind/version, a version prefix, or latest:KIND")
    p.add_argument("--with-dependents", action="store_true", help="also remove every version derived from it (listed first)")
    p.add_argument(
        "--with-unused-parents",
        action="store_true",
        help="also remove the versions it derives from that no remaining version uses (e.g. the raw copy of a corpus)",
    )
    p.add_argument("--dry-run", action="store_true", help="print what would be removed, remove nothing")
    p.set_defaults(func=cmd_rm)
    p = sub.add_parser("gc", help="remove the unpublished leftovers the store wrote (staging areas, work dirs, stale claims); list and keep everything else")
    _add_store(p)
    p.add_argument("--dry-run", action="store_true")
    p.add_argument(
        "--min-age", type=float, default=3600, help="spare leftovers younger than this many seconds: a running flow's staging area (default: %(default)s)"
    )
    p.add_argument(
        "--prefect-home",
        action="store_true",
        help="instead of the store: remove what tokenmill's local Prefect server left in $PREFECT_HOME/tokenmill (its "
        "database, log, task results older than --min-age; it is stopped first unless a tokenmill command is using it) "
        "and tokenmill's failure logs ($PREFECT_HOME/logs/tokenmill-*.log) older than --min-age; nothing else",
    )
    p.set_defaults(func=cmd_gc)
    p = sub.add_parser("server", help="tokenmill's local Prefect server, used when PREFECT_API_URL is unset: status, start or stop it")
    p.add_argument("action", choices=("status", "start", "stop"))
    _add_debug(p, default=argparse.SUPPRESS)
    p.set_defaults(func=cmd_server)
    p = sub.add_parser("export-nanogpt", help="write nanoGPT's train.bin / val.bin from a tokens version")
    _add_store(p)
    p.add_argument("--tokens", default="latest:tokens")
    p.add_argument("--out", required=True)
    p.add_argument(
        "--val-fraction",
        type=float,
        help="checked against the split the tokens version records (decided at encoding by its --val-fraction); default: that split",
    )
    p.set_defaults(func=cmd_export_nanogpt)
    p = sub.add_parser("export-llmc", help="write llm.c's <prefix>_train.bin / <prefix>_val.bin from a tokens version")
    _add_store(p)
    p.add_argument("--tokens", default="latest:tokens")
    p.add_argument("--out", required=True)
    p.add_argument(
        "--val-fraction",
        type=float,
        help="checked against the split the tokens version records (decided at encoding by its --val-fraction); default: that split",
    )
    p.add_argument("--prefix", default="tokens")
    p.add_argument(
        "--separator-placement", choices=("append", "prepend"), help="separator after or before each document (default: as encoded; llm.c's scripts prepend)"
    )
    p.set_defaults(func=cmd_export_llmc)
    lab_parsers = sub.add_parser("lab", help="the tokenizer lab: learn BPE in a browser").add_subparsers(dest="sub", required=True)
    p = lab_parsers.add_parser("page", help="one self-contained HTML page: coloured tokens, a merge slider, compression vs vocabulary, compare table")
    _add_store(p)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", help="the text the page shows")
    src.add_argument("--input", help="text file the page shows")
    p.add_argument("--tokenizer", help="REF in the store, a saved directory or a production encoding name (default: train one on --corpus)")
    p.add_argument("--corpus", help="with no --tokenizer: text file to train byte-level BPE on (default: the bundled tiny Shakespeare)")
    p.add_argument("--merges", type=int, default=500, help="with no --tokenizer: merges to learn (default: %(default)s)")
    p.add_argument("--ties", choices=("bytes", "first-seen"), default="bytes", help="with no --tokenizer: the tie rule (default: %(default)s)")
    p.add_argument("--out", default="lab.html", help="the HTML file to write (default: %(default)s)")
    p.add_argument("--flow", action="store_true", help="also attach the page to a Prefect run: a link artifact and the compare table")
    p.set_defaults(func=cmd_lab_page)
    p = lab_parsers.add_parser("corpora", help="the small corpora shipped for the tutorials: list them, or copy them into a directory")
    p.add_argument("--copy", metavar="DIR", help="copy every one into DIR (as NAME.txt)")
    p.set_defaults(func=cmd_lab_corpora)
    p = sub.add_parser("report", help="compression vs vocabulary size, fertility per language, notable tokens")
    _add_store(p)
    p.add_argument(
        "--tokenizer",
        action="append",
        metavar="REF",
        help="a tokenizer you trained (REF, directory or encoding name), measured on the same held-out text; repeatable",
    )
    _add_configs(p, ("report",), REPORT_CONFIGS, corpus=_report_corpus)
    p.set_defaults(func=cmd_report)
    p = sub.add_parser(
        "compare",
        help="character level, word level, BPE trained at several sizes (ours, HF's) and GPT-2 / cl100k / o200k, measured on the same held-out text",
    )
    p.add_argument("--corpus", metavar="URL", help="text file (path or fsspec URL) to train on and hold out from (default: the bundled tiny Shakespeare)")
    p.add_argument("--multilingual", metavar="URL", help="UDHR sample for fertility per language (default: the bundled one; 'none': leave it out)")
    p.add_argument("--encoding-file", action="append", metavar="NAME=PATH", help="ranks file of a production encoding, e.g. cl100k_base=./cl100k_base.tiktoken")
    p.add_argument("--out", default="./compare", help="directory for compare.md, compare.json and compare.png (default: %(default)s)")
    p.add_argument("--storage-option", action="append", metavar="KEY=VALUE", help="fsspec option for the corpus URL (repeatable)")
    p.add_argument("--flow", action="store_true", help="run as a Prefect flow: the table and the plot also become the run's artifacts")
    p.add_argument(
        "--tokenizer",
        action="append",
        metavar="REF",
        help="a tokenizer you trained (REF in --store, or a saved directory) measured beside the others; repeatable",
    )
    p.add_argument("--store", default=DEFAULT_STORE, help="artifact store holding the --tokenizer REFs (default: %(default)s)")
    p.add_argument("--text", help="with --show: this text as tokens under character level, word level, your tokenizers and gpt2 / cl100k / o200k")
    p.add_argument("--show", action="store_true", help="draw --text under each tokenizer (coloured in a terminal) instead of measuring a corpus")
    _add_configs(p, ("compare",), COMPARE_CONFIGS)
    _add_debug(p, default=argparse.SUPPRESS)
    p.set_defaults(func=cmd_compare)
    p = sub.add_parser("serve", help="serve the scheduled deployments from this process (needs a Prefect server)")
    _add_store(p)
    p.add_argument("--corpus", action="append", metavar="URL")
    _add_runner(p)
    p.add_argument("--paused", action="store_true", help="register the schedules paused")
    p.set_defaults(func=cmd_serve)
    p = sub.add_parser("deploy", help="create the deployments on a Prefect server, for process workers on any machine (they clone and install the project)")
    if path is None or path[:1] == ("deploy",):  # its options import Prefect's deployment machinery
        from deployments.deploy import add_arguments as add_deploy_arguments

        add_deploy_arguments(p)
    p.set_defaults(func=cmd_deploy)
    return parser


@contextlib.contextmanager
def _debug_env(debug: bool):
    previous = os.environ.get(ENV_DEBUG)
    if debug:
        os.environ[ENV_DEBUG] = "1"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(ENV_DEBUG, None)
        else:
            os.environ[ENV_DEBUG] = previous


# Commands that run stages: a rerun after a failure resumes them.
_RESUMABLE = (cmd_run, cmd_sweep, cmd_tokenizer_train, cmd_encode, cmd_lm_train, cmd_report, cmd_serve)


def use_console_handler() -> None:
    """Our console handler for Prefect's logs (PREFECT_CONSOLE_CLASS), set before anything
    imports Prefect: its settings read it then (in a command's process, or once in the warm
    runner for every command it runs). A logging.yml of the user's own is left alone."""
    if not os.environ.get("PREFECT_LOGGING_SETTINGS_PATH") and not os.path.exists(os.path.join(prefect_home(), "logging.yml")):
        os.environ.setdefault(*PREFECT_CONSOLE_CLASS)


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # the program itself (the `tokenmill` script, python -m flows.cli), not a caller in-process
        try:
            return main(sys.argv[1:])
        finally:
            # The process exits next. The interpreter's last garbage collections would walk every
            # object Prefect and pydantic made (1-3 s on a loaded 2-core machine) only to free
            # memory the exit frees anyway; frozen objects are skipped. atexit handlers (Prefect's
            # event and log flushes) still run.
            import gc

            gc.freeze()
    argv = list(argv)
    _error_line_printed.clear()  # one error line per command (a caller may run several in one process)
    use_console_handler()
    args = build_parser(argv).parse_args(argv)
    debug = bool(getattr(args, "debug", False)) or os.environ.get(ENV_DEBUG, "").strip().lower() not in ("", "0", "false", "no")
    _command.update(store=getattr(args, "store", None), resumable=args.func in _RESUMABLE)
    with _debug_env(debug):
        try:
            if isinstance(getattr(args, "store", None), str):  # before any work: a store URL that cannot hold results
                from pipeline_lib.store import check_store_url

                check_store_url(args.store, durable=True)
            with _sigterm_raises():
                return args.func(args)
        except (SystemExit, GeneratorExit):
            raise
        except BrokenPipeError:
            # The reader of our output went away (`tokenmill ... | head`): not a failure to
            # report, as for any filter. Python's own recipe: no flush of stdout at exit.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return EXIT_BROKEN_PIPE
        except BaseException as e:  # noqa: BLE001 - the one place every failure is reported
            return report_failure(e, argv, getattr(args, "store", None), debug, resumable=args.func in _RESUMABLE)


if __name__ == "__main__":
    sys.exit(main())
