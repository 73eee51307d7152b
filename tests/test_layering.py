"""The dependency graph points one way: pate_accountant <- mechanisms <- ensembles (DESIGN.md)."""

import subprocess
import sys

import pytest

CHECK = """
import sys
import {module}
heavy = sorted(m for m in ('torch', 'transformers', 'ensembles', 'matplotlib') if m in sys.modules)
forbidden = {forbidden!r}
print(','.join(m for m in heavy if m in forbidden))
"""


@pytest.mark.parametrize(
    "module, forbidden",
    [
        ("pate_accountant", ("torch", "transformers", "ensembles", "matplotlib", "mechanisms")),
        ("mechanisms", ("torch", "transformers", "ensembles", "matplotlib")),
        ("ensembles", ("torch", "transformers", "matplotlib")),
    ],
)
def test_imports_stay_light(module, forbidden):
    out = subprocess.run(
        [sys.executable, "-c", CHECK.format(module=module, forbidden=forbidden)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "", f"importing {module} pulled in {out.stdout.strip()}"


def test_source_imports_respect_layers():
    """Module-level imports follow the layers; only cli.py may reach ensembles, lazily in a function."""
    import ast
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1]
    not_allowed = {"pate_accountant": ("mechanisms", "ensembles"), "mechanisms": ("ensembles",)}
    for package, banned in not_allowed.items():
        for path in (root / package).rglob("*.py"):
            for node in ast.parse(path.read_text()).body:
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom):
                    names = [node.module or ""]
                else:
                    continue
                for name in names:
                    assert name.split(".")[0] not in banned, f"{path.name} imports {name} at module level"
