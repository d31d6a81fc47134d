"""The wheel's runtime dependencies are exactly the distributions leasework/ imports: nothing
the harness, the stack or the tools use, and nothing the product imports left undeclared
(but an extra's, `leasework[sqlalchemy]`, imported only by the door that needs it, and, for
`leasework[django]`, by its own package too)."""

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
    return set().union(*(imported_modules_of(path) for path in folder.rglob("*.py")))


def _names(specs: list[str]) -> set[str]:
    return {
        re.split(r"[\[<>=!~ ]", spec, maxsplit=1)[0].lower().replace("_", "-") for spec in specs
    }


def declared() -> set[str]:
    return _names(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"])


def extras() -> dict[str, set[str]]:
    """The user-facing extras (the doors' layers), not the developers' ``dev``/``docker``."""
    optional = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    users = {name: specs for name, specs in optional.items() if name not in ("dev", "docker")}
    return {name: _names(specs) for name, specs in users.items()}


def test_runtime_dependencies_are_what_the_product_imports():
    tops = {name.split(".")[0] for name in imported_modules(PRODUCT)}
    third_party = tops - set(sys.stdlib_module_names) - {"leasework"}
    by_module = importlib.metadata.packages_distributions()
    imported = {
        dist.lower().replace("_", "-") for top in third_party for dist in by_module.get(top, [top])
    }
    optional = set().union(*extras().values())
    assert declared() <= imported <= declared() | optional


def test_an_extras_distribution_is_imported_only_by_its_door():
    for extra, dists in extras().items():
        for path in PRODUCT.rglob("*.py"):
            tops = {name.split(".")[0] for name in imported_modules_of(path)}
            if tops & dists:
                door, package = PRODUCT / "doors" / f"{extra}.py", PRODUCT / extra
                assert path == door or package in path.parents, (path, extra)


def imported_modules_of(path: pathlib.Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


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
