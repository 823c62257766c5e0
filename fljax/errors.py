"""The errors a user can cause, each a one-line message (the CLI prints it as ``fljax: error: ...``, exit status 2).

:class:`OptionError` names the option it is about, relative to the component that owns it (``lr`` of an algorithm,
``alpha`` of a partitioner); the config layer adds the section (``algo.lr``, ``data.alpha``) from the key itself,
never by reading the message text.
"""
from __future__ import annotations

__all__ = ["ConfigError", "OptionError"]


class ConfigError(ValueError):
    """An invalid configuration (the message is one line naming the key)."""


class OptionError(ConfigError):
    """A bad value of one option: ``key`` is the option's name in its component, ``message`` what is wrong and how
    to fix it (str(e) = ``"<key> <message>"``)."""

    def __init__(self, key: str, message: str):
        self.key, self.message = key, message
        super().__init__(f"{key} {message}")

    def within(self, section: str) -> "OptionError":
        """The same error with ``section.`` prefixed to the key (``within('algo')``: ``lr`` → ``algo.lr``)."""
        return OptionError(f"{section}.{self.key}", self.message)
