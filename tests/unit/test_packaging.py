"""The wheel's runtime dependencies are exactly the distributions leasework/ imports: nothing
the harness, the stack or the tools use, and nothing the product imports left undeclared."""

import ast
import importlib.metadata
import pathlib
import re
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[2]
PRODUCT = ROOT / "leasework"
ROOMS = ("leasework.api", "leasework.worker", "leasework.relay")
OUTSIDE = ("chaos", "devstack", "tools", "examples")


def imported_modules(folder: pathlib.Path) -> set[str]:
    names = set()
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module)
    return names


def declared() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {
        re.split(r"[\[<>=!~ ]", spec, maxsplit=1)[0].lower().replace("_", "-")
        for spec in project["dependencies"]
    }


def test_runtime_dependencies_are_what_the_product_imports():
    tops = {name.split(".")[0] for name in imported_modules(PRODUCT)}
    third_party = tops - set(sys.stdlib_module_names) - {"leasework"}
    by_module = importlib.metadata.packages_distributions()
    imported = {
        dist.lower().replace("_", "-") for top in third_party for dist in by_module.get(top, [top])
    }
    assert imported == declared()


def test_nothing_outside_the_product_imports_a_private_room():
    offenders = {
        f"{folder}: {name}"
        for folder in OUTSIDE
        for name in imported_modules(ROOT / folder)
        if name.startswith(ROOMS)
    }
    assert offenders == set()


def test_the_wheel_ships_only_the_product():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["tool"]["setuptools"]["packages"]["find"]["include"] == ["leasework*"]
