"""The `tokenmill tokenizer` commands: train (a flow), encode, decode, merges, vocab, inspect
and export."""

from __future__ import annotations

import errno
import json
import os
import sys

from flows.cli_common import (
    _check_out_outside_store,
    _flow_api,
    _is_tokenizer_dir,
    _load_tokenizer,
    _read_text,
    _resolve,
    _runner,
    _storage_options,
    _store,
)
from flows.cli_options import TOKENIZER_CONFIGS, configs_from_args
from pipeline_lib.errors import InputError


def _numpy_with_one_blas_thread() -> None:
    """Import numpy with one OpenBLAS thread: the tokenizer commands do no linear algebra, and
    OpenBLAS starts a thread per core as it loads (~55 ms of a ~0.3 s command on 2 cores, more
    on many). The setting is in the environment only while numpy loads, so nothing the command
    starts inherits it; a user's own OPENBLAS_NUM_THREADS, or numpy already loaded (a caller
    in-process, the warm runner), is left alone."""
    if "numpy" in sys.modules or "OPENBLAS_NUM_THREADS" in os.environ:
        return
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    try:
        import numpy  # noqa: F401
    finally:
        del os.environ["OPENBLAS_NUM_THREADS"]


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
            n, n_bytes, n_chars = tok.encode_file(args.input, output, allowed_special=allowed)
        except IsADirectoryError as e:
            flag = f"--input {args.input}" if e.filename == args.input else f"--output {output}"
            raise InputError(f"{flag}: is a directory, not a file") from None
        except FileNotFoundError as e:
            flag = (
                f"--input {args.input}: no such file"
                if e.filename == args.input
                else (f"--output {output}: no such directory")
            )
            raise InputError(flag) from None
        except OSError as e:
            if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            raise InputError(
                f"--output {output}: no space left on device (the file is left as it was): free space or choose "
                "another --output"
            ) from None
        per_token = f": {n_chars / n:.2f} chars/token, {n_bytes / n:.2f} bytes/token" if n else ""
        print(f"{n} tokens -> {output} ({n_chars:,} characters, {n_bytes:,} bytes{per_token})")
        return 0
    text = args.text if args.text is not None else _read_text(args.input, "--input")
    if args.special_as_text:  # tiktoken's encode(text, allowed_special=..., disallowed_special=())
        allowed = lab.check_special_tokens(tok, "", allow, "--text")
        ids = tok.encode(text, allowed_special=allowed, disallowed_special=())
    else:
        allowed = lab.check_special_tokens(
            tok, text, allow, "--text" if args.text is not None else f"--input {args.input}"
        )
        ids = tok.encode(text, allowed_special=allowed)
    if args.trace:
        print(lab.encode_trace_text(lab.encode_trace(tok, text)))
    if args.show:
        import shutil

        colour = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
        print(lab.show_tokens(tok, text, ids, width=shutil.get_terminal_size().columns, colour=colour))
    if args.output:  # NumPy only here: printing the ids needs none
        _numpy_with_one_blas_thread()
        import numpy as np

        np.save(args.output, np.array(ids, dtype=np.uint32), allow_pickle=False)
        ratio = ""
        if args.input is not None:
            c = lab.compression(text, len(ids))
            ratio = (
                f" ({c['chars']:,} characters, {c['bytes']:,} bytes: {c['chars_per_token']:.2f} chars/token, "
                f"{c['bytes_per_token']:.2f} bytes/token)"
            )
        print(f"{len(ids)} tokens -> {args.output}{ratio}")
    elif args.input is not None and not args.show:
        print(" ".join(map(str, ids)))
        c = lab.compression(text, len(ids))
        print(
            f"{c['tokens']:,} tokens for {c['chars']:,} characters ({c['bytes']:,} bytes): {c['chars_per_token']:.2f} "
            f"chars/token, {c['bytes_per_token']:.2f} bytes/token"
        )
    elif not args.show and not args.trace:
        print(" ".join(map(str, ids)))
    return 0


def cmd_tokenizer_merges(args) -> int:
    _numpy_with_one_blas_thread()
    from pipeline_lib import lab

    print(lab.merges_text(_load_tokenizer(args), args.tokenizer))
    return 0


def cmd_tokenizer_vocab(args) -> int:
    _numpy_with_one_blas_thread()
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
    _numpy_with_one_blas_thread()
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
                raise InputError(
                    f"{flag}: expected a one-dimensional integer array, got shape {array.shape} of {array.dtype}"
                )
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
        raise InputError(
            f"{flag}: {bad[:40]!r} is not a token id (give non-negative integers separated by spaces or commas)"
        )
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
            f"--input {path} holds the special token {token!r} (at byte {offset:,}), which text may only hold when "
            "allowed: "
            f"pass --allow-special '{token}' to encode it as its id {tok.special_tokens[token]}, or --special-as-text "
            "to encode it as ordinary text"
        )


def cmd_tokenizer_inspect(args) -> int:
    _numpy_with_one_blas_thread()
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
    _numpy_with_one_blas_thread()
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
