"""What the `tokenmill` commands share: storage options, the store and REF resolution,
tokenizer loading, the Prefect API and task runner of the flows they run, progress bars and
the run summary."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

from pipeline_lib.errors import InputError

if TYPE_CHECKING:
    from rich.progress import TaskID

DEFAULT_STORE = "./artifacts"


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
        raise InputError(
            f"--tokenizer {ref}: not a saved tokenizer directory (no {META_FILE} there); give one, or a "
            "REF in the store (latest:tokenizer)"
        )
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
    notes = {
        "bytes_per_token": "(byte level: 1.0)",
        "chars_per_token": "(character level: 1.0)",
        "val_bpb": "(bits per byte)",
    }
    for k, v in summary["figures"].items():
        shown = f"{v:.4f}" if isinstance(v, float) else v
        print(f"  {k:<16} {shown} {notes.get(k, '')}".rstrip())
    if summary.get("sample"):
        print("== sample ==")
        print(summary["sample"])


class _ProgressBars:
    """Rich progress bars fed by the tasks running in this process."""

    def __init__(self):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.bars = Progress(
            TextColumn("{task.description:<22}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            transient=False,
        )
        self.ids: dict[str, TaskID] = {}

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


def _read_text(path: str, flag: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as f:
            return f.read()
    except FileNotFoundError:
        raise InputError(f"{flag} {path}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{flag} {path}: is a directory, not a text file") from None


def _check_out_outside_store(store, out: str) -> None:
    """Exports never go where gc and verify look: refuse an --out inside the store."""
    if store.contains_local_path(out):
        raise InputError(
            f"--out {out} is inside the store {store.url}: the store keeps only what it writes; choose "
            "an --out outside it"
        )
