"""The persistent compilation cache (fljax/engine/compile_cache.py): on by default in the folder the environment
names, off with FLJAX_COMPILE_CACHE=0. Run in subprocesses: the test session keeps its own isolated cache."""
import os
import subprocess
import sys

SCRIPT = """
import jax, fljax
from fljax.engine import compile_cache
r = fljax.run(algorithm="fedavg", algo={"cohort_size": 2}, data={"dataset": "synthetic", "num_clients": 4, "max_samples": 20},
              model={"name": "logreg"}, rounds=1, eval_every=1)
print("CACHE", jax.config.jax_compilation_cache_dir)
"""


def _run(env_value):
    env = {k: v for k, v in os.environ.items() if k != "FLJAX_COMPILE_CACHE"}
    env["FLJAX_COMPILE_CACHE"] = env_value
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.split("CACHE ")[-1].strip()


def test_cache_in_the_named_folder_and_filled(tmp_path):
    folder = tmp_path / "jaxcache"
    assert _run(str(folder)) == str(folder)
    assert any(folder.iterdir())  # compiled programs were stored


def test_cache_off():
    assert _run("0") in ("None", "")
