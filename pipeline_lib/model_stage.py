"""The LM stage over the artifact store: train on a tokens version, publish a model version.

Training checkpoints into a work directory tied to the output version id, so a run that
dies half-way resumes from its last complete checkpoint when started again. The published
version holds the final weights (safetensors), the last full checkpoint (optimizer, RNG,
data position), the loss curve, metrics, history and generated samples.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

from pipeline_lib.fsio import InputError
from pipeline_lib.stages import load_tokenizer
from pipeline_lib.store import ArtifactStore, FileInfo, VersionRef, version_id
from pipeline_lib.version import code_version

MODEL_KIND = "model"
LM_MODULES = (
    "pipeline_lib.lm.model", "pipeline_lib.lm.train", "pipeline_lib.lm.data",
    "pipeline_lib.lm.config", "pipeline_lib.lm.checkpoint", "pipeline_lib.model_stage",
)
# Fields that change how fast a run goes but not what it computes.
_NOT_IN_VERSION = ("device", "resume", "verify_shards", "compile", "peak_flops")


def model_version(tokens: VersionRef, tokenizer: VersionRef, train_config) -> str:
    params = {k: v for k, v in train_config.to_dict().items() if k not in _NOT_IN_VERSION}
    return version_id(MODEL_KIND, {"tokens": tokens.key, "tokenizer": tokenizer.key}, params, code_version(*LM_MODULES))


def train_language_model(
    store: ArtifactStore,
    tokens: VersionRef,
    tokenizer: VersionRef,
    train_config,
    *,
    log: Callable[[str], None] | None = None,
    on_eval: Callable[[dict[str, Any]], None] | None = None,
    on_step: Callable[[dict[str, Any]], None] | None = None,
    n_samples: int = 2,
    sample_tokens: int = 160,
) -> VersionRef:
    """Train (or resume) a GPT on `tokens` and publish it as a `model` version."""
    from pipeline_lib.lm import load_model, metrics, sample, train, write_loss_plot

    version = model_version(tokens, tokenizer, train_config)
    if store.exists(MODEL_KIND, version):
        return store.ref(MODEL_KIND, version)
    tok = load_tokenizer(store, tokenizer)
    tmeta = store.manifest(tokens.kind, tokens.version)["meta"]
    if tmeta["vocab_size"] != tok.vocab_size:
        raise InputError(f"{tokens.key} was encoded with {tmeta['vocab_size']} ids but {tokenizer.key} has {tok.vocab_size}")
    staging = store.stage(MODEL_KIND, version)
    if store.local:
        workdir = staging.local_path("run")
    else:
        workdir = os.path.join(tempfile.gettempdir(), "tokenmill-work", MODEL_KIND, version)
    data_dir = store.local_dir(tokens.kind, tokens.version)
    result = train(
        train_config, data_dir, workdir, token_byte_lengths=tok.token_byte_lengths(),
        log=log, on_eval=on_eval, on_step=on_step, resume=True,
    )
    if result.checkpoint_dir is None:
        raise RuntimeError(f"training wrote no checkpoint into {workdir}")

    outdir = tempfile.mkdtemp(prefix="tokenmill-model-")
    try:
        files: dict[str, FileInfo] = {}
        ckpt = result.checkpoint_dir
        for name in sorted(os.listdir(ckpt)):
            files[f"checkpoint/{name}"] = staging.put_file(f"checkpoint/{name}", os.path.join(ckpt, name))
        files["model.safetensors"] = staging.put_file("model.safetensors", os.path.join(ckpt, "model.safetensors"))

        model = load_model(ckpt)
        sep = tmeta.get("separator")
        prompt = [sep["id"]] if sep else list(tok.encode_ordinary("\n"))
        samples = []
        for i in range(n_samples):
            ids = sample(model, prompt, sample_tokens, temperature=0.8, top_k=50, seed=train_config.seed + i)
            if sep and sep["id"] in ids:
                ids = ids[: ids.index(sep["id"])]
            samples.append(tok.decode(ids))
        plot = os.path.join(outdir, "loss.png")
        write_loss_plot(result.history, plot)
        files["loss.png"] = staging.put_file("loss.png", plot)
        summary = metrics(result)
        summary.pop("checkpoint_dir", None)  # a work path that is gone once published
        docs = {
            "metrics.json": summary,
            "history.json": result.history,
            "samples.json": samples,
            "train_config.json": train_config.to_dict(),
        }
        for name, obj in docs.items():
            files[name] = staging.put_bytes(name, json.dumps(obj, indent=2, ensure_ascii=False, default=str).encode())
    finally:
        shutil.rmtree(outdir, ignore_errors=True)
    shutil.rmtree(workdir, ignore_errors=True)
    meta = {"metrics": summary, "samples": samples, "n_params": result.n_params, "device": result.device}
    params = {k: v for k, v in train_config.to_dict().items() if k not in _NOT_IN_VERSION}
    return store.publish(
        staging, files=files, parents={"tokens": tokens, "tokenizer": tokenizer}, params=params,
        code_version=code_version(*LM_MODULES), meta=meta,
    )
