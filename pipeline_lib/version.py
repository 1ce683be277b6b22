"""Package version, and the code part of every version id: the stage's output version.

A version id hashes its kind, its parents' ids, its params and a code string
(`store.version_id`). The code string is `output_code(n)`: the stage's declared output
version `n` (beside its spec, ``Stage.output_version``) and the store's `FORMAT_VERSION`.
Nothing else: no source file, no compiled core, no package release enters an id, so a
comment, a refactor or a rebuild keeps every id; a change of a stage's output bytes is a
bump of its output version, which the golden-output tests (`tests/test_golden.py`)
demand.
"""

from __future__ import annotations

from importlib import metadata

try:
    __version__ = metadata.version("tokenmill")
except metadata.PackageNotFoundError:  # running from a source tree
    __version__ = "0.0.0+src"

# The layout every stage's output shares (manifest fields, file naming); a bump changes
# every id at once.
FORMAT_VERSION = 1


def output_code(output_version: int) -> str:
    """The code part of a version id for a stage whose output version is `output_version`."""
    if isinstance(output_version, bool) or not isinstance(output_version, int) or output_version < 1:
        raise ValueError(f"output version {output_version!r}: give an integer >= 1")
    return f"format{FORMAT_VERSION}.output{output_version}"
