"""YAML as configs are read and written: values as a person means them, and nothing surprising accepted.

Scalars resolve as in YAML 1.2's core schema: ``1e-3``, ``1E5``, ``.5`` and ``-.inf`` are floats (YAML 1.1, PyYAML's
default, reads ``1e-3`` as text), ``true``/``false`` are the only booleans (``yes``, ``no``, ``on``, ``off`` are
text), ``010`` is ten, and dates and ``1:30`` stay text. A document is refused, in one line with its line number,
when it repeats a key in a mapping, uses a key that is not a string, nests deeper than :data:`MAX_DEPTH`, or uses
an alias (``*name``). :func:`dump` writes text that :func:`load` reads back to the same values.
"""
from __future__ import annotations

import re

import yaml

from fljax.errors import ConfigError
from fljax.options import show

__all__ = ["load", "dump", "YamlError", "MAX_DEPTH"]

MAX_DEPTH = 32  # nested collections; a config nests three or four
_MAX_DIGITS = 100  # an integer literal longer than this is refused (Python refuses to parse 4,300 digits)
_TAGS = {"tag:yaml.org,2002:" + t for t in ("str", "int", "float", "bool", "null", "seq", "map")}


class YamlError(ConfigError):
    """A document that parses but is not acceptable as a config (duplicate or non-string key, depth, alias)."""


def _resolvers() -> dict:
    """SafeLoader's implicit resolvers with YAML 1.1's bool, int, float, timestamp, merge and value forms replaced by
    YAML 1.2 core-schema bool, int and float."""
    dropped = {"tag:yaml.org,2002:bool", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float",
               "tag:yaml.org,2002:timestamp", "tag:yaml.org,2002:merge", "tag:yaml.org,2002:value"}
    table = {first: [(tag, rx) for tag, rx in entries if tag not in dropped]
             for first, entries in yaml.SafeLoader.yaml_implicit_resolvers.items()}
    rules = [
        ("tag:yaml.org,2002:bool", r"^(?:true|True|TRUE|false|False|FALSE)$", "tTfF"),
        ("tag:yaml.org,2002:int", r"^(?:[-+]?[0-9][0-9_]*|0o[0-7][0-7_]*|0x[0-9a-fA-F][0-9a-fA-F_]*)$", "-+0123456789"),
        ("tag:yaml.org,2002:float", r"^(?:[-+]?(?:[0-9][0-9_]*\.[0-9_]*|\.[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)?"
                                    r"|[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$",
         "-+0123456789."),
    ]
    for tag, pattern, firsts in rules:
        for first in firsts:
            table.setdefault(first, []).append((tag, re.compile(pattern)))
    return table


class _Loader(yaml.SafeLoader):
    yaml_implicit_resolvers = _resolvers()

    def __init__(self, stream):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            raise YamlError(f"aliases (*name) are not supported in configs (line {self._line()}); write the value "
                            f"out.")
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise YamlError(f"the document nests deeper than {MAX_DEPTH} levels (line {self._line()}); a config "
                                f"nests a few levels at most.")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def _line(self) -> int:
        return self.peek_event().start_mark.line + 1

    def construct_object(self, node, deep=False):
        if node.tag not in _TAGS:
            raise YamlError(f"tag {node.tag!r} (line {node.start_mark.line + 1}) is not supported in configs; "
                            f"write a plain value.")
        try:
            return super().construct_object(node, deep)
        except (ValueError, KeyError) as e:  # an explicit tag on text it cannot read: !!int abc, !!bool maybe
            if isinstance(e, ConfigError):
                raise
            raise YamlError(f"{show(node.value)} (line {node.start_mark.line + 1}) cannot be read as {node.tag[18:]}."
                            ) from None

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if not isinstance(key, str):
                raise YamlError(f"key {show(key)} (line {line}) is not a name; config keys are strings.")
            if key in seen:
                raise YamlError(f"key {key!r} appears twice in one mapping (lines {seen[key]} and {line}); keep one.")
            seen[key] = line
        return super().construct_mapping(node, deep)

    def construct_yaml_int(self, node):
        text = self.construct_scalar(node).replace("_", "")
        sign = -1 if text.startswith("-") else 1
        digits = text.lstrip("+-")
        if len(digits) > _MAX_DIGITS:
            raise YamlError(f"the integer at line {node.start_mark.line + 1} has {len(digits)} digits; no option "
                            f"takes one that large.")
        if digits[:2] in ("0x", "0o"):
            return sign * int(digits[2:], 16 if digits[1] == "x" else 8)
        return sign * int(digits)


_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_yaml_int)


class _Dumper(yaml.SafeDumper):
    yaml_implicit_resolvers = _Loader.yaml_implicit_resolvers  # so that text which would load as a number is quoted


_Dumper.add_representer(tuple, yaml.SafeDumper.represent_list)


def load(stream):
    """Parse one YAML document (a string or a file); raises :class:`yaml.YAMLError` for invalid YAML and
    :class:`YamlError` for the refusals above."""
    return yaml.load(stream, Loader=_Loader)


def dump(value) -> str:
    return yaml.dump(value, Dumper=_Dumper, sort_keys=False)
