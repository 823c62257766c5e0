"""The documentation runs: every ```python block of README.md and docs/*.md is executed (each in a fresh namespace,
in an empty temporary directory, what it registers unregistered after it), and docs/errors.md is what
tests/bad_inputs.py generates.

A block that cannot run in the test suite is marked in the markdown, right before it, with an HTML comment:
``<!-- no-test: why -->`` (skipped) or ``<!-- xfail: why -->`` (expected to fail now; strict, so the marker has to
go once the block runs)."""
import glob
import os
import re

import pytest
from bad_inputs import DOC, messages, render

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_BLOCK = re.compile(r"(?:<!--\s*(no-test|xfail):\s*(.*?)\s*-->\s*\n)?^```python\n(.*?)^```", re.S | re.M)


def _blocks():
    for path in [os.path.join(ROOT, "README.md"), *sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))]:
        with open(path) as f:
            text = f.read()
        for m in _BLOCK.finditer(text):
            line = text.count("\n", 0, m.start(3))  # the block's first line of code, 1-based: after the fence
            where = f"{os.path.relpath(path, ROOT)}:{line + 1}"
            marker, reason, code = m.groups()
            marks = {"no-test": [pytest.mark.skip(reason=reason)],
                     "xfail": [pytest.mark.xfail(reason=reason, strict=True)]}.get(marker, [])
            yield pytest.param(where, code, marks=marks, id=where)


@pytest.fixture
def registries():
    """What a block registers (a reader of one's own, docs/data.md; an algorithm of one's own, docs/own-model-data.md)
    is unregistered after it, so that the blocks and the tests after them see the built-in ones only."""
    from fljax.algorithms import ALGORITHMS
    from fljax.data import DATA_KINDS, PARTITIONERS, SOURCES

    saved = [(registry, dict(registry)) for registry in (SOURCES, PARTITIONERS, DATA_KINDS, ALGORITHMS)]
    yield
    for registry, entries in saved:
        registry.clear()
        registry.update(entries)


@pytest.mark.parametrize("where,code", list(_blocks()))
def test_python_block_runs(where, code, tmp_path, monkeypatch, registries):
    monkeypatch.chdir(tmp_path)
    exec(compile(code, where, "exec"), {"__name__": "__docs__"})


def test_the_bad_input_catalogue_is_current():
    with open(DOC) as f:
        assert f.read() == render(messages()), "docs/errors.md is out of date: run `python tests/bad_inputs.py`"


def test_configs_readme_lists_every_key():
    import dataclasses

    from fljax.config import ExperimentConfig, ModelConfig
    from fljax.data import PARTITIONERS, SOURCES, DataConfig
    from fljax.models import MODELS
    from fljax.models.model import model_options

    names = lambda cls: {f.name for f in dataclasses.fields(cls)}  # noqa: E731
    keys = {*names(ExperimentConfig), *names(ModelConfig), *(names(DataConfig) - {"options"}),
            *(k for s in SOURCES.values() for k in names(s.options)),
            *(k for p in PARTITIONERS.values() for k in names(p.options)),
            *(f.name for m in MODELS for f in model_options(m))}
    with open(os.path.join(ROOT, "configs", "README.md")) as f:
        text = f.read()
    assert not [k for k in sorted(keys) if f"`{k}`" not in text], "add these keys to configs/README.md"


# ------------------------------------------------------------------------------------------------------------------
# Every decision id (D22) and spec section (spec §7) the code cites resolves to a heading or decision row of docs/.
# The paper of a reference is the paper named nearest before it in the same file ("FedSLR spec D23", "the DFedAlt
# spec's D21", "AugFL §3"), or, if no paper is named before it, the one in the file's path (configs/quped.yaml,
# tests/test_fedslr.py, benchmarks/results/augfl/README.md). The convention is written down in docs/README.md.

PAPERS = {"augfl": "augfl", "dfedalt": "dfedalt", "dfedsalt": "dfedalt", "fedgia": "fedgia", "fedslr": "fedslr",
          "quped": "quped", "qupel": "quped"}
CITING = ("fljax", "tests", "configs", "benchmarks")  # the trees whose references must resolve
_PAPER_NAME = re.compile(r"(?<![\w/.-])(AugFL|DFedAlt|DFedSalt|FedGiA|FedSLR|QuPeD|QuPeL)(?![\w/])")
_REF = re.compile(r"(?<![\w.-])(?:D(\d+)(?:\s*[–-]\s*D(\d+))?(?!\w|:\d)"  # D7, D16–D19 (not FedGiA_D's "D1:4")
                  r"|§\s?(\d+(?:\.\d+)?)(?:\s*[–-]\s*§?\s?(\d+))?)")     # §7, §10.2, §1–§5 (not the paper's §V-B)
_NOQA = re.compile(r"noqa:[\w ,]*")  # linter codes such as pydocstyle's D101 are not decisions


def _text_files(top):
    for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, top)):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d not in ("__pycache__", "runs"))
        for name in sorted(filenames):
            if name.endswith((".py", ".yaml", ".yml", ".md", ".sh", ".json", ".toml", ".txt")):
                yield os.path.join(dirpath, name)


def spec_references():
    """(file:line, paper or None, anchor) for every decision id and spec section under ``CITING``."""
    for top in CITING:
        for path in _text_files(top):
            if os.path.samefile(path, __file__):
                continue  # this file's comments show the forms; they cite nothing
            rel = os.path.relpath(path, ROOT)
            with open(path, encoding="utf-8") as f:
                text = _NOQA.sub(lambda m: " " * len(m.group()), f.read())
            named = [(m.start(), PAPERS[m.group(1).lower()]) for m in _PAPER_NAME.finditer(text)]
            in_path = next((p for key, p in PAPERS.items() if key in rel.lower()), None)
            for m in _REF.finditer(text):
                before = [p for start, p in named if start < m.start()]
                paper = before[-1] if before else in_path
                where = f"{rel}:{text.count(chr(10), 0, m.start()) + 1}"
                d0, d1, s0, s1 = m.groups()
                if d0:
                    for n in range(int(d0), int(d1 or d0) + 1):
                        yield where, paper, f"D{n}"
                elif s1:
                    for n in range(int(float(s0)), int(s1) + 1):
                        yield where, paper, f"§{n}"
                else:
                    yield where, paper, f"§{s0}"


def _anchored(page, anchor):
    """Whether a docs page has the anchor: a heading that starts with §N (or §N.M); for Dn also a table row whose first
    cell, or a list item that, starts with Dn."""
    a = re.escape(anchor) + (r"(?![.\d])" if anchor.startswith("§") else r"\b")
    heading = re.search(rf"^#{{1,6}} \**{a}", page, re.M)
    row = anchor.startswith("D") and re.search(rf"^(?:\|\s*|\s*[-*]\s+)\**{a}", page, re.M)
    return bool(heading or row)


def test_every_spec_reference_in_the_code_resolves_to_docs():
    refs = list(spec_references())
    assert len(refs) > 300  # the scan works: the code cites the specs a few hundred times
    pages, missing = {}, []
    for where, paper, anchor in refs:
        if paper is None:
            missing.append(f"{where}: {anchor} names no paper (write e.g. 'QuPeD spec {anchor}')")
            continue
        path = os.path.join(ROOT, "docs", f"{paper}.md")
        if paper not in pages:
            pages[paper] = open(path, encoding="utf-8").read() if os.path.exists(path) else ""
        if not _anchored(pages[paper], anchor):
            missing.append(f"{where}: {anchor} of {paper}: docs/{paper}.md has no heading or decision row {anchor}")
    assert not missing, "\n".join(sorted(set(missing)))


def test_engine_references_resolve_to_docs():
    """'engine.md' in the code means docs/engine.md; 'non-negotiable N' its Non-negotiables item N. No reference
    points outside the repository (the design documents the code was written from are not shipped)."""
    path = os.path.join(ROOT, "docs", "engine.md")
    assert os.path.exists(path), "the code cites engine.md: docs/engine.md is missing"
    with open(path, encoding="utf-8") as f:
        rules = f.read().split("## Non-negotiables", 1)[1].split("\n## ", 1)[0]
    bad = []
    for path in [os.path.join(ROOT, "README.md"), *(p for top in CITING for p in _text_files(top))]:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        rel = os.path.relpath(path, ROOT)
        bad += [f"{rel}: {m.group()}" for m in re.finditer(r"shared/(?:spec|seeds|data)/[\w./]*", text)]
        bad += [f"{rel}: non-negotiable {n}" for n in re.findall(r"non-negotiable (\d+)", text)
                if not re.search(rf"^{n}\. ", rules, re.M)]
    assert not bad, bad
