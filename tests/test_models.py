import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fljax.models import make_model

from conftest import assert_trees_close


@pytest.mark.parametrize("name,shape", [("cnn1", (28, 28, 1)), ("cnn1", (32, 32, 3)), ("cnn1", (8, 8, 1))])
def test_patches_conv_equals_native_under_vmap(name, shape):
    native = make_model(name, shape, 10, conv_impl="native")
    patches = native.with_conv("patches")
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    params = jax.vmap(native.init)(keys)  # per-client weights
    x = jax.random.normal(jax.random.PRNGKey(1), (3, 4) + shape)
    y = jnp.zeros((3, 4), jnp.int32)
    f = lambda m: jax.vmap(lambda p, xi: m.apply(p, xi))(params, x)
    np.testing.assert_allclose(f(native), f(patches), rtol=1e-4, atol=1e-5)
    from fljax.data import Batch
    g = lambda m: jax.vmap(jax.grad(lambda p, xi, yi: m.loss(p, Batch(xi, yi, jnp.ones(4, bool)))))(params, x, y)
    assert_trees_close(g(native), g(patches), rtol=1e-3, atol=1e-5)


def test_parameter_counts_match_papers():
    assert make_model("cnn1", (32, 32, 3), 10).num_params() == 62006  # QuPeD spec §7
    assert make_model("cnn1", (28, 28, 1), 10).num_params() == 61706
    assert make_model("resnet18_gn", (32, 32, 3), 10).num_params() == 11173952  # FedSLR spec §7


def test_model_errors():
    with pytest.raises(ValueError, match="Did you mean 'mlp'"):
        make_model("mpl", (10,), 3)
    with pytest.raises(ValueError, match="it needs images"):
        make_model("cnn1", (60,), 10)


def test_max_pool_2x2_equals_flax_max_pool():
    import flax.linen as nn

    from fljax.models.layers import max_pool_2x2

    for shape in [(2, 8, 8, 3), (1, 7, 5, 2)]:
        x = jax.random.normal(jax.random.PRNGKey(0), shape)
        np.testing.assert_array_equal(max_pool_2x2(x), nn.max_pool(x, (2, 2), (2, 2)))
        g1 = jax.grad(lambda z: jnp.sum(max_pool_2x2(z) ** 2))(x)
        g2 = jax.grad(lambda z: jnp.sum(nn.max_pool(z, (2, 2), (2, 2)) ** 2))(x)
        np.testing.assert_allclose(g1, g2, rtol=1e-6)


def test_fedslr_cnn_matches_the_spec():
    """FedSLR spec §8: 23,648 parameters, no biases, nuclear-norm matrices (96,3), (192,96), (64,64), (64,10);
    PyTorch-equivalent init (D17): kernels ~ U(±1/√fan_in)."""
    from fljax.ops.prox import matricize

    model = make_model("fedslr_cnn", (8, 8, 1), 10)
    params = model.init(jax.random.PRNGKey(0))
    assert model.num_params() == 23648 and "head" in params
    assert not any("bias" in k for k in params["Conv_0"]) and set(params["head"]) == {"kernel"}
    assert [matricize(x).shape for x in jax.tree.leaves(params) if x.ndim >= 2] == [(96, 3), (192, 96), (64, 64),
                                                                                  (64, 10)]
    k = np.asarray(params["Conv_1"]["kernel"])
    bound = 1 / np.sqrt(3 * 3 * 32)
    assert np.abs(k).max() <= bound and np.abs(k).max() > 0.95 * bound
    assert abs(k.std() - bound / np.sqrt(3)) < 0.05 * bound  # uniform on [-b, b]
    flax_init = make_model("fedslr_cnn", (8, 8, 1), 10, weight_init="flax").init(jax.random.PRNGKey(0))
    assert np.abs(np.asarray(flax_init["Conv_1"]["kernel"])).max() > bound  # lecun normal is unbounded
    with pytest.raises(ValueError, match="weight_init must be one of"):
        make_model("fedslr_cnn", (8, 8, 1), 10, weight_init="torch")
