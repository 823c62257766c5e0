"""JAX's persistent compilation cache, on by default.

A compiled program is stored on disk under a hash of its HLO and the compiler, so a second run of the same shapes —
the same experiment again, another seed or partition of equal shapes, another hyperparameter value traced as an
argument — loads it instead of compiling. fljax turns the cache on the first time it builds a simulation:

* in ``$FLJAX_COMPILE_CACHE`` when that is set to a folder, otherwise in the user's cache folder
  (``$XDG_CACHE_HOME/fljax/jax``, default ``~/.cache/fljax/jax``);
* ``FLJAX_COMPILE_CACHE=0`` (or ``off``) turns it off, as does :func:`disable`;
* a cache folder set already (``jax.config.update("jax_compilation_cache_dir", ...)``, as the tests do) is left
  alone.
"""
from __future__ import annotations

import os

import jax

__all__ = ["enable", "disable", "cache_dir", "MIN_COMPILE_SECONDS"]

MIN_COMPILE_SECONDS = 0.2  # programs that compile faster are not worth a disk round trip
_state = {"decided": False}


def cache_dir() -> str | None:
    """The folder the cache would use (None: turned off by the environment)."""
    value = os.environ.get("FLJAX_COMPILE_CACHE", "")
    if value.lower() in ("0", "off", "false", "no"):
        return None
    if value:
        return os.path.expanduser(value)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "fljax", "jax")


def enable() -> str | None:
    """Turn the persistent cache on (once per process; see the module docstring); returns its folder or None."""
    if _state["decided"]:
        return jax.config.jax_compilation_cache_dir
    _state["decided"] = True
    if jax.config.jax_compilation_cache_dir:  # someone chose already
        return jax.config.jax_compilation_cache_dir
    folder = cache_dir()
    if folder is None:
        return None
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError:  # a read-only home: run without the cache
        return None
    jax.config.update("jax_compilation_cache_dir", folder)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECONDS)
    return folder


def disable() -> None:
    """Keep this process from turning the cache on (call before the first simulation is built)."""
    _state["decided"] = True
