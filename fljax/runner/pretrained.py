"""The server's pretrained model: made by the project itself, once, and reused (AugFL spec §4).

A data set whose split gives the server its own labelled set (``data.server``, e.g. ``partition: meta_pairs``) can
also give it a frozen pretrained model (PM). A config's ``server:`` section names it::

    server: {pretrained: cnn_l, epochs: 60, lr: 0.001, batch_size: 128}

:func:`attach_pretrained` returns the data with the PM attached: ``server.pm_params``, and the PM's penultimate
features ``pm_features`` and logits ``pm_logits`` on the server's set (computed once: the PM is frozen and the set
unaugmented). The PM is trained centrally on the server's set (:func:`fljax.engine.central.pretrain`: optax Adam)
and saved in the project's checkpoint format (orbax, :class:`~fljax.runner.checkpoint.Checkpointer`) under
``<cache_dir>/pretrained/<model>-<key>/``, where the key hashes everything the PM depends on (the server set's
bytes, the architecture and its options, epochs, learning rate, batch size, seed). A later run — another seed, another
algorithm, another process — with the same server set and settings restores it instead of training it again. Its
accuracy on the server set and on the clients' test splits (the target clients' query sets) is recorded with it
(``pm_info``, shown in the data summary of every run).

``pretrain_data`` (spec D15's alternative, a Fig. 9-style domain study) pretrains the PM on another data set instead
of the server's set (:func:`related_set`: a pooled image data set with the clients' classes, its train and test pools
resized to the clients' input shape with ``jax.image.resize`` and standardised with its own scalar mean and std, e.g.
the MNIST subset resized to 8×8 for digits clients); the server's set stays the knowledge-transfer data. The other
alternative, a PM of the meta-model's own architecture, is ``server.pretrained: same``.

The PM reaches only the server: it lives in ``data.server``, which the round context exposes to the server update
(``ctx.server``) and never passes to a client (:meth:`fljax.engine.RoundContext.run_clients`).
"""
from __future__ import annotations

import hashlib
import json
import os

import jax
import jax.numpy as jnp
import numpy as np

from fljax.data.federated import FederatedData
from fljax.engine import RunLog, State, central
from fljax.errors import ConfigError

__all__ = ["with_server_model", "attach_pretrained", "pretrained_params", "related_set", "cache_root",
           "PRETRAIN_CALLS"]

PRETRAIN_CALLS = {"count": 0}  # how many PMs this process has trained (tests check the cache is used)


def cache_root(cache_dir: str | None) -> str:
    """``cache_dir``, else ``$FLJAX_CACHE``, else ``$XDG_CACHE_HOME/fljax`` (``~/.cache/fljax``)."""
    if cache_dir:
        return os.path.abspath(os.path.expanduser(cache_dir))
    if os.environ.get("FLJAX_CACHE"):
        return os.path.abspath(os.environ["FLJAX_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "fljax")


def _key(x, y, model, settings: dict) -> str:
    h = hashlib.sha256()
    h.update(np.asarray(x).tobytes())
    h.update(np.asarray(y).tobytes())
    h.update(json.dumps({"model": model.name, "module": repr(model.module), "input_shape": list(model.input_shape),
                         "classes": model.num_classes, **settings}, sort_keys=True, default=str).encode())
    return h.hexdigest()[:20]


def pretrained_params(model, server, *, epochs: int, lr: float, batch_size: int, seed: int,
                      cache_dir: str | None = None, data: tuple | None = None) -> tuple:
    """``(params, info, cached)``: the PM ``model`` trained on ``server`` (x, y) — or on ``data = (name, x, y)``, a
    related set — with these settings, restored from the cache when an earlier call saved it (``cached`` True), else
    trained and saved."""
    from fljax.runner.checkpoint import Checkpointer

    settings = {"epochs": epochs, "lr": lr, "batch_size": batch_size, "seed": seed}
    if data is not None:
        settings["data"] = data[0]
        server = server.replace(x=jnp.asarray(data[1]), y=jnp.asarray(data[2]))
    key_ = _key(server.x, server.y, model, settings)
    directory = os.path.join(cache_root(cache_dir), "pretrained", f"{model.name}-{key_}")
    key = jax.random.PRNGKey(seed)
    template = State(server=jax.eval_shape(model.init, key), clients=None, round=jnp.int32(0), key=key)
    if os.path.isdir(directory):
        with Checkpointer(directory) as ck:
            if ck.latest_round() is not None:
                state, log = ck.restore(template)
                return state.server, log.history[-1], True
    params, losses = central.pretrain(model, server.x, server.y, key, epochs=epochs, lr=lr, batch_size=batch_size)
    PRETRAIN_CALLS["count"] += 1
    info = {"model": model.name, **settings, "final_loss": float(losses[-1]) if losses else None,
            "server_acc": central.accuracy(model, params, server.x, server.y)}
    with Checkpointer(directory, max_to_keep=1) as ck:
        ck.save(State(server=params, clients=None, round=jnp.int32(epochs), key=key), RunLog(history=[info]))
    return params, info, False


def related_set(name: str, input_shape: tuple, num_classes: int, seed: int = 0, **options) -> tuple:
    """``(name, x, y)``: the pooled data set ``name`` (train and test pools together) as a PM's pretraining set for
    clients of ``input_shape`` and ``num_classes``: images resized to their height and width (``jax.image.resize``,
    linear), channels kept, then standardised with the set's own scalar mean and std."""
    from fljax.data.sources import SOURCES, Pooled, load_source

    source = load_source(name, num_clients=1, seed=seed, **options) if name in SOURCES else None
    if not isinstance(source, Pooled) or source.x_train.ndim != 4:
        raise ConfigError(f"server.pretrain_data must be a pooled image data set, got {name!r}.")
    if source.num_classes != num_classes or source.x_train.shape[-1] != input_shape[-1]:
        raise ConfigError(f"server.pretrain_data {name!r} has {source.num_classes} classes and "
                          f"{source.x_train.shape[-1]} channel(s); the server's labels need {num_classes} and "
                          f"{input_shape[-1]}.")
    x = np.concatenate([source.x_train, source.x_test])
    x = np.asarray(jax.image.resize(jnp.asarray(x), (x.shape[0], *input_shape), "linear"))
    x = (x - x.mean()) / max(float(x.std()), 1e-12)
    return name, x.astype(np.float32), np.concatenate([source.y_train, source.y_test]).astype(np.int32)


def with_server_model(exp, data: FederatedData) -> FederatedData:
    """``data`` with the pretrained model of experiment ``exp``'s ``server:`` section attached (``data`` itself
    when it names none): the model it names, or the experiment's own architecture with a head for the server's
    labels (``same``), trained once and then restored from the cache."""
    from fljax.experiment import build_model
    from fljax.models import make_model

    server = exp.config.server
    if server.pretrained is None:
        return data
    if server.pretrained == "same":
        pm = build_model(exp.model, data.replace(num_classes=data.server_classes))
    else:
        pm = make_model(server.pretrained, data.input_shape, data.server_classes, **server.pretrained_options)
    related = None
    if server.pretrain_data is not None:
        related = related_set(server.pretrain_data, data.input_shape, data.server_classes, server.seed,
                              **server.pretrain_data_options)
    return attach_pretrained(data, pm, epochs=server.epochs, lr=server.lr, batch_size=server.batch_size,
                             seed=server.seed, cache_dir=server.cache_dir, pretrain_data=related)


def attach_pretrained(data: FederatedData, model, *, epochs: int, lr: float, batch_size: int, seed: int,
                      cache_dir: str | None = None, pretrain_data: tuple | None = None) -> FederatedData:
    """``data`` with the server's pretrained ``model`` attached (trained once, then restored from the cache; see the
    module docstring); ``pretrain_data``: a :func:`related_set` to pretrain on instead of the server's set."""
    server = data.server
    if server is None:
        raise ConfigError("server.pretrained needs a data split that gives the server its own set (e.g. "
                          "data.partition: meta_pairs); this one has none.")
    params, info, _ = pretrained_params(model, server, epochs=epochs, lr=lr, batch_size=batch_size, seed=seed,
                                        cache_dir=cache_dir, data=pretrain_data)
    test = data.test
    k = data.num_train_clients
    scores = {}
    if pretrain_data is not None:  # trained elsewhere: its accuracy on the server's own set
        scores["server_set_acc"] = central.accuracy(model, params, server.x, server.y)
    if data.server_classes == data.num_classes:  # the clients share the PM's label space
        scores["client_test_acc"] = central.accuracy(model, params, test.x, test.y, test.mask)
        if data.num_target:
            scores["target_acc"] = central.accuracy(model, params, test.x[k:], test.y[k:], test.mask[k:])
    server = server.replace(pm_params=params, pm_features=central.features(model, params, server.x),
                            pm_logits=central.logits(model, params, server.x), pm_model=model,
                            pm_scores={n: jnp.float32(v) for n, v in scores.items()},
                            pm_info=tuple(sorted(info.items())))
    return data.replace(server=server)
