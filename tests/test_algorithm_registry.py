"""Algorithms as values with one registration (issue 37, point 3): the local training and the server optimizer are
option values an algorithm holds, taken flat (``algo.lr``, ``algo.server_lr``); each algorithm registers itself next
to its class, and the registry, the families, the key hints and ``fljax list`` are derived from that registration;
no algorithm is more than four classes from :class:`~fljax.algorithms.base.Algorithm`; an algorithm defined in a
user's own module registers and runs like a built-in one."""
import functools
import glob
import importlib
import os
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml

import fljax
from fljax.algorithms import ALGORITHMS, APFL, Algorithm, LocalTraining, make_algorithm, register
from fljax.algorithms.families import families, family
from fljax.algorithms.registry import declarations, option_names
from fljax.errors import OptionError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@functools.cache
def _depth(cls) -> int:
    """Classes on the longest path from ``cls`` up to Algorithm (mixins that are not algorithms do not count)."""
    return 0 if cls is Algorithm else 1 + max(_depth(b) for b in cls.__bases__ if issubclass(b, Algorithm))


def test_no_algorithm_is_more_than_four_classes_from_the_template_nor_built_from_generated_bases():
    deep = {name: _depth(cls) for name, cls in ALGORITHMS.items() if _depth(cls) > 4}
    assert not deep, f"these derive from more than 4 classes between them and Algorithm: {deep}"
    assert _depth(ALGORITHMS["lg_fedavg"]) == 4 and _depth(ALGORITHMS["local"]) == 2  # the measure itself
    generated = [p for p in glob.glob(os.path.join(ROOT, "fljax", "algorithms", "*.py"))
                 if "make_dataclass" in open(p, encoding="utf-8").read()]
    assert not generated, generated


def test_every_registration_is_complete_and_its_example_config_runs_that_algorithm():
    for name, cls in ALGORITHMS.items():
        assert cls.name == name and cls.family and cls.summary and "\n" not in cls.summary, name
        if cls.example is not None:
            with open(os.path.join(ROOT, cls.example), encoding="utf-8") as f:
                assert yaml.safe_load(f)["algorithm"] == name, cls.example
        if cls.untuned is not None:
            assert cls.untuned[0] in declarations(cls), name
    listed = [n for names in families().values() for n in names]
    assert sorted(listed) == sorted(ALGORITHMS)  # every algorithm in exactly one family
    assert families()["one global model"][:3] == ("fedavg", "fedprox", "fedavg_ft") and family("nope") == "other"


def test_local_training_and_server_optimizer_are_values_taken_flat():
    """The flat names reach the value an algorithm holds (constructing, replacing, tracing), and an option the
    algorithm does not take cannot be slipped in through the value."""
    algo = make_algorithm("fedavg", lr=0.05, local_steps=3, server_optimizer="adam", server_lr=0.01)
    assert (algo.local.lr, algo.local.local_steps, algo.server.server_optimizer, algo.server.server_lr) == \
        (0.05, 3, "adam", 0.01)
    hp = algo.hyperparameters()
    assert hp["lr"] == 0.05 and hp["server_lr"] == 0.01 and "local" not in hp and "server" not in hp
    assert make_algorithm("fedavg", **hp) == algo  # flat in, flat out
    moved = algo.with_values(lr=0.2, server_lr=0.5, eval_model="stored")
    assert (moved.local.lr, moved.server.server_lr, moved.eval_model) == (0.2, 0.5, "stored")
    assert moved.local.local_steps == 3 and algo.local.lr == 0.05  # the rest kept; the original unchanged
    traced = jax.jit(lambda lr: algo.with_values(lr=lr).local.lr_at(2))(jnp.float32(0.3))  # a lane's value
    np.testing.assert_allclose(float(traced), 0.3 * algo.local.lr_decay ** 2, rtol=1e-6)
    with pytest.raises(OptionError, match="^optimizer is not a valid key for algorithm 'apfl'"):
        make_algorithm("apfl", optimizer="adam")  # APFL's coupled steps are plain SGD: it takes no optimizer
    with pytest.raises(OptionError, match="^momentum is not an option of APFL"):
        APFL(local=LocalTraining(momentum=0.9))
    with pytest.raises(OptionError, match="^lr must be > 0"):
        make_algorithm("fedavg", lr=-1)  # LocalTraining's own check, named by the flat key
    with pytest.raises(OptionError, match="^server_beta1 "):
        make_algorithm("fedavg", server_beta1=0.9)  # ServerOptimizer's check across its options


_MODULE = '''
"""A user's own algorithm, in a module of their own: FedAvg whose server moves only part of the way,
w_{t+1} = w_t + γ (A_t − w_t) (γ = 1: FedAvg)."""
import dataclasses

from fljax import tree
from fljax.algorithms import Aggregating, ClientResult, LocalTraining, register
from fljax.algorithms.local_training import local_training
from fljax.options import interval, option


@register("partial_step", family="one global model", example=None,
          summary="FedAvg whose server steps a fraction gamma of the way to the clients' mean")
@dataclasses.dataclass(frozen=True, kw_only=True)
class PartialStep(Aggregating):
    local: LocalTraining = local_training("lr", "batch_size", "local_steps", lr=0.05)
    gamma: float = option(0.5, "fraction γ of the way from w_t to the clients' mean A_t", interval(0, 1, "(]"))

    def init(self, ctx):
        return {"params": ctx.model.init(self.init_key(ctx))}, {}

    def client_update(self, inp):
        params, loss = self.local.train(inp.model.loss, inp.down, inp)
        return ClientResult(state=inp.state, upload=params, weight=inp.train.count, metrics={"train_loss": loss})

    def server_step(self, ctx, server, aggregate):
        return {"params": tree.axpy(self.gamma, tree.sub(aggregate, server["params"]), server["params"])}

    def eval_shared(self, server):
        return server["params"]

    def global_params(self, shared):
        return shared
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "my_algorithms.py").write_text(textwrap.dedent(_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield importlib.import_module("my_algorithms")
    ALGORITHMS.pop("partial_step", None)
    sys.modules.pop("my_algorithms", None)


def test_an_algorithm_of_a_users_own_module_registers_lists_and_runs(user_module, capsys):
    from fljax.cli import main

    cls = user_module.PartialStep
    assert ALGORITHMS["partial_step"] is cls and "partial_step" in families()["one global model"]
    assert {"gamma", "lr", "local_steps"} <= option_names() and "momentum" not in declarations(cls)
    with pytest.raises(OptionError, match="did you mean algo.gamma"):
        fljax.make_config(gamma=0.5)
    with pytest.raises(OptionError, match="^momentum is not a valid key for algorithm 'partial_step'"):
        make_algorithm("partial_step", momentum=0.9)
    assert main(["list"]) == 0 and "partial_step" in capsys.readouterr().out
    assert main(["list", "partial_step"]) == 0
    shown = capsys.readouterr().out
    assert "  gamma (float, default 0.5): fraction γ of the way" in shown and "  lr (float, default 0.05)" in shown
    # it runs as any algorithm; with γ = 1 its server is FedAvg's (w_{t+1} = A_t), bit for bit
    base = {"data": {"dataset": "digits", "num_clients": 8}, "model": {"name": "mlp", "options": {"hidden": [8]}},
            "rounds": 2, "eval_every": 2}
    algo = {"cohort_size": 4, "lr": 0.05, "batch_size": 10, "local_steps": 2}
    mine = fljax.run({**base, "algorithm": "partial_step", "algo": {**algo, "gamma": 1.0}}, progress=False).final
    fedavg = fljax.run({**base, "algorithm": "fedavg", "algo": algo}, progress=False).final
    assert mine["global_acc"] == fedavg["global_acc"] and mine["train_loss"] == fedavg["train_loss"]
    half = fljax.run({**base, "algorithm": "partial_step", "algo": {**algo, "gamma": 0.5}}, progress=False).final
    assert half["global_loss"] != mine["global_loss"]  # γ reaches the server step


def test_a_registration_that_cannot_work_is_refused_in_one_line():
    import dataclasses

    class NotAData(Algorithm):
        pass

    with pytest.raises(TypeError, match="is not a frozen dataclass"):
        register("x_bad", family="f", summary="s")(NotAData)
    with pytest.raises(ValueError, match="'fedavg' is already registered by FedAvg"):
        register("fedavg", family="f", summary="s")(dataclasses.dataclass(frozen=True, kw_only=True)(
            type("Other", (Algorithm,), {})))
    undocumented = dataclasses.dataclass(frozen=True, kw_only=True)(
        type("Undoc", (Algorithm,), {"__annotations__": {"k": int}, "k": 1}))
    with pytest.raises(TypeError, match=r"declares \['k'\] without a doc"):
        register("x_undoc", family="f", summary="s")(undocumented)
    with pytest.raises(ValueError, match="untuned names 'nope'"):
        register("x_untuned", family="f", summary="s", untuned=("nope", "n"))(
            dataclasses.dataclass(frozen=True, kw_only=True)(type("U2", (Algorithm,), {})))
    assert not {"x_bad", "x_undoc", "x_untuned"} & set(ALGORITHMS)
