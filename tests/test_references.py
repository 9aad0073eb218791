"""Every ``proxy.x`` / ``pcp_core.x`` a comment, a docstring or a doc names exists: a module that imports, and the
attribute it names, if any. A name that moved leaves a reference behind; this finds it."""

from __future__ import annotations

import ast
import importlib
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("proxy", "pcp_core")
DOCS = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))

# A dotted name that starts with a package: not inside a path (proxy/web/routes.py) or another dotted name.
REFERENCE = re.compile(r"(?<![\w./-])(?:proxy|pcp_core)(?:\.[A-Za-z_]\w*)+")


def names_in(text: str) -> list[str]:
    """The dotted ``proxy.…`` / ``pcp_core.…`` names ``text`` mentions; a file's ``.py`` is not a name."""
    return [name.removesuffix(".py") for name in REFERENCE.findall(text)]


def source_texts(path: Path) -> Iterator[tuple[int, str]]:
    """The comments and docstrings of a Python file, each with its line."""
    source = path.read_text()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                yield from enumerate(first.value.value.splitlines(), start=first.lineno)


def doc_texts(path: Path) -> Iterator[tuple[int, str]]:
    """A Markdown file's lines, each with its number."""
    yield from enumerate(path.read_text().splitlines(), start=1)


def references() -> list[tuple[str, str]]:
    """Every reference in the packages' comments and docstrings and in the docs, as (where, name)."""
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            found += [(f"{path.relative_to(ROOT)}:{line}", name) for line, text in source_texts(path) for name in names_in(text)]
    for path in DOCS:
        found += [(f"{path.relative_to(ROOT)}:{line}", name) for line, text in doc_texts(path) for name in names_in(text)]
    return found


def resolves(name: str) -> bool:
    """Whether ``name`` is a module that imports, or an attribute reached from one (a submodule imported on the way)."""
    parts = name.split(".")
    target: object = importlib.import_module(parts[0])
    for part in parts[1:]:
        if hasattr(target, part):
            target = getattr(target, part)
            continue
        module = getattr(target, "__name__", None)
        if not isinstance(target, type(importlib)) or module is None:
            return False
        try:
            target = importlib.import_module(f"{module}.{part}")
        except ModuleNotFoundError as error:
            if error.name == f"{module}.{part}":
                return False
            raise
    return True


def test_every_reference_resolves() -> None:
    found = references()
    assert len(found) > 50  # the extraction still finds them
    stale = [f"{where}: {name}" for where, name in found if not resolves(name)]
    assert not stale, "references to names that do not exist:\n" + "\n".join(stale)


def test_a_stale_reference_is_found() -> None:
    names = names_in("Kept by ``proxy.no_such_module`` and ``pcp_core.request.no_such_function``; see proxy/web/routes.py.")
    assert names == ["proxy.no_such_module", "pcp_core.request.no_such_function"]
    assert not any(resolves(name) for name in names)
    assert resolves("proxy.web.routes") and resolves("pcp_core.request")


def _anchor(heading: str) -> str:
    """A Markdown heading's anchor, as GitHub makes it."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_doc_link_resolves() -> None:
    """A relative link in the README, docs/ or bench/ names a file that exists, and a heading of it if it names one."""
    pages = (*DOCS, *sorted((ROOT / "bench").glob("*.md")))
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            if not linked.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
            elif anchor and linked.suffix == ".md":
                headings = {_anchor(line.lstrip("#")) for line in linked.read_text().splitlines() if re.match(r"#+ ", line)}
                if anchor not in headings:
                    broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, "links to nothing:\n" + "\n".join(broken)
