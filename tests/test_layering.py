"""The dependency graph points one way: pate_accountant <- mechanisms <- ensembles <- pate_app (the
application wing), with one door from the command line's entry point into the application (docs/index.md)."""

import ast
import pathlib
import subprocess
import sys

import pytest

CHECK = """
import sys
import {module}
heavy = sorted(m for m in ('torch', 'transformers', 'ensembles', 'matplotlib', 'pate_app', 'ray') if m in sys.modules)
forbidden = {forbidden!r}
print(','.join(m for m in heavy if m in forbidden))
"""


@pytest.mark.parametrize(
    "module, forbidden",
    [
        ("pate_accountant", ("torch", "transformers", "ensembles", "matplotlib", "mechanisms", "pate_app", "ray")),
        ("pate_accountant.cli", ("torch", "transformers", "ensembles", "matplotlib", "mechanisms", "pate_app", "ray")),
        ("mechanisms", ("torch", "transformers", "ensembles", "matplotlib", "pate_app", "ray")),
        ("ensembles", ("torch", "transformers", "matplotlib", "pate_app", "ray")),
        ("pate_app.cli", ("torch", "transformers", "matplotlib", "ray")),
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


ROOT = pathlib.Path(__file__).resolve().parents[1]
#: What each library package may not import, anywhere in its source (function bodies included).
BANNED = {
    "pate_accountant": ("mechanisms", "ensembles", "pate_app"),
    "mechanisms": ("ensembles", "pate_app"),
    "ensembles": ("pate_app",),
}
#: Heavy optional packages: imported only inside functions, never at module level.
HEAVY = ("torch", "transformers", "matplotlib", "ray", "tqdm", "sklearn", "mauve", "sentence_transformers", "faiss")
#: The one door upward: the library's command-line entry point calls into the application wing.
DOOR = ("pate_accountant/cli.py", "pate_app.cli")


def _imports(tree):
    """``(node, imported module name, at module level)`` for every import in ``tree``."""
    top = set(map(id, tree.body))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"relative import at line {node.lineno}: use absolute imports"
            names = [node.module or ""]
        else:
            continue
        for name in names:
            yield node, name, id(node) in top


def test_no_library_module_reaches_upward_except_through_the_cli_door():
    doors = []
    for package, banned in BANNED.items():
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            for node, name, _ in _imports(ast.parse(path.read_text())):
                if name.split(".")[0] not in banned:
                    continue
                if (relative, name) == DOOR:
                    doors.append(node.lineno)
                    continue
                raise AssertionError(f"{relative}:{node.lineno} imports {name} (a higher layer)")
    assert len(doors) == 1, f"expected exactly one door from the CLI into the application, found {doors}"


def test_heavy_optional_packages_are_imported_lazily():
    for package in (*BANNED, "pate_app"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for node, name, top in _imports(ast.parse(path.read_text())):
                assert not (top and name.split(".")[0] in HEAVY), (
                    f"{path.relative_to(ROOT)}:{node.lineno} imports {name} at module level"
                )


#: Function-local imports of our own modules that stay local, each breaking an import cycle: the ledger and
#: the accountants it rebuilds, the accountant registry and the classes it registers, the auditor and the
#: mechanism registry that reads its cases; plus the command line's one door.
LOCAL_IMPORTS = {
    ("pate_accountant/ledger.py", "pate_accountant.accountants.base"),
    ("pate_accountant/registry.py", "pate_accountant.accountants.base"),
    ("pate_accountant/registry.py", "pate_accountant.accountants"),
    ("mechanisms/audit.py", "mechanisms"),
    # the mechanism registry lists names without importing a mechanism (fast --help): built-ins are imported
    # when first built or audited
    ("mechanisms/registry.py", "mechanisms"),
    # the application's package names RunSpec and synthesize without importing them (a fast --help)
    ("pate_app/__init__.py", "pate_app"),
    # a spec tells a ledger URL from a path when it is checked: the ledger (and the accountants it replays) is
    # not imported when the command line starts (tests/test_cli_startup.py)
    ("pate_app/spec.py", "pate_accountant.ledger"),
    DOOR,
}


def test_light_modules_are_imported_at_module_level():
    """Our own modules are imported at module level, but for the cycle breakers above."""
    found = set()
    for package in (*BANNED, "pate_app"):
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            for node, name, top in _imports(ast.parse(path.read_text())):
                if top or name.split(".")[0] not in (*BANNED, "pate_app"):
                    continue  # third-party packages may be imported lazily (torch, scipy.optimize, ...)
                if relative == "ensembles/backends/__init__.py" and name.endswith("transformers_backend"):
                    continue  # the lazy door to the torch-backed backend
                if relative.startswith(("pate_app/commands/", "pate_app/experiments/")):
                    continue  # a command or experiment imports what it runs when it runs: its --help stays fast
                assert (relative, name) in LOCAL_IMPORTS, f"{relative}:{node.lineno} imports {name} inside a function"
                found.add((relative, name))
    assert found == LOCAL_IMPORTS


#: The import cycles a registry closes, and only those: the accountant registry and the classes it registers,
#: the mechanism registry and the auditor that reads its cases (issue 35: no circle across files).
REGISTRY_CYCLES = (
    frozenset({"pate_accountant.accountants", "pate_accountant.registry"}),
    frozenset({"mechanisms.audit", "mechanisms.registry"}),
)


def _module_graph() -> dict[str, set[str]]:
    """Each of our modules -> the modules of ours it imports, anywhere in its source (function bodies too);
    ``from a import b`` names the module ``a.b`` when there is one, else ``a``."""
    files = {}
    for package in (*BANNED, "pate_app"):
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path

    def resolve(name: str) -> str:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name

    graph = {}
    for module, path in files.items():
        graph[module] = set()
        for node, name, _ in _imports(ast.parse(path.read_text())):
            names = [f"{name}.{alias.name}" for alias in node.names] if isinstance(node, ast.ImportFrom) else [name]
            graph[module].update(target for target in map(resolve, names) if target and target != module)
    return graph


def _cycles(graph: dict[str, set[str]]) -> set[frozenset]:
    """The strongly connected components of more than one module: each reaches every other."""
    reach = {}
    for start in graph:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        reach[start] = seen
    return {frozenset({start} | {other for other in reach[start] if start in reach.get(other, ())})
            for start in graph if any(start in reach.get(other, ()) for other in reach[start] if other != start)}


def test_the_cycle_finder_finds_cycles():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}) == {frozenset("abc")}
    assert _cycles({"a": {"b"}, "b": set()}) == set()


def test_no_import_circle_across_files_outside_the_registries():
    # equality, not a subset: the registry cycles close through function-local imports, so finding them shows
    # the graph reads those too (an empty graph would pass a subset test)
    assert _cycles(_module_graph()) == set(REGISTRY_CYCLES)
