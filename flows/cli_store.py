"""The `tokenmill` commands on a store and the local server: versions, show, verify, rm, gc,
server, export-nanogpt and export-llmc."""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
from typing import Any

from flows.cli_common import _check_out_outside_store, _resolve, _store
from flows.failures import ENV_LOG_DIR, EXIT_FAILURE, _log_dir
from pipeline_lib.errors import InputError

# The kinds tokenmill's stages publish (pipeline_lib's *_KIND constants, spelled here so
# that `versions` needs none of their modules).
PIPELINE_KINDS = ("raw", "corpus", "counts", "tokenizer", "tokens", "model", "report", "sweep")


def cmd_versions(args) -> int:
    store = _store(args)
    if args.kind is not None and args.kind not in PIPELINE_KINDS:
        in_store = sorted({m["kind"] for m in store.list()} - set(PIPELINE_KINDS))
        if args.kind not in in_store:
            raise InputError(
                f"--kind {args.kind}: not a kind of version; choose one of {', '.join([*PIPELINE_KINDS, *in_store])}"
            )
    rows = store.list(args.kind)
    if not rows:
        print(f"no versions in {store.url}")
        return 0
    from pipeline_lib.store import split_key

    print(f"{'kind':<10} {'version':<21} {'created':<26} parents / key figures")
    for m in rows:
        parents = ",".join(f"{k}={split_key(v)[1][:8]}" for k, v in m["parents"].items())
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
        print(
            f"tokenmill: error: {faults} version(s) in {store.url} failed verification (listed above)", file=sys.stderr
        )
        return EXIT_FAILURE
    return 0


def cmd_rm(args) -> int:
    store = _store(args)
    k, v = _resolve(store, args.ref)
    removed = store.remove_version(
        k, v, with_dependents=args.with_dependents, dry_run=args.dry_run, with_unused_parents=args.with_unused_parents
    )
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

        # a log directory of the user's own is theirs
        log_dir = None if os.environ.get(ENV_LOG_DIR) else Path(_log_dir())
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
    from flows.prefect_api import (
        DEFAULT_STARTUP_TIMEOUT_S,
        ENV_IDLE_TIMEOUT,
        ENV_STARTUP_TIMEOUT,
        LocalServer,
        read_float_env,
        server_dir,
    )

    local = LocalServer(server_dir())
    if args.action == "start":
        state = local.ensure(read_float_env(ENV_STARTUP_TIMEOUT, DEFAULT_STARTUP_TIMEOUT_S))
        warm.spawn(str(local.directory), state["pid"])
        print(f"tokenmill's local Prefect server: {state['api_url']} (pid {state['pid']}, files in {local.directory})")
    elif args.action == "stop":
        pid = local.stop()
        print(
            f"stopped tokenmill's local Prefect server (pid {pid})"
            if pid
            else f"no local Prefect server was running ({local.directory})"
        )
    else:
        status = local.status()
        if status is None:
            print(
                f"not running; tokenmill starts it in {local.directory} when a command runs flows without "
                "PREFECT_API_URL"
            )
        else:
            clients = local.live_clients()
            since = dt.datetime.fromtimestamp(status["started"])
            idle = float(status.get("idle_timeout_s") or 0)
            print(
                f"running: {status['api_url']} (pid {status['pid']}, since {since:%Y-%m-%d %H:%M:%S}, up "
                f"{_duration(dt.datetime.now() - since)})"
            )
            print(
                f"  idle time-out: {f'{idle / 60:g} min without a command' if idle > 0 else 'none'} "
                f"({ENV_IDLE_TIMEOUT})"
            )
            runner = warm.runner_pid(str(local.directory))
            if runner is None:
                print(f"  warm runner: none ({warm.ENV_WARM}=1 starts one)")
            else:
                runner_since = dt.datetime.fromtimestamp(
                    float(warm.read_info(str(local.directory)).get("started") or 0)
                )
                print(f"  warm runner: pid {runner}, since {runner_since:%Y-%m-%d %H:%M:%S}")
            print(
                f"  files:    {local.directory} (database {local.db_path.name}, log {local.log_path.name}, results "
                f"{local.storage_dir.name}/)"
            )
            print(f"  commands: {len(clients)} running" + (f" (pid {', '.join(map(str, clients))})" if clients else ""))
            print(
                f"  use it elsewhere: export PREFECT_API_URL={status['api_url']} PREFECT_API_AUTH_STRING=$(cat "
                f"{local.auth_path})"
            )
    return 0


def cmd_export_nanogpt(args) -> int:
    from pipeline_lib.stages import load_tokenizer
    from pipeline_lib.store import split_key
    from pipeline_lib.token_shards import export_nanogpt

    store = _store(args)
    _check_out_outside_store(store, args.out)
    k, v = _resolve(store, args.tokens, "tokens")
    meta = store.manifest(k, v)["meta"]
    # the tokens' tokenizer, "tokenizer/<id>"
    tok = load_tokenizer(store, store.ref(*split_key(meta["tokenizer"]["version"])))
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
        store.local_dir(k, v),
        store.manifest(k, v)["meta"],
        args.out,
        args.val_fraction,
        args.prefix,
        separator_placement=args.separator_placement,
    )
    print(
        f"{args.prefix}_train.bin: {written['train']:,} tokens, {args.prefix}_val.bin: {written['val']:,} tokens -> "
        f"{args.out}"
    )
    return 0
