"""Checkpoints: crash-safe directories of safetensors + JSON, no pickle.

Layout of ``out_dir``::

    ckpt_000500/
        model.safetensors        weights (tied lm_head stored once), GPTConfig in metadata
        optimizer.safetensors    optimizer state tensors ("state.<param idx>.<name>")
        optimizer.json           optimizer param_groups and non-tensor state
        trainer_state.json       step, configs, lr, history, data identity
        rng_state.safetensors    torch CPU / CUDA generator states, per rank
        rng_state.json           per rank: Python `random` state (None: training draws none)
        data_state.json          data position: step + numpy sampler state per rank
        checkpoint.json          completion marker, written LAST: sizes + sha256 of the above

A checkpoint is written into a temporary sibling directory, each file fsync'd, the marker
last, and then `os.replace`d to ``ckpt_<step>``; only after that are old checkpoints
pruned to the newest `keep_last`, so a crash at any point leaves the previous complete
checkpoint untouched. Discovery (`latest_checkpoint`) ignores directories without a
valid marker; loading verifies every file's size and sha256 and names the bad file.
`quarantine_checkpoint` moves a corrupt one aside (``.corrupt-ckpt_<step>-*``, kept for
inspection) so that discovery and pruning no longer count it.

Every file is a function of the training state only (no timings, no paths, safetensors
headers in canonical key order: `safetensors_bytes`), so the same training gives the
same bytes in any process; the model stage publishes the last checkpoint as part of a
content-addressed version and relies on that.

What is verified: a checkpoint directory against its own ``checkpoint.json``. A bare
``model.safetensors`` path given to `load_model` is a user's own file and is loaded as
it is; a published model is loaded through the store, which checks it against the
version manifest (`pipeline_lib.model_stage.load_published_model`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from pipeline_lib.errors import CheckpointError  # re-exported
from pipeline_lib.fsio import hash_file
from pipeline_lib.lm.config import ModelConfig, model_config_from_dict
from pipeline_lib.lm.model import LanguageModel, build_model

CHECKPOINT_FORMAT = "tokenmill.lm-checkpoint/1"
WEIGHTS_FORMAT = "tokenmill.gpt/1"
MARKER = "checkpoint.json"
_CKPT_RE = re.compile(r"^ckpt_(\d+)$")
_LEFTOVER_RE = re.compile(r"^\.(?:tmp|old)-ckpt_(\d+)-")
_MAX_HEADER = 100_000_000
_TIED_KEYS = ("lm_head.weight",)  # == transformer.wte.weight


# -- discovery ---------------------------------------------------------------------------


def _read_marker(ckpt_dir: Path) -> dict[str, Any]:
    mpath = ckpt_dir / MARKER
    try:
        marker = json.loads(mpath.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{mpath}: missing — the checkpoint is incomplete") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{mpath}: not valid JSON ({e}) — the checkpoint is corrupt") from e
    if not isinstance(marker, dict) or marker.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{mpath}: not a {CHECKPOINT_FORMAT} marker")
    if not isinstance(marker.get("files"), dict) or not isinstance(marker.get("step"), int):
        raise CheckpointError(f"{mpath}: malformed marker (needs 'step' and 'files')")
    return marker


def list_checkpoints(out_dir: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """Complete checkpoints in out_dir as (step, path), oldest first."""
    out = Path(out_dir)
    if not out.is_dir():
        return []
    found = []
    for p in out.iterdir():
        m = _CKPT_RE.match(p.name)
        if not m or not p.is_dir():
            continue
        try:
            marker = _read_marker(p)
        except CheckpointError:
            continue  # incomplete or corrupt marker: not a checkpoint
        if marker["step"] != int(m.group(1)):
            continue
        found.append((int(m.group(1)), p))
    return sorted(found)


def latest_checkpoint(out_dir: str | os.PathLike[str]) -> Path | None:
    ckpts = list_checkpoints(out_dir)
    return ckpts[-1][1] if ckpts else None


# -- writing -----------------------------------------------------------------------------


def _json_bytes(obj: Any) -> bytes:
    return (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode()


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def model_state_tensors(model: LanguageModel, to_cpu: bool = True) -> dict[str, torch.Tensor]:
    """The model's state dict for safetensors: tied weights once, contiguous, on CPU
    (`to_cpu` False: where they are, for a caller that copies them itself)."""
    return {
        k: (v.detach().contiguous().cpu() if to_cpu else v.detach())
        for k, v in model.state_dict().items()
        if k not in _TIED_KEYS
    }


def safetensors_bytes(tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> bytes:
    """`safetensors.torch.save` with a canonical header: same tensors, same bytes.

    safetensors serialises ``__metadata__`` from a Rust hash map, so its key order (and
    with it the file's sha256) changes from one call to the next, even in one process.
    The header JSON is re-emitted with sorted keys and no spaces, padded with spaces to a
    multiple of 8 bytes as safetensors does; the data section (tensors ordered by dtype
    alignment, then name, by safetensors itself) and its offsets are unchanged.
    """
    blob = st_save(tensors, metadata=metadata)
    n = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8 : 8 + n])
    text = json.dumps(header, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text + blob[8 + n :]


def weights_bytes(model: LanguageModel) -> bytes:
    return weights_file_bytes(model_state_tensors(model), model.config)


def weights_file_bytes(tensors: dict[str, torch.Tensor], config: ModelConfig) -> bytes:
    """model.safetensors from CPU tensors (`model_state_tensors`) and the model's config."""
    meta = {"format": WEIGHTS_FORMAT, "gpt_config": json.dumps(config.to_dict(), sort_keys=True)}
    return safetensors_bytes(tensors, metadata=meta)


def optimizer_snapshot(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], bytes]:
    """The optimizer's state tensors (where they are, detached) and optimizer.json."""
    sd = optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, Any] = {}
    for idx, st in sd["state"].items():
        for k, v in st.items():
            if torch.is_tensor(v):
                tensors[f"state.{idx}.{k}"] = v.detach()
            else:
                scalars[f"{idx}.{k}"] = v
    meta = {"type": type(optimizer).__name__, "param_groups": sd["param_groups"], "scalars": scalars}
    return tensors, _json_bytes(meta)


def optimizer_files(optimizer: torch.optim.Optimizer) -> tuple[bytes, bytes]:
    """(optimizer.safetensors, optimizer.json) contents."""
    tensors, meta = optimizer_snapshot(optimizer)
    return safetensors_bytes({k: v.contiguous().cpu() for k, v in tensors.items()}), meta


def write_checkpoint(
    out_dir: str | os.PathLike[str],
    step: int,
    files: dict[str, bytes],
    keep_last: int,
) -> Path:
    """Write `files` (name -> contents) as ckpt_<step> crash-safely, then prune to keep_last."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    final = out / f"ckpt_{step:06d}"
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-ckpt_{step:06d}-", dir=out))
    try:
        listing = {}
        for name, data in files.items():
            if name == MARKER:
                raise ValueError(f"{MARKER} is reserved")
            with open(tmp / name, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            listing[name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        marker = {"format": CHECKPOINT_FORMAT, "step": step, "files": listing}
        with open(tmp / MARKER, "wb") as f:  # completion marker, last
            f.write(_json_bytes(marker))
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(tmp)
        if final.exists():  # a leftover (incomplete) directory of the same step: move it aside
            trash = Path(tempfile.mkdtemp(prefix=f".old-ckpt_{step:06d}-", dir=out))
            os.replace(final, trash / final.name)
            os.replace(tmp, final)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.replace(tmp, final)
        _fsync_dir(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for _, old in list_checkpoints(out)[:-keep_last]:
        if old != final:
            shutil.rmtree(old, ignore_errors=True)
    for p in out.iterdir():  # leftovers of saves that crashed at or before this step
        m = _LEFTOVER_RE.match(p.name)
        if m and int(m.group(1)) <= step and p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
    return final


def quarantine_checkpoint(ckpt_dir: str | os.PathLike[str]) -> Path:
    """Move a corrupt checkpoint aside to ``.corrupt-<name>-*`` in the same directory, out
    of sight of discovery and pruning but kept for inspection; returns where it went."""
    src = Path(ckpt_dir)
    dest = Path(tempfile.mkdtemp(prefix=f".corrupt-{src.name}-", dir=src.parent))
    os.replace(src, dest / src.name)
    _fsync_dir(src.parent)
    return dest / src.name


# -- reading -----------------------------------------------------------------------------


@dataclass
class Checkpoint:
    """A verified checkpoint directory; file contents are read on demand."""

    path: Path
    step: int
    marker: dict[str, Any]

    def file(self, name: str) -> Path:
        if name not in self.marker["files"]:
            raise CheckpointError(f"{self.path / MARKER}: does not list {name}")
        return self.path / name

    def json(self, name: str) -> Any:
        p = self.file(name)
        try:
            return json.loads(p.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError, OSError) as e:
            raise CheckpointError(f"{p}: cannot read JSON ({e})") from e

    def tensors(self, name: str) -> dict[str, torch.Tensor]:
        p = self.file(name)
        try:
            return st_load(p.read_bytes())
        except (SafetensorError, OSError, ValueError) as e:
            raise CheckpointError(f"{p}: cannot read safetensors ({e})") from e

    def model_config(self) -> ModelConfig:
        return read_weights_config(self.file("model.safetensors"))


def open_checkpoint(ckpt_dir: str | os.PathLike[str], verify: bool = True) -> Checkpoint:
    """Check the marker and every listed file (existence, size, and sha256 if verify)."""
    path = Path(ckpt_dir)
    if not path.is_dir():
        raise CheckpointError(f"{path}: checkpoint directory not found")
    marker = _read_marker(path)
    for name, info in marker["files"].items():
        p = path / name
        if not p.is_file():
            raise CheckpointError(f"{p}: missing from the checkpoint")
        size = p.stat().st_size
        if size != info.get("bytes"):
            raise CheckpointError(
                f"{p}: {size} bytes but the checkpoint marker says {info.get('bytes')} (truncated or corrupt)"
            )
        if verify:
            if hash_file(str(p))[1] != info.get("sha256"):
                raise CheckpointError(f"{p}: sha256 mismatch with the checkpoint marker (corrupt)")
    return Checkpoint(path=path, step=int(marker["step"]), marker=marker)


def _config_from_header(header: Any) -> ModelConfig:
    meta = (header.get("__metadata__") if isinstance(header, dict) else None) or {}
    if meta.get("format") != WEIGHTS_FORMAT:
        raise ValueError(f"metadata format is {meta.get('format')!r}, expected {WEIGHTS_FORMAT!r}")
    return model_config_from_dict(json.loads(meta["gpt_config"]))  # the key predates the MLP


def read_weights_config(path: str | os.PathLike[str]) -> ModelConfig:
    """The model config stored in a weights file's safetensors metadata (header only)."""
    p = Path(path)
    try:
        with open(p, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if n <= 0 or n > _MAX_HEADER:
                raise ValueError(f"bad header length {n}")
            return _config_from_header(json.loads(f.read(n)))
    except FileNotFoundError:
        raise CheckpointError(f"{p}: file not found") from None
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError, OSError) as e:
        raise CheckpointError(f"{p}: not a {WEIGHTS_FORMAT} safetensors file ({e})") from e


def load_state_into(model: LanguageModel, state: dict[str, torch.Tensor], label: str | os.PathLike[str]) -> None:
    """Copy a weights dict (as `model_state_tensors` gives) into `model`; `label` names the
    source in errors."""
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as e:  # shape mismatch
        raise CheckpointError(f"{label}: weights do not fit the model ({e})") from e
    missing = [k for k in missing if k not in _TIED_KEYS]
    if missing or unexpected:
        raise CheckpointError(f"{label}: weights do not fit the model (missing {missing}, unexpected {unexpected})")


def load_weights_into(model: LanguageModel, path: str | os.PathLike[str]) -> None:
    """Load a weights file into `model`. The file is not checked against any manifest:
    open it through `open_checkpoint` or the store first when that matters."""
    p = Path(path)
    try:
        state = st_load(p.read_bytes())
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{p}: cannot read safetensors ({e})") from e
    load_state_into(model, state, p)


def load_optimizer_state(
    optimizer: torch.optim.Optimizer, meta: Any, tensors: dict[str, torch.Tensor], label: str | os.PathLike[str]
) -> None:
    """Load ``optimizer.json`` contents (`meta`) and ``optimizer.safetensors`` tensors into
    `optimizer`; `label` names the source in errors."""
    try:
        if meta.get("type") != type(optimizer).__name__:
            raise CheckpointError(f"{label}: optimizer is {meta.get('type')}, not {type(optimizer).__name__}")
        state: dict[int, dict[str, Any]] = {}
        for key, t in tensors.items():
            _, idx, name = key.split(".", 2)
            state.setdefault(int(idx), {})[name] = t
        for key, v in meta.get("scalars", {}).items():
            idx, name = key.split(".", 1)
            state.setdefault(int(idx), {})[name] = v
        groups = meta["param_groups"]
        for g in groups:
            if "betas" in g:
                g["betas"] = tuple(g["betas"])
        optimizer.load_state_dict({"state": state, "param_groups": groups})
    except CheckpointError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise CheckpointError(f"{label}: does not fit the optimizer ({type(e).__name__}: {e})") from e


def load_optimizer_into(optimizer: torch.optim.Optimizer, ckpt: Checkpoint) -> None:
    load_optimizer_state(
        optimizer, ckpt.json("optimizer.json"), ckpt.tensors("optimizer.safetensors"), ckpt.file("optimizer.json")
    )


def load_model(path: str | os.PathLike[str], device: str | torch.device = "cpu", verify: bool = True) -> LanguageModel:
    """A model (GPT or MLP) in eval mode from a checkpoint dir, an out_dir (its latest complete checkpoint)
    or a model.safetensors file.

    A checkpoint directory is checked against its ``checkpoint.json`` (sizes, and sha256
    with `verify`). A bare ``.safetensors`` file is a user's own file: it is loaded as it is,
    with no hash to check it against. For a model published in a store use
    `pipeline_lib.model_stage.load_published_model(store, version)`, which checks the file
    against the version manifest first (a flipped byte raises `StoreError` naming it).

    Raises:
        CheckpointError: missing, incomplete or corrupt checkpoint, or weights that do not
            fit the stored model config.
    """
    p = Path(path)
    if p.is_dir():
        if not (p / MARKER).exists() and _CKPT_RE.match(p.name) is None:
            latest = latest_checkpoint(p)
            if latest is None:
                raise CheckpointError(f"{p}: no complete checkpoint (ckpt_*/{MARKER}) found")
            p = latest
        ckpt = open_checkpoint(p, verify=verify)
        weights = ckpt.file("model.safetensors")
    else:
        weights = p
    model = build_model(read_weights_config(weights))
    load_weights_into(model, weights)
    return model.to(device).eval()
