"""Local epochs run only each client's active steps (fljax.algorithms.local_training.run_steps): the bounded while loop
gives what the full masked scan over the population's K scheduled steps gives, one client at a time and under vmap
(a cohort runs as many trips as its largest member), for every unroll; it runs exactly E·⌈n_i/B⌉ steps."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fljax.algorithms.local_training import run_steps
from fljax.data import ClientArrays
from fljax.data.batching import BatchPlan, gather_batch
from fljax import tree

SIZES = [3, 11, 7, 1]  # ragged: with B = 4, 1, 3, 2 and 1 steps per epoch; K = 3 per epoch


def _clients():
    rng = np.random.default_rng(0)
    n_max = max(SIZES)
    x = rng.normal(size=(len(SIZES), n_max, 5)).astype(np.float32)
    y = rng.normal(size=(len(SIZES), n_max)).astype(np.float32)
    mask = np.arange(n_max)[None] < np.asarray(SIZES)[:, None]
    return ClientArrays(x=jnp.asarray(x), y=jnp.asarray(y), mask=jnp.asarray(mask),
                        count=jnp.asarray(SIZES, jnp.int32), n_min=min(SIZES), n_max=n_max)


def _step(carry, batch, key):
    """An SGD step of least squares plus a key-dependent term (the step's own key must reach it), counting steps."""
    w, n = carry

    def loss(w):
        r = (batch.x @ w - batch.y) * batch.mask
        return jnp.sum(r ** 2) / jnp.maximum(jnp.sum(batch.mask), 1)

    value, g = jax.value_and_grad(loss)(w)
    return (w - 0.1 * g + 1e-3 * jax.random.normal(key, w.shape), n + 1), value


def _masked_scan(carry, train, plan, key):
    """The definition: every one of the K scheduled steps, the inactive ones leaving the carry as it was."""
    k_sched, k_steps = jax.random.split(key)
    idx, mask, active = plan.schedule(k_sched, train.count, train.n_min, train.n_max)
    keys = jax.random.split(k_steps, idx.shape[0])

    def body(c, inputs):
        i, m, a, kk = inputs
        new_c, loss = _step(c, gather_batch(train.x, train.y, i, m), kk)
        return tree.where(a, new_c, c), (loss, a)

    carry, (losses, act) = jax.lax.scan(body, carry, (idx, mask, active, keys))
    act = act.astype(jnp.float32)
    return carry, jnp.sum(losses * act) / jnp.maximum(jnp.sum(act), 1.0)


@pytest.mark.parametrize("epochs", [1, 2])
@pytest.mark.parametrize("unroll", [1, 2, 3])
def test_bounded_steps_equal_the_masked_scan_per_client_and_under_vmap(epochs, unroll):
    data, plan = _clients(), BatchPlan(batch_size=4, epochs=epochs)
    assert not plan.every_step_active(data.n_min, data.n_max)  # the bounded path is the one under test
    keys = jax.random.split(jax.random.PRNGKey(3), len(SIZES))
    carry0 = (jnp.zeros(5), jnp.int32(0))
    one = lambda t, k: run_steps(_step, carry0, t, plan, k, unroll)  # noqa: E731
    want = [jax.jit(_masked_scan, static_argnums=2)(carry0, jax.tree.map(lambda a: a[i], data), plan, keys[i])
            for i in range(len(SIZES))]
    loop = [jax.jit(one)(jax.tree.map(lambda a: a[i], data), keys[i]) for i in range(len(SIZES))]
    (w_v, n_v), loss_v = jax.jit(jax.vmap(one))(data, keys)
    for i, n in enumerate(SIZES):
        (w_want, n_want), loss_want = want[i]
        (w_loop, n_loop), loss_loop = loop[i]
        assert int(n_want) == int(n_loop) == int(n_v[i]) == epochs * -(-n // 4)  # exactly its own steps
        np.testing.assert_allclose(w_loop, w_want, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(w_v[i], w_want, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose([loss_loop, loss_v[i]], [loss_want] * 2, rtol=1e-6)


def test_every_step_active_keeps_the_scan():
    """local_steps mode (every step active) takes the scan, as before the change."""
    data, plan = _clients(), BatchPlan(batch_size=4, steps=3)
    assert plan.every_step_active(data.n_min, data.n_max)
    carry0 = (jnp.zeros(5), jnp.int32(0))
    train, key = jax.tree.map(lambda a: a[1], data), jax.random.PRNGKey(0)
    (w, n), loss = jax.jit(lambda t, k: run_steps(_step, carry0, t, plan, k))(train, key)
    (w_want, _), loss_want = jax.jit(_masked_scan, static_argnums=2)(carry0, train, plan, key)
    assert int(n) == 3
    np.testing.assert_array_equal(w, w_want)
    np.testing.assert_array_equal(loss, loss_want)


def _first_steps(carry, train, plan, key, budget):
    """A straggler's budget by its definition: walk the schedule and run its active steps until ``budget`` of them
    have run (a plain Python loop)."""
    k_sched, k_steps = jax.random.split(key)
    idx, mask, active = plan.schedule(k_sched, train.count, train.n_min, train.n_max)
    keys = jax.random.split(k_steps, idx.shape[0])
    done = 0
    for j in range(idx.shape[0]):
        if bool(active[j]) and done < budget:
            carry, _ = _step(carry, gather_batch(train.x, train.y, idx[j], mask[j]), keys[j])
            done += 1
    return carry


@pytest.mark.parametrize("plan", [BatchPlan(batch_size=4, epochs=2), BatchPlan(batch_size=4, steps=3)])
@pytest.mark.parametrize("unroll", [1, 2])
def test_a_step_budget_runs_the_first_active_steps_only(plan, unroll):
    """ClientInput.steps (a participation's straggler budget) reaches run_steps as ``budget``: exactly the first
    ``budget`` active steps of the schedule run, on the scan path (local steps) and the bounded one (local epochs),
    one client at a time and under vmap with a budget per client."""
    data = _clients()
    keys = jax.random.split(jax.random.PRNGKey(5), len(SIZES))
    carry0 = (jnp.zeros(5), jnp.int32(0))
    budgets = jnp.asarray([0, 1, 2, 5], jnp.int32)
    got = jax.jit(jax.vmap(lambda t, k, b: run_steps(_step, carry0, t, plan, k, unroll, budget=b)))(data, keys,
                                                                                                   budgets)
    (w_v, n_v), _ = got
    for i in range(len(SIZES)):
        train = jax.tree.map(lambda a: a[i], data)
        w_want, n_want = _first_steps(carry0, train, plan, keys[i], int(budgets[i]))
        (w_one, n_one), _ = jax.jit(lambda t, k: run_steps(_step, carry0, t, plan, k, unroll,
                                                           budget=budgets[i]))(train, keys[i])
        assert int(n_v[i]) == int(n_one) == int(n_want)
        np.testing.assert_allclose(w_v[i], w_want, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(w_one, w_want, rtol=1e-6, atol=1e-7)
    assert int(n_v[0]) == 0 and int(n_v[3]) < 5  # a zero budget trains nothing; a large one is capped by the plan
