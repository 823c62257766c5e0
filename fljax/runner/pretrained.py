"""The server's pretrained model: made by the project itself, once, and reused (AugFL spec §4).

A data set whose split gives the server its own labelled set (``data.server``, e.g. ``partition: meta_pairs``) can
also give it a frozen pretrained model (PM). A config's ``server:`` section names it::

    server: {pretrained: cnn_l, epochs: 60, lr: 0.001, batch_size: 128}

:func:`attach_pretrained` returns the data with the PM attached: ``server.pm_params``, and the PM's penultimate
features ``pm_features`` and logits ``pm_logits`` on the server's set (computed once: the PM is frozen and the set
unaugmented). The PM is trained centrally on the server's set (:func:`fljax.engine.central.pretrain`: optax Adam)
and kept in the pretrained-model cache (below), under a key that hashes everything the PM depends on (the server
set's bytes, the architecture and its options, epochs, learning rate, batch size, seed). A later run — another seed,
another algorithm, another process — with the same server set and settings reads it instead of training it again.
Its accuracy on the server set and on the clients' test splits (the target clients' query sets) is recorded with it
(``pm_info``, shown in the data summary of every run).

The cache (``<cache_dir>/pretrained/``, :func:`cache_root`) holds one directory per PM, ``<model>-<key>.pm/``, with
two files:

* ``params.msgpack``: the parameters, Flax's msgpack serialization (:func:`flax.serialization.to_bytes`; the arrays'
  exact bytes, so a PM read back equals the one trained, bit for bit);
* ``header.json``: ``format`` (``fljax-pretrained-model``) and ``format_version`` (1), ``fljax_version``, the
  ``model`` (name, module class and its options, input shape, classes), the ``data`` it was trained on (name, samples, the
  SHA-256 of its inputs' and labels' bytes), the ``training`` settings (epochs, lr, batch size, seed), its ``result``
  (final loss, accuracy on the training set) and ``params`` (the file, its size and SHA-256).

An entry is written into a temporary directory beside it and renamed when complete, so a crash never leaves a
partial entry (at most a hidden ``.<entry>.tmp-*`` directory) and two processes training the same PM keep whichever
finished first. An entry that cannot be read back — unreadable
header, another format, parameters whose checksum, structure or shapes are not the header's, a header describing
another PM — is damaged: it is moved aside to ``<entry>.damaged-<id>`` (kept for inspection, as damaged
checkpoints are), reported in one line naming it, and the PM is trained again. The cache of fljax before this
format (orbax checkpoint directories ``<model>-<key>/`` holding a run state) is not read: those directories are
ignored, their PMs trained once more into the new format, and can be deleted.

``pretrain_data`` (spec D15's alternative, a Fig. 9-style domain study) pretrains the PM on another data set instead
of the server's set (:func:`related_set`: a pooled image data set with the clients' classes, its train and test pools
resized to the clients' input shape with ``jax.image.resize`` and standardised with its own scalar mean and std, e.g.
the MNIST subset resized to 8×8 for digits clients); the server's set stays the knowledge-transfer data. The other
alternative, a PM of the meta-model's own architecture, is ``server.pretrained: same``.

The PM reaches only the server: it lives in ``data.server``, which the round context exposes to the server update
(``ctx.server``) and never passes to a client (:meth:`fljax.engine.RoundContext.run_clients`).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import uuid
from typing import Callable

import flax.serialization
import jax
import jax.numpy as jnp
import numpy as np

import fljax
from fljax.data.federated import FederatedData
from fljax.data.text import cache_root
from fljax.engine import central
from fljax.errors import ConfigError

__all__ = ["with_server_model", "attach_pretrained", "pretrained_params", "related_set", "cache_root",
           "read_entry", "write_entry", "DamagedEntry", "FORMAT", "FORMAT_VERSION", "PRETRAIN_CALLS"]

PRETRAIN_CALLS = {"count": 0}  # how many PMs this process has trained (tests check the cache is used)
FORMAT, FORMAT_VERSION = "fljax-pretrained-model", 1
HEADER, PARAMS = "header.json", "params.msgpack"


class DamagedEntry(ValueError):
    """A cache entry that cannot be read back (the message is one line naming it and why)."""


def _describe(model, x, y, name: str, settings: dict) -> dict:
    """What a PM is: the header's ``model``, ``data`` and ``training`` (the key hashes exactly these)."""
    digest = hashlib.sha256(np.asarray(x).tobytes())
    digest.update(np.asarray(y).tobytes())
    module = model.module
    options = {f.name: getattr(module, f.name) for f in dataclasses.fields(module)
               if f.init and f.name not in ("parent", "name")}
    return {"model": {"name": model.name, "module": type(module).__name__, "options": options,
                      "input_shape": list(model.input_shape), "classes": model.num_classes},
            "data": {"name": name, "samples": int(np.shape(x)[0]), "sha256": digest.hexdigest()},
            "training": settings}


def _key(described: dict) -> str:
    return hashlib.sha256(json.dumps({"format_version": FORMAT_VERSION, **described}, sort_keys=True,
                                     default=str).encode()).hexdigest()[:20]


def write_entry(directory: str, params, header: dict) -> None:
    """Write the cache entry ``directory`` (``params.msgpack`` and ``header.json``, the module docstring's format):
    into a temporary directory beside it, renamed when complete; when another process completed the same entry
    first, its entry is kept."""
    parent = os.path.dirname(directory)
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{os.path.basename(directory)}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    os.makedirs(tmp)
    try:
        data = flax.serialization.to_bytes(jax.device_get(params))
        with open(os.path.join(tmp, PARAMS), "wb") as f:
            f.write(data)
        header = {"format": FORMAT, "format_version": FORMAT_VERSION, "fljax_version": fljax.__version__, **header,
                  "params": {"file": PARAMS, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}}
        with open(os.path.join(tmp, HEADER), "w") as f:
            json.dump(header, f, indent=1, sort_keys=True, default=str)
        try:
            os.rename(tmp, directory)
        except OSError:
            if not os.path.isdir(directory):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def read_entry(directory: str, template, expected: dict | None = None) -> tuple:
    """``(params, header)`` of the cache entry ``directory``; ``template``: the parameters' structure, shapes and
    dtypes (``jax.ShapeDtypeStruct`` leaves); ``expected``: header fields it must hold (the PM asked for). Raises
    :class:`DamagedEntry` (one line naming the entry) when anything does not read back as written."""
    def damaged(why: str):
        return DamagedEntry(f"the pretrained-model cache entry {directory} is damaged ({why})")

    try:
        with open(os.path.join(directory, HEADER)) as f:
            header = json.load(f)
    except (OSError, ValueError) as e:
        raise damaged(f"{HEADER}: {(str(e).splitlines() or [type(e).__name__])[0]}") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT or header.get("format_version") != FORMAT_VERSION:
        raise damaged(f"{HEADER} is not a {FORMAT} header of version {FORMAT_VERSION}")
    for name, value in (expected or {}).items():
        if json.loads(json.dumps(value, default=str)) != header.get(name):
            raise damaged(f"{HEADER} describes another {name}")
    try:
        with open(os.path.join(directory, PARAMS), "rb") as f:
            data = f.read()
    except OSError as e:
        raise damaged(f"{PARAMS}: {e.strerror or e}") from None
    recorded = header.get("params") or {}
    if hashlib.sha256(data).hexdigest() != recorded.get("sha256"):
        raise damaged(f"{PARAMS} does not match the checksum its header records")
    try:
        params = flax.serialization.from_state_dict(template, flax.serialization.msgpack_restore(data))
    except Exception as e:  # noqa: BLE001 - whatever fails while decoding, the entry is unusable
        raise damaged(f"{PARAMS}: {(str(e).splitlines() or [type(e).__name__])[0][:160]}") from None
    shapes = jax.tree.map(lambda a: (tuple(np.shape(a)), str(np.asarray(a).dtype)), params)
    if jax.tree.structure(params) != jax.tree.structure(template) or shapes != jax.tree.map(
            lambda t: (tuple(t.shape), str(t.dtype)), template):
        raise damaged(f"{PARAMS} holds parameters of other shapes than the model's")
    return jax.tree.map(jnp.asarray, params), header


def pretrained_params(model, server, *, epochs: int, lr: float, batch_size: int, seed: int,
                      cache_dir: str | None = None, data: tuple | None = None,
                      warn: Callable[[str], None] = print) -> tuple:
    """``(params, info, cached)``: the PM ``model`` trained on ``server`` (x, y) — or on ``data = (name, x, y)``, a
    related set — with these settings, read from the cache when an earlier call wrote it (``cached`` True), else
    trained and written there. A damaged entry is moved aside, reported by ``warn`` in one line, and the PM trained
    again (module docstring)."""
    settings = {"epochs": epochs, "lr": lr, "batch_size": batch_size, "seed": seed}
    name = "server set"
    if data is not None:
        name = settings["data"] = data[0]
        server = server.replace(x=jnp.asarray(data[1]), y=jnp.asarray(data[2]))
    described = _describe(model, server.x, server.y, name, settings)
    directory = os.path.join(cache_root(cache_dir), "pretrained", f"{model.name}-{_key(described)}.pm")
    key = jax.random.PRNGKey(seed)
    if os.path.isdir(directory):
        try:
            params, header = read_entry(directory, jax.eval_shape(model.init, key), described)
            return params, {"model": model.name, **settings, **header["result"]}, True
        except DamagedEntry as e:
            aside = f"{directory}.damaged-{uuid.uuid4().hex[:8]}"
            os.rename(directory, aside)
            warn(f"{e}; moved it to {os.path.basename(aside)} and trained the model again")
    params, losses = central.pretrain(model, server.x, server.y, key, epochs=epochs, lr=lr, batch_size=batch_size)
    PRETRAIN_CALLS["count"] += 1
    result = {"final_loss": float(losses[-1]) if losses else None,
              "server_acc": central.accuracy(model, params, server.x, server.y)}
    write_entry(directory, params, {**described, "result": result})
    return params, {"model": model.name, **settings, **result}, False


def related_set(name: str, input_shape: tuple, num_classes: int, seed: int = 0, **options) -> tuple:
    """``(name, x, y)``: the pooled data set ``name`` (train and test pools together) as a PM's pretraining set for
    clients of ``input_shape`` and ``num_classes``: images resized to their height and width (``jax.image.resize``,
    linear), channels kept, then standardised with the set's own scalar mean and std."""
    from fljax.data import SOURCES, Pooled, load_source

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


def with_server_model(exp, data: FederatedData, warn: Callable[[str], None] = print) -> FederatedData:
    """``data`` with the pretrained model of experiment ``exp``'s ``server:`` section attached (``data`` itself
    when it names none): the model it names, or the experiment's own architecture with a head for the server's
    labels (``same``), trained once and then read from the cache (``warn``: where a damaged cache entry is
    reported)."""
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
                             seed=server.seed, cache_dir=server.cache_dir, pretrain_data=related, warn=warn)


def attach_pretrained(data: FederatedData, model, *, epochs: int, lr: float, batch_size: int, seed: int,
                      cache_dir: str | None = None, pretrain_data: tuple | None = None,
                      warn: Callable[[str], None] = print) -> FederatedData:
    """``data`` with the server's pretrained ``model`` attached (trained once, then read from the cache; see the
    module docstring); ``pretrain_data``: a :func:`related_set` to pretrain on instead of the server's set."""
    server = data.server
    if server is None:
        raise ConfigError("server.pretrained needs a data split that gives the server its own set (e.g. "
                          "data.partition: meta_pairs); this one has none.")
    params, info, _ = pretrained_params(model, server, epochs=epochs, lr=lr, batch_size=batch_size, seed=seed,
                                        cache_dir=cache_dir, data=pretrain_data, warn=warn)
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
