"""The LM stage's work over the artifact store: train on a tokens version, stage a model version.

The stage spec (`pipeline_lib.stages.lm.LM`) runs it through the engine, which versions,
claims and publishes like every stage:

* One producer per version: training and publishing run under `store.claim(model, id)`;
  concurrent runs of the same version wait and then find it published.
* Resumable: training checkpoints into `store.work_dir(model, id)`, a directory private to
  this store and this version, so a run that dies half-way resumes from its last valid
  checkpoint when started again (and a run on another store never picks it up). The work
  dir is dropped once the version is published; temporary files go to the store's
  `scratch_dir`, where `gc` finds what a killed run left.
* Verified reads: the token shards through `store.local_dir` (every file's sha256 against
  the manifest) and `TokenShards` (the same, by default); the tokenizer likewise; the
  checkpoint being published against its own marker, and each staged file against it.
* Same id, same bytes: the published files (final weights as safetensors, the last full
  checkpoint with optimizer, RNG and data position, loss curve, metrics, history, samples,
  train config) hold only what the training decides. The weights are stored once:
  ``model.safetensors``, which ``checkpoint/``'s marker lists (it used to be there too,
  and a third time in the work dir's checkpoints, which are dropped once published). Timings, device, throughput and
  resume notes describe one run: they go to the log and to the manifest's ``meta["run"]``.
  The manifest is the per-publish record (it already carries its ``created`` time, so its
  hash was never the same across publishes); the version id and the files are not.
* Time budget (`LMConfig.minutes`, `TrainConfig.time_budget_s`): the id hashes the config,
  budget included, not the step count the budget buys on the machine that trains. That
  count is decided once, after a few measured steps (`pipeline_lib.lm.trainer.plan_steps`),
  and recorded in the work dir (``plan.json``) and in every later checkpoint, so a run
  resumed after a crash finishes the same plan and publishes the bytes the uninterrupted
  run would have. Within a store an id is published once, so it names one set of bytes.
  Across stores, same id and same bytes hold when the budget does not bind (the plan is
  then max_steps) or with ``minutes=None``; a budget that binds on machines of different
  speed can publish different step counts under one id, and ``metrics.json`` (``steps``,
  ``planned_steps``, ``planned_by_time_budget``) says which.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pipeline_lib.errors import CheckpointError
from pipeline_lib.fsio import InputError
from pipeline_lib.stages import load_tokenizer
from pipeline_lib.store import ArtifactStore, FileInfo, Staging, VersionRef, split_key

if TYPE_CHECKING:
    from pathlib import Path

    from pipeline_lib.lm.checkpoint import Checkpoint
    from pipeline_lib.tokenizer import Tokenizer

MODEL_KIND = "model"
WEIGHTS_FILE = "model.safetensors"
_log = logging.getLogger("tokenmill.lm")


def train_and_stage(
    store: ArtifactStore,
    staging: Staging,
    tokens: VersionRef,
    tokenizer: VersionRef,
    train_config,
    *,
    log: Callable[[str], None] | None,
    on_eval: Callable[[dict[str, Any]], None] | None,
    on_step: Callable[[dict[str, Any]], None] | None,
    n_samples: int,
    sample_tokens: int,
) -> tuple[dict[str, FileInfo], dict[str, Any]]:
    """Train (or resume) a GPT on `tokens` and stage the model version's files into
    `staging`: (files, meta). The engine publishes them (`pipeline_lib.stages.lm`).

    Raises:
        InputError: tokens and tokenizer disagree on the vocabulary size.
        StoreError: an input file does not match its manifest.
    """
    from pipeline_lib.lm import train, write_loss_plot
    from pipeline_lib.lm.checkpoint import open_checkpoint
    from pipeline_lib.lm.report import run_metrics, versioned_metrics
    from pipeline_lib.lm.trainer import versioned_history

    def say(msg: str) -> None:  # every phase after training gets a line: none is silent
        _log.info(msg)
        if log is not None:
            log(msg)

    tok = load_tokenizer(store, tokenizer)
    tmeta = store.manifest(tokens.kind, tokens.version)["meta"]
    if tmeta["vocab_size"] != tok.vocab_size:
        raise InputError(
            f"{tokens.key} was encoded with {tmeta['vocab_size']} ids but {tokenizer.key} has {tok.vocab_size}"
        )
    data_dir = store.local_dir(tokens.kind, tokens.version)  # every shard checked against the manifest
    workdir = store.work_dir(MODEL_KIND, staging.version)
    result = train(
        train_config,
        data_dir,
        workdir,
        token_byte_lengths=tok.token_byte_lengths(),
        log=log,
        on_eval=on_eval,
        on_step=on_step,
        resume=True,
    )
    if result.checkpoint_dir is None:
        raise RuntimeError(f"training wrote no checkpoint into {workdir}")

    outdir = tempfile.mkdtemp(prefix="model-", dir=store.scratch_dir(MODEL_KIND))
    try:
        t0 = time.monotonic()
        say(f"staging checkpoint {os.path.basename(result.checkpoint_dir)} and weights")
        ckpt = open_checkpoint(result.checkpoint_dir)  # sizes and sha256 against its marker
        files = _stage_checkpoint(staging, ckpt)

        t1 = time.monotonic()
        say(f"staged in {t1 - t0:.1f} s; sampling {n_samples} x up to {sample_tokens} tokens")
        samples = _samples(ckpt.path, tok, tmeta.get("separator"), n_samples, sample_tokens, train_config.seed)
        t2 = time.monotonic()
        say(f"sampled {n_samples * sample_tokens} tokens in {t2 - t1:.1f} s; drawing the loss plot")
        plot = os.path.join(outdir, "loss.png")
        write_loss_plot(result.history, plot)
        files["loss.png"] = staging.put_file("loss.png", plot)
        say(f"loss plot in {time.monotonic() - t2:.1f} s; writing metrics and publishing")
        summary = versioned_metrics(result)
        files |= _stage_json(
            staging,
            {
                "metrics.json": summary,
                "history.json": versioned_history(result.history),
                "samples.json": samples,
                "train_config.json": train_config.versioned_dict(),
            },
        )
    finally:
        shutil.rmtree(outdir, ignore_errors=True)
    run = run_metrics(result)
    run.pop("checkpoint_dir", None)  # a work path that is gone once published
    meta = {"metrics": summary, "samples": samples, "n_params": result.n_params, "run": run}
    return files, meta


def _stage_checkpoint(staging: Staging, ckpt: Checkpoint) -> dict[str, FileInfo]:
    """Stage the verified checkpoint `ckpt`: each file checked against its marker again as
    it is staged (it may have changed since it was verified)."""
    from pipeline_lib.lm.checkpoint import MARKER

    files: dict[str, FileInfo] = {}
    # The weights once per version: model.safetensors beside checkpoint/, whose marker lists
    # them (put them back into the folder to resume from it); the rest of the training
    # state (optimizer, RNG, data order) only in checkpoint/.
    for name in sorted([*ckpt.marker["files"], MARKER]):
        if name == WEIGHTS_FILE:
            continue
        info = staging.put_file(f"checkpoint/{name}", os.path.join(ckpt.path, name))
        want = ckpt.marker["files"].get(name)
        if want is not None and info.sha256 != want["sha256"]:  # changed since it was checked
            raise CheckpointError(f"{ckpt.path / name}: sha256 changed while it was being published")
        files[f"checkpoint/{name}"] = info
    files[WEIGHTS_FILE] = staging.put_file(WEIGHTS_FILE, os.path.join(ckpt.path, WEIGHTS_FILE))
    if files[WEIGHTS_FILE].sha256 != ckpt.marker["files"][WEIGHTS_FILE]["sha256"]:
        raise CheckpointError(f"{ckpt.path / WEIGHTS_FILE}: sha256 changed while it was being published")
    return files


def _samples(
    ckpt_dir: Path, tok: Tokenizer, sep: dict[str, Any] | None, n_samples: int, sample_tokens: int, seed: int
) -> list[str]:
    """`n_samples` texts of up to `sample_tokens` tokens from the checkpoint's weights, each
    started at the document separator (else a newline)."""
    from pipeline_lib.lm import load_model, sample
    from pipeline_lib.lm.sampling import documents_text

    model = load_model(ckpt_dir, verify=False)  # checked by open_checkpoint in train_and_stage
    prompt = [sep["id"]] if sep else list(tok.encode_ordinary("\n"))
    samples = []
    for i in range(n_samples):
        ids = sample(model, prompt, sample_tokens, temperature=0.8, top_k=50, seed=seed + i)
        samples.append(documents_text(tok, ids, sep["id"] if sep else None))
    return samples


def _stage_json(staging: Staging, docs: dict[str, Any]) -> dict[str, FileInfo]:
    """Stage each of `docs` as a JSON file of that name."""
    files = {}
    for name, obj in docs.items():
        # sorted keys: a history restored from a checkpoint (sorted JSON) reads back the same
        data = json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False, default=str).encode()
        files[name] = staging.put_bytes(name, data)
    return files


def after_publish(store: ArtifactStore, ref: VersionRef, log: Callable[[str], None] | None = None) -> None:
    """Drop the published version's work dir (its checkpoints) and log what was published."""
    store.drop_work_dir(ref.kind, ref.version)
    meta = store.manifest(ref.kind, ref.version)["meta"]
    run = meta["run"]
    tps, mfu = run.get("tokens_per_s"), run.get("mfu")
    line = (
        f"published {ref.kind}/{ref.version}: {meta['metrics'].get('steps')} steps on {run.get('device')}"
        + (f", {tps:,.0f} tokens/s" if tps else "")
        + (f", MFU {mfu:.1%}" if mfu else "")
    )
    _log.info(line)
    if log is not None:
        log(line)


def load_published_model(store: ArtifactStore, model: VersionRef | str, device: str = "cpu"):
    """A published model's GPT (eval mode), its weights checked against the version manifest.

    `model` is a VersionRef or a model version id. The file is fetched with
    `store.local_file`, which hashes it (once per process while it is unchanged) and
    raises `StoreError` naming the file on any mismatch, so a damaged file never gets as
    far as producing nan logits. (`pipeline_lib.lm.load_model` on a bare path loads a
    user's own file unchecked.)

    >>> gpt = load_published_model(store, "3f2a...")   # doctest: +SKIP
    """
    from pipeline_lib.lm import load_model

    kind, version = (model.kind, model.version) if isinstance(model, VersionRef) else (MODEL_KIND, model)
    return load_model(store.local_file(kind, version, WEIGHTS_FILE), device=device)


def sample_text(store: ArtifactStore, model: VersionRef | str, config=None, device: str = "auto") -> str:
    """The prompt and its continuation by a published model (`tokenmill lm sample`).

    `config` is a `pipeline_lib.config.SampleConfig` (None: its defaults); `device` as
    `TrainConfig.device` (auto: CUDA, else MPS, else CPU). The weights are
    checked against the version manifest (`load_published_model`); the prompt is encoded
    with the model's tokenizer, and an empty one starts a fresh document from the
    separator the model was trained with. The model writes document after document: each
    separator it emits is a line break in the text (`documents_text`).
    """
    from pipeline_lib.config import SampleConfig
    from pipeline_lib.lm import sample
    from pipeline_lib.lm.sampling import documents_text
    from pipeline_lib.lm.trainer import resolve_device

    cfg = config if config is not None else SampleConfig()
    try:
        where = resolve_device(device)
    except (RuntimeError, ValueError) as e:  # cuda asked for where there is none, or a bad name
        raise InputError(f"--device {device}: {e}; choose auto, cpu, cuda, cuda:N or mps") from e
    version = model.version if isinstance(model, VersionRef) else model
    parents = store.manifest(MODEL_KIND, version)["parents"]
    tok = load_tokenizer(store, store.ref(*split_key(parents["tokenizer"])))
    sep = tok.special_tokens.get("<|endoftext|>")
    if "tokens" in parents:
        tsep = store.manifest(*split_key(parents["tokens"]))["meta"].get("separator")
        sep = tsep["id"] if tsep else sep
    gpt = load_published_model(store, version, device=str(where))
    prompt = [int(i) for i in tok.encode_ordinary(cfg.prompt)] if cfg.prompt else [sep if sep is not None else 10]
    ids = sample(gpt, prompt, cfg.max_new_tokens, temperature=cfg.temperature, top_k=cfg.top_k, seed=cfg.seed)
    return cfg.prompt + documents_text(tok, ids, sep)
