"""The package list in pyproject.toml: a subpackage missing from it installs fine editable (CI) and is
missing from a wheel, so every folder with an __init__.py must be named there."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).parents[1]


def test_every_subpackage_is_listed_in_pyproject():
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    on_disk = set()
    for name, folder in setuptools["package-dir"].items():
        base = ROOT / folder
        for init in base.rglob("__init__.py"):
            parts = init.parent.relative_to(base).parts
            on_disk.add(".".join((name or "", *parts)).strip("."))
    assert on_disk - listed == set(), "add these to [tool.setuptools] packages"
    assert listed - on_disk == set(), "these are listed but have no __init__.py"
