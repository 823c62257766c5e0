"""A lint of the test suite for checks that cannot fail (issue 29): an ``assert_*(...) and assert_*(...)``
expression (the first returns None, so the second never runs), an ``assert`` on an expression that is always true
(a non-empty tuple, string or container literal, a lambda, a non-zero constant, ``... or <truthy constant>``), and a
comparison written as a statement (a forgotten ``assert``). It parses every ``tests/*.py`` with :mod:`ast`."""
import ast
import pathlib

import pytest

TESTS = pathlib.Path(__file__).resolve().parent


def _is_assert_call(node) -> bool:
    """A call of a function whose name starts with ``assert`` (``np.testing.assert_allclose``, ``assert_trees_close``,
    ``mock.assert_called``): such calls return None and raise on failure."""
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
    return name.startswith("assert")


def _always_true(node) -> bool:
    """Whether an expression is truthy whatever the program does (literals only; no evaluation)."""
    if isinstance(node, ast.Constant):
        return bool(node.value)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return len(node.elts) > 0
    if isinstance(node, ast.Dict):
        return len(node.keys) > 0
    if isinstance(node, ast.JoinedStr):
        return any(not isinstance(v, ast.Constant) or v.value for v in node.values)
    if isinstance(node, ast.Lambda):
        return True
    if isinstance(node, ast.BoolOp):
        parts = [_always_true(v) for v in node.values]
        return any(parts) if isinstance(node.op, ast.Or) else all(parts)
    return False


def problems(source: str, name: str = "<test>") -> list[str]:
    """Every dead check in ``source``, as 'name:line: what'."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Expr):
            value = node.value
            if isinstance(value, ast.BoolOp) and any(_is_assert_call(v) for v in value.values):
                out.append(f"{name}:{node.lineno}: assert calls joined by '{type(value.op).__name__.lower()}' (the "
                           f"first returns None, so the rest never run): write one statement per check")
            elif isinstance(value, ast.Compare):
                out.append(f"{name}:{node.lineno}: a comparison as a statement checks nothing (missing 'assert'?)")
        elif isinstance(node, ast.Assert) and _always_true(node.test):
            out.append(f"{name}:{node.lineno}: assert on an expression that is always true")
    return out


@pytest.mark.parametrize("source,count", [
    ("np.testing.assert_array_equal(a, b) and np.testing.assert_array_equal(c, d)", 1),
    ("assert_trees_close(a, b) or check(c)", 1),
    ("assert (x == 1, 'x must be 1')", 1), ("assert 'message'", 1), ("assert [a]", 1), ("assert f'{a}'", 1),
    ("assert x is None or True", 1), ("assert lambda: x", 1), ("x == 1", 1),
    ("assert x == 1, 'message'", 0), ("assert a and b", 0), ("assert ()", 0), ("ok = a == b", 0),
    ("assert_x(a)\nassert_y(b)", 0), ("assert x or y", 0)])
def test_the_lint_flags_dead_checks_and_only_those(source, count):
    assert len(problems(source)) == count, problems(source)


def test_no_test_file_holds_a_check_that_cannot_fail():
    found = [p for path in sorted(TESTS.glob("*.py")) for p in problems(path.read_text(), path.name)]
    assert not found, "\n".join(found)
