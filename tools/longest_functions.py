"""The longest functions of a tree, by lines from ``def`` to its last line:
``python -m tools.longest_functions [FOLDER] [--top N] [--over LINES]`` (default: leasework,
the 15 longest, and how many are over 80 lines)."""

from __future__ import annotations

import argparse
import ast
from pathlib import Path


def function_lengths(folder: Path) -> list[tuple[int, str]]:
    """(lines, "path:line name") of every function and method below ``folder``, longest first."""
    rows = []
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                rows.append((length, f"{path}:{node.lineno} {node.name}"))
    return sorted(rows, reverse=True)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.longest_functions")
    parser.add_argument("folder", nargs="?", default="leasework", type=Path)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--over", type=int, default=80)
    args = parser.parse_args()
    rows = function_lengths(args.folder)
    for length, where in rows[: args.top]:
        print(f"{length:4d} {where}")
    print(f"functions over {args.over} lines: {sum(1 for n, _ in rows if n > args.over)}")


if __name__ == "__main__":
    main()
