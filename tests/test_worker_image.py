"""The worker image (Dockerfile) without a Docker engine: its install commands are the
README's, its recipe's `tokenmill deploy` flags exist, its flow runs send the zombie
automation's heartbeat, and the build context leaves out the local environment."""

from __future__ import annotations

import argparse
import re
import shlex
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = (ROOT / "Dockerfile").read_text()


def _pip_installs(text: str) -> list[list[str]]:
    """The arguments of every `pip install` in `text`, options dropped."""
    out = []
    for match in re.finditer(r"pip install ([^&\\\n`]+)", text):
        out.append([a for a in shlex.split(match.group(1)) if not a.startswith("-")])
    return out


def test_install_commands_are_the_readmes():
    readme = _pip_installs((ROOT / "README.md").read_text().split("```bash", 1)[1].split("```", 1)[0])
    image = _pip_installs(DOCKERFILE.split("\nFROM ", 1)[1])  # the RUN lines, not the recipe in the header
    assert readme[0] == image[0] == ["torch==2.13.0"]  # the same torch, first, so pip never fetches another
    package = image[1][0]
    assert readme[1] == ["."] and package.startswith(".[")  # the package itself, not editable: the source is removed
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    assert set(package[2:-1].split(",")) <= extras
    assert "prefect-docker" in image[1]


def test_recipe_flags_exist_and_heartbeat_matches():
    from deployments.automations import HEARTBEAT_ENV, HEARTBEAT_S
    from deployments.deploy import add_arguments
    from deployments.steps import PREINSTALLED

    recipe = next(line for line in DOCKERFILE.splitlines() if "tokenmill deploy" in line).split("tokenmill deploy", 1)[
        1
    ]
    args = add_arguments(argparse.ArgumentParser()).parse_args(
        shlex.split(recipe.replace("$(git rev-parse --short HEAD)", "abc123"))
    )
    assert (
        args.install_command == PREINSTALLED
        and args.image == "tokenmill-worker:abc123"
        and args.pool == "tokenmill-docker"
    )
    assert f"ENV {HEARTBEAT_ENV}={HEARTBEAT_S}" in DOCKERFILE


def test_build_context_leaves_out_the_local_environment():
    ignored = set((ROOT / ".dockerignore").read_text().split())
    assert {".venv", "build", "artifacts", ".git"} <= ignored
