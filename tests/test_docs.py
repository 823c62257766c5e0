"""The documentation runs: every ```python block of README.md and docs/*.md is executed (each in a fresh namespace,
in an empty temporary directory), and docs/errors.md is what tests/bad_inputs.py generates.

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


@pytest.mark.parametrize("where,code", list(_blocks()))
def test_python_block_runs(where, code, tmp_path, monkeypatch):
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
