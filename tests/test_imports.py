"""The package's import graph, read statically (every import statement, those inside functions and under
TYPE_CHECKING included): no module imports itself through others, and none takes a private name from
another."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "gen_pipeline"


def module_files(package: Path = PACKAGE) -> dict[str, Path]:
    """Dotted module name -> its file, for every module of the package (a package by its __init__)."""
    found = {}
    for path in package.rglob("*.py"):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imported_names(name: str, path: Path) -> Iterator[tuple[str, str | None]]:
    """(module, name taken from it or None) for each import statement of a module, relative ones resolved."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from ((alias.name, None) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                here = here[: len(here) - node.level + 1]
                base = ".".join([*here, base] if base else here)
            yield from ((base, alias.name) for alias in node.names)


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the package's modules it imports. `from P import x` is an edge to P.x when that is a
    module (P's __init__ is run, but what it imports is not needed), else to P, whose names it reads."""
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges = set()
        for base, taken in imported_names(name, path):
            target = f"{base}.{taken}" if taken is not None and f"{base}.{taken}" in modules else base
            if target in modules and target != name:
                edges.add(target)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (as a path that ends where it started) through each module that is on one."""
    found, done = [], set()
    for start in sorted(graph):
        stack, path, on_path = [iter(sorted(graph[start]))], [start], {start}
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                stack.pop()
                left = path.pop()
                on_path.discard(left)
                done.add(left)
                continue
            if nxt in on_path:
                found.append([*path[path.index(nxt) :], nxt])
            elif nxt not in done:
                stack.append(iter(sorted(graph[nxt])))
                path.append(nxt)
                on_path.add(nxt)
    return found


def test_the_import_graph_has_no_cycle() -> None:
    """Every module of gen_pipeline can be read knowing only the modules below it."""
    assert cycles(import_graph(module_files())) == []


def test_a_cycle_is_found(tmp_path: Path) -> None:
    """The walk sees a cycle made of a function-level import and a relative one."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .b import f\n")
    (pkg / "b.py").write_text("def f():\n    from pkg import c\n")
    (pkg / "c.py").write_text("from . import a\n")
    assert cycles(import_graph(module_files(pkg))) == [["pkg.a", "pkg.b", "pkg.c", "pkg.a"]]


def test_no_private_name_is_imported_across_modules() -> None:
    """A name with a leading underscore stays in its module: what others need is public."""
    modules = module_files()
    private = [
        f"{name} takes {taken} from {base}"
        for name, path in modules.items()
        for base, taken in imported_names(name, path)
        if base.startswith("gen_pipeline") and taken and taken.startswith("_") and not taken.startswith("__")
    ]
    assert private == []


def test_nothing_below_the_command_line_imports_it() -> None:
    """gen_pipeline.cli is the top: only its own modules and `python -m gen_pipeline` import it."""
    modules = module_files()
    upward = [
        f"{name} imports {target}"
        for name, edges in import_graph(modules).items()
        for target in edges
        if target.startswith("gen_pipeline.cli")
        and not name.startswith("gen_pipeline.cli")
        and name != "gen_pipeline.__main__"
    ]
    assert upward == []


MAX_MODULES = 12


def package_sizes(package: Path = PACKAGE) -> dict[str, int]:
    """Sub-package -> the modules it holds (its __init__ not counted), sub-packages within it counted whole."""
    return {
        init.parent.name: sum(1 for p in init.parent.glob("*.py") if p.name != "__init__.py")
        + sum(1 for p in init.parent.glob("*/__init__.py"))
        for init in sorted(package.glob("*/__init__.py"))
    }


def test_no_package_holds_more_than_twelve_modules() -> None:
    """A package is one job a reader can hold in mind: past twelve modules it is split by job, as views/ was."""
    assert {name: n for name, n in package_sizes().items() if n > MAX_MODULES} == {}


def test_an_oversized_package_is_counted(tmp_path: Path) -> None:
    """Modules are counted without the __init__."""
    (tmp_path / "big").mkdir()
    for name in ["__init__", *(f"m{i}" for i in range(MAX_MODULES + 1))]:
        (tmp_path / "big" / f"{name}.py").write_text("")
    assert package_sizes(tmp_path) == {"big": MAX_MODULES + 1}


BASE_RULE = "the base modules"
RULE = re.compile(r"^May import: (.+?)\.?$", re.M)


def base_modules(package: Path = PACKAGE) -> set[str]:
    """The top-level modules below every sub-package, as the package's own docstring names them."""
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text(encoding="utf-8"))) or ""
    found = re.search(r"import only each other: ([\w, ]+)\.", doc)
    assert found, "gen_pipeline/__init__.py names no base modules"
    return {name.strip() for name in found.group(1).split(",")}


def allowed_imports(package: Path = PACKAGE) -> dict[str, set[str] | None]:
    """Sub-package -> the units (sub-packages, top-level modules) its docstring's 'May import:' line names;
    None where it may import anything."""
    base, rules = base_modules(package), {}
    for init in sorted(package.glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        found = RULE.search(doc)
        assert found, f"{init.parent.name}/__init__.py says nothing of what it may import"
        words = [w.strip() for w in found.group(1).split(",")]
        if words[0].startswith("anything"):
            rules[init.parent.name] = None
            continue
        named = {w for w in words if w != BASE_RULE}
        rules[init.parent.name] = named | (base if BASE_RULE in words else set())
    return rules


def unit(module: str) -> str:
    """The sub-package or top-level module a dotted module name belongs to."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def upward_imports(package: Path = PACKAGE) -> list[str]:
    """Every import that its sub-package's rule (or, for a base module, the base) does not allow."""
    rules, base = allowed_imports(package), base_modules(package)
    modules = module_files(package)
    wrong = []
    for name, edges in import_graph(modules).items():
        home = unit(name)
        allowed = rules.get(home, set()) if home in rules else (base if home in base else None)
        for target in edges:
            there = unit(target)
            if allowed is not None and there and there != home and there not in allowed:
                wrong.append(f"{name} imports {target}")
    return sorted(wrong)


def test_every_import_is_one_its_package_allows() -> None:
    """No sub-package imports one above it (its docstring's 'May import:' rule), and the base modules import
    only each other."""
    assert upward_imports() == []


def test_an_upward_import_is_found(tmp_path: Path) -> None:
    """A function-level import from a package its rule does not name is reported; an allowed one is not."""
    pkg = tmp_path / "pkg"
    for sub, rule in (("low", "May import: the base modules."), ("high", "May import: the base modules, low.")):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text(f'"""{sub}.\n\n{rule}\n"""\n')
    (pkg / "__init__.py").write_text('"""pkg.\n\nThe base modules import only each other: errors.\n"""\n')
    (pkg / "errors.py").write_text("")
    (pkg / "low" / "a.py").write_text("from ..errors import x\n\ndef f():\n    from ..high import b\n")
    (pkg / "high" / "b.py").write_text("from ..low import a\n")
    assert upward_imports(pkg) == ["pkg.low.a imports pkg.high.b"]


def test_the_answer_checks_sit_between_http_and_the_run() -> None:
    """answers/ (the loop guard, the answer checks) is below the request path: it may import the base modules
    and http, never send, engine, the run directory or the command line."""
    rules = allowed_imports()
    assert rules["answers"] is not None and rules["answers"] <= base_modules() | {"http"}
