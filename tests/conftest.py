import numpy as np
import pytest

import fljax.data as D


@pytest.fixture(scope="session")
def synth20():
    """Synthetic(1,1) with 20 small clients (sizes capped at 120)."""
    return D.make_federated("synthetic", 20, seed=0, max_samples=120)


@pytest.fixture(scope="session")
def digits10():
    return D.make_federated("digits", 10, "dirichlet", seed=0, alpha=0.5)


def assert_trees_close(a, b, rtol=1e-5, atol=1e-6):
    import jax

    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol)


def pytest_configure(config):
    """A persistent compilation cache per test process: simulations built again with the same shapes (a resumed
    run, the separate runs a sweep is compared with) load their compiled programs instead of compiling again."""
    import tempfile

    import jax

    config._fljax_cache_dir = tempfile.mkdtemp(prefix="fljax-test-jax-cache-")
    jax.config.update("jax_compilation_cache_dir", config._fljax_cache_dir)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def pytest_unconfigure(config):
    """Remove this process's compilation cache (it only serves one test session)."""
    import shutil

    if getattr(config, "_fljax_cache_dir", None):
        shutil.rmtree(config._fljax_cache_dir, ignore_errors=True)
