"""Every ```python example in README.md and docs/*.md runs.

The blocks of one page run in order in one namespace (a later block may use what an earlier
one defined), in a fresh temporary working directory, so files an example writes do not
land in the checkout. An example states its results with ``assert``; a block that raises
fails the test, naming the page and the block's first line. Pages are documentation first:
keep each page's examples small (a few seconds in all on two cores).
"""
from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)


def python_blocks(text: str) -> list[tuple[int, str]]:
    """(line number of the opening fence, code) for each ```python block of a page."""
    return [(text.count("\n", 0, m.start()) + 1, m.group(1)) for m in FENCE.finditer(text)]


def _pages_with_examples():
    for page in PAGES:
        if python_blocks(page.read_text()):
            yield pytest.param(page, id=page.relative_to(ROOT).as_posix())


def test_fence_parser():
    text = "x\n```python\na = 1\n```\n```bash\nls\n```\n```python\nb = a\n```\n"
    assert python_blocks(text) == [(2, "a = 1\n"), (8, "b = a\n")]


@pytest.mark.parametrize("page", list(_pages_with_examples()))
def test_page_examples_run(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__docs__"}
    for line, code in python_blocks(page.read_text()):
        where = f"{page.relative_to(ROOT)}:{line}"
        try:
            exec(compile(code, where, "exec"), namespace)
        except Exception as exc:  # re-raised with the page and line that failed
            raise AssertionError(f"example at {where} failed: {exc!r}") from exc


LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


@pytest.mark.parametrize("page", PAGES + [ROOT / "CHANGELOG.md"],
                         ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(page):
    """Every relative link (docs pages, images, source files) points at a file that exists."""
    missing = [target for target in LINK.findall(page.read_text())
               if "://" not in target and not (page.parent / target).exists()]
    assert not missing, f"{page.relative_to(ROOT)} links to missing files: {missing}"


#: what a run report looks like in source text; figures belong in docs/benchmarks.md,
#: history in CHANGELOG.md and the commit messages
RUN_REPORT = re.compile(r"FACTS\.md|shared/|measured here|this VM|\b20\d\d-\d\d-\d\d\b")


def test_sources_carry_no_run_reports():
    sources = [p for d in ("relaxed", "sgd_shm", "ext", "bench") for p in (ROOT / d).rglob("*")
               if p.suffix in (".py", ".pyx", ".pxd", ".h", ".cpp")]
    hits = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}" for p in sources
            for i, line in enumerate(p.read_text().splitlines(), 1) if RUN_REPORT.search(line)]
    assert not hits, "run reports in source comments:\n" + "\n".join(hits)


#: a source file named in a page's text (`sgd_shm/hogwild/_kernels.py`), or a dotted name
#: of the kit (`sgd_shm.WorkerError`, `relaxed.quality.replay`)
SOURCE = re.compile(r"`((?:sgd_shm|relaxed|ext|bench|tests)/[\w./-]+\.(?:py|pyx|pxd|h|hpp|cpp))`")
DOTTED = re.compile(r"`((?:sgd_shm|relaxed)(?:\.[A-Za-z_]\w*)+)")


def _resolves(dotted: str) -> bool:
    """Whether a dotted name is a module of the kit or an attribute of one."""
    import importlib
    import warnings
    parts = dotted.split(".")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)   # re-exports on their way out
        for i in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:i]))
            except ImportError:
                continue
            try:
                for attr in parts[i:]:
                    obj = getattr(obj, attr)
            except AttributeError:
                return False
            return True
    return False


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_named_sources_exist(page):
    """The source files and the dotted names a page cites exist: a page that says where
    the code is, or what to import or catch, is not left pointing at a file that moved."""
    text = page.read_text()
    missing = sorted({f for f in SOURCE.findall(text) if not (ROOT / f).exists()})
    if any(d.startswith("sgd_shm.torch") for d in DOTTED.findall(text)):
        pytest.importorskip("torch")
    unknown = sorted({d for d in DOTTED.findall(text) if not _resolves(d)})
    assert not missing and not unknown, (f"{page.relative_to(ROOT)} names missing files "
                                         f"{missing} and unknown names {unknown}")
