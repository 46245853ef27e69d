"""The documentation names only files that exist, and the README stays short.

Read: `README.md` and every `docs/**/*.md`. A reference is checked when it is

- a relative markdown link `[text](target)` (no scheme, not only an `#anchor`): resolved against the
  linking file's folder;
- an inline code span that is all path characters (letters, digits, `_ . - /`) and either starts with a
  top-level entry of the repository followed by `/` (`gateway/server.py`, `tests/store/`), ends with `/`
  (a folder: `store/`), or ends with a known file extension (`gateway/config.py`, `pyproject.toml`): resolved
  against the repository root; a bare file name (`compose.yaml`) must exist somewhere in the repository;
- a dotted module name under `tidewire.` or `loadtest.` (`tidewire.pipeline.lake`, `loadtest.bench`), inline or
  in a code block: the module or package must exist, or be one of the plugins' entry point groups
  (`extensions/plugins.py`: `tidewire.auth` names a group, not a module);
- a word of a fenced code block, or of an inline code span holding a command, that starts with a top-level
  entry followed by `/` or ends with a known extension (`docker compose -f deploy/compose.yaml`).

Paths the documents name on purpose although a checkout does not hold them (a command writes them, or the
operator does) are written with a placeholder root (`<data_dir>/api_token`, `<lake>/events/`), which is not path
characters, or listed in `MADE_LATER` with the reason.

The README's budget is `README_MAX_LINES` (120) lines: a newcomer reads it in five minutes; the rest is in docs/.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tidewire.extensions.plugins import AUTH_GROUP, AUTHZ_GROUP, PUBLISH_HOOK_GROUP, SINK_GROUP

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
README_MAX_LINES = 120

# Names at the top of a checkout that are not the repository's own (build output, caches, local state): a doc
# naming `.venv/...` or `data/...` means the working copy of a running system, not a file of the project.
NOT_REPOSITORY = {".git", ".venv", "venv", "build", "dist", "data", "__pycache__", ".hypothesis", ".mypy_cache",
                  ".pytest_cache", ".ruff_cache", "node_modules"}
EXTENSIONS = {"py", "md", "toml", "yaml", "yml", "json", "c", "sh", "cfg", "ini", "txt", "in", "js", "css", "html"}
# Named by the docs, created after checkout. Path (or folder prefix) -> why it is absent from the repository.
MADE_LATER = {
    "deploy/tidewire.env": "the operator writes it from deploy/tidewire.env.example; .gitignore keeps it out",
    "dist/": "written by `tidewire pipeline package` (its zip and one launcher per job)",
}

# Dotted names that are entry point groups, not modules.
ENTRY_POINT_GROUPS = {AUTH_GROUP, AUTHZ_GROUP, PUBLISH_HOOK_GROUP, SINK_GROUP}

PATH_CHARS = re.compile(r"^[A-Za-z0-9_.\-/]+$")
MODULE = re.compile(r"^(?:tidewire|loadtest)(?:\.[a-z_][a-z0-9_]*)+$")
INLINE_CODE = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
TOKEN = re.compile(r"[A-Za-z0-9_.\-/]+")


@dataclass(frozen=True)
class Ref:
    doc: Path
    line: int
    kind: str  # "link", "path", "module"
    target: str

    def __str__(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}: {self.kind} {self.target!r}"


def _documents() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))] if DOCS.is_dir() else [README]


def _top_level() -> set[str]:
    return {p.name for p in ROOT.iterdir() if p.name not in NOT_REPOSITORY and not p.name.endswith(".egg-info")}


def _all_names() -> set[str]:
    names: set[str] = set()
    for _folder, dirs, files in os.walk(ROOT):  # not into .venv: its files are not the project's
        dirs[:] = [d for d in dirs if d not in NOT_REPOSITORY and not d.endswith(".egg-info")]
        names.update(dirs)
        names.update(files)
    return names


def _extension(text: str) -> str:
    name = text.rsplit("/", 1)[-1]
    return name.rsplit(".", 1)[1] if "." in name.strip(".") else ""


def _path_like(text: str, top: set[str], in_code: bool) -> bool:
    text = text.removeprefix("./")
    if not PATH_CHARS.match(text) or text.startswith(("/", "-")) or MODULE.match(text):
        return False
    first = text.split("/", 1)[0]
    starts_at_top = "/" in text and first in top
    # In code blocks, `sensors/#` tokenizes to `sensors/`: a trailing slash names a folder only in prose.
    return starts_at_top or _extension(text) in EXTENSIONS or (not in_code and text.endswith("/"))


def _code_refs(doc: Path, number: int, code: str, top: set[str]) -> Iterator[Ref]:
    for token in TOKEN.findall(code):
        token = token.rstrip(".")  # a sentence's full stop in a comment
        if MODULE.match(token):
            yield Ref(doc, number, "module", token)
        elif _path_like(token, top, in_code=True):
            yield Ref(doc, number, "path", token.removeprefix("./"))


def _refs(doc: Path, top: set[str]) -> Iterator[Ref]:
    fenced = False
    for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            yield from _code_refs(doc, number, line, top)
            continue
        for target in LINK.findall(line):
            if "://" not in target and not target.startswith(("#", "mailto:")):
                yield Ref(doc, number, "link", target.split("#", 1)[0])
        for span in INLINE_CODE.findall(line):
            span = span.strip()
            if MODULE.match(span):
                yield Ref(doc, number, "module", span)
            elif _path_like(span, top, in_code=False):
                yield Ref(doc, number, "path", span.removeprefix("./"))
            elif " " in span:  # a command: its words are checked as a code block's are
                yield from _code_refs(doc, number, span, top)


def _exists(ref: Ref, names: set[str]) -> bool:
    if ref.kind == "link":
        return (ref.doc.parent / ref.target).exists()
    if ref.kind == "module":
        if ref.target in ENTRY_POINT_GROUPS:
            return True
        base = ROOT.joinpath(*ref.target.split("."))
        return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()
    if any(ref.target == made or (made.endswith("/") and ref.target.startswith(made)) for made in MADE_LATER):
        return True
    if "/" not in ref.target.rstrip("/"):
        return (ROOT / ref.target).exists() or ref.target.rstrip("/") in names
    return (ROOT / ref.target).exists()


def _all_refs() -> list[Ref]:
    top = _top_level()
    return [ref for doc in _documents() for ref in _refs(doc, top)]


def test_docs_name_only_files_that_exist() -> None:
    refs = _all_refs()
    # A rule that matches nothing passes on any text: make sure it saw the references the docs are made of.
    kinds = {kind: sum(1 for r in refs if r.kind == kind) for kind in ("link", "path", "module")}
    assert kinds["link"] >= 10 and kinds["path"] >= 100 and kinds["module"] >= 5, kinds
    names = _all_names()
    missing = [str(ref) for ref in refs if not _exists(ref, names)]
    assert missing == []


def test_every_doc_is_linked_from_the_readme() -> None:
    linked = {(README.parent / r.target).resolve() for r in _all_refs() if r.doc == README and r.kind == "link"}
    docs = {p.resolve() for p in DOCS.glob("*.md")}
    assert docs, "no docs/*.md found"
    assert sorted(str(p.relative_to(ROOT)) for p in docs - linked) == []


def test_readme_stays_short() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; the budget is {README_MAX_LINES}"


def test_the_checker_catches_a_missing_file(tmp_path: Path) -> None:
    # The existence rule itself, on a document that names one real and three missing things.
    doc = tmp_path / "x.md"
    doc.write_text("`gateway/server.py` `gateway/proxy_listener.py` `tidewire.gateway.nope` [x](nope.md)\n"
                   "```\ndocker compose -f deploy/missing.yaml\n```\n", encoding="utf-8")
    refs = list(_refs(doc, _top_level()))
    names = _all_names()
    assert sorted(r.target for r in refs if not _exists(r, names)) == [
        "deploy/missing.yaml", "gateway/proxy_listener.py", "nope.md", "tidewire.gateway.nope"]
    assert [r.target for r in refs if _exists(r, names)] == ["gateway/server.py"]
