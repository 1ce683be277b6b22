"""Check that splitting a module was a pure move: every top-level statement of the old module
(function, class, constant, module-level call) is in exactly one of the new modules with the
same AST (line numbers aside), and the new modules add nothing but imports (``if
TYPE_CHECKING:`` ones too), docstrings and ``__all__``. Exit status 1 and the differing
statements otherwise.

    python tools/pure_move.py HEAD:pipeline_lib/corpus.py pipeline_lib/corpus.py pipeline_lib/corpus_*.py

The old module is a path, or ``REV:path`` read from git.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path


def source(spec: str) -> str:
    if ":" in spec and not Path(spec).exists():
        return subprocess.run(["git", "show", spec], check=True, capture_output=True, text=True).stdout
    return Path(spec).read_text(encoding="utf-8")


def statements(spec: str) -> dict[str, list[str]]:
    """The module's top-level statements as AST dumps, each with the modules that hold it."""
    out: dict[str, list[str]] = {}
    nodes = list(ast.parse(source(spec), spec).body)
    while nodes:
        node = nodes.pop(0)
        if (
            isinstance(node, ast.If)
            and isinstance(node.test, ast.Name)
            and node.test.id == "TYPE_CHECKING"
            and not node.orelse
        ):
            nodes[:0] = node.body  # its imports are imports; anything else in it is compared
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            continue  # a docstring
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["__all__"]:
            continue
        out.setdefault(ast.dump(node, include_attributes=False), []).append(spec)
    return out


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    old = statements(argv[0])
    new: dict[str, list[str]] = {}
    for spec in argv[1:]:
        for dump, specs in statements(spec).items():
            new.setdefault(dump, []).extend(specs)
    problems = [f"changed or missing: {dump[:200]}" for dump in old if dump not in new]
    problems += [
        f"in {len(new[d])} modules {new[d]}: {d[:160]}" for d in old if len(new.get(d, [])) > 1 and len(old[d]) == 1
    ]
    problems += [f"new in {specs}: {dump[:200]}" for dump, specs in new.items() if dump not in old]
    print(f"{sum(map(len, old.values()))} statements of {argv[0]}, {len(argv) - 1} modules now")
    print("\n".join(problems) or "a pure move: every statement is unchanged, each in one module")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
