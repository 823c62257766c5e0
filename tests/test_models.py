import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fljax.models import make_model

from conftest import assert_trees_close


@pytest.mark.parametrize("form", ["patches", "shifts"])
@pytest.mark.parametrize("name,shape", [("cnn1", (28, 28, 1)), ("cnn1", (32, 32, 3)), ("cnn1", (8, 8, 1)),
                                        ("cnn2", (32, 32, 3)), ("fedslr_cnn", (9, 9, 2))])
def test_conv_forms_equal_native_under_vmap(name, shape, form):
    """Every form computes the native convolution (SAME and VALID padding, stride 2 in fedslr_cnn, odd sizes),
    forward and backward, with per-client weights under vmap."""
    native = make_model(name, shape, 10, conv_impl="native")
    patches = native.with_conv(form)
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
    assert make_model("cnn2", (32, 32, 3), 10).num_params() == 122838  # QuPeD spec §7
    assert make_model("cnn1_s", (8, 8, 1), 10).num_params() == 72010  # QuPeD spec §12
    assert make_model("cnn2_s", (8, 8, 1), 10).num_params() == 123274


def _quantized_size(model):
    shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0))
    return sum(s.size for s, q in zip(jax.tree.leaves(shapes), jax.tree.leaves(model.quant_mask())) if q)


@pytest.mark.parametrize("name,shape,paths,size", [
    ("cnn1", (32, 32, 3), ["Conv_1/kernel", "Dense_0/kernel", "Dense_1/kernel"], 60480),
    ("cnn2", (32, 32, 3), ["Conv_1/kernel", "Conv_2/kernel", "Dense_0/kernel", "Dense_1/kernel"], 121280),
    ("cnn1_s", (8, 8, 1), ["Conv_1/kernel", "Dense_0/kernel", "Dense_1/kernel"], 70144),
    ("cnn2_s", (8, 8, 1), ["Conv_1/kernel", "Conv_2/kernel", "Dense_0/kernel", "Dense_1/kernel"], 121344),
])
def test_quant_mask_skips_first_and_last_layer(name, shape, paths, size):
    """QuPeD §7: every conv/dense kernel but the first and the last layer's is quantized (the §7 table's counts)."""
    from fljax import tree

    model = make_model(name, shape, 10)
    flags = jax.tree_util.tree_flatten_with_path(model.quant_mask())[0]
    assert sorted(tree.path_str(p) for p, q in flags if q) == paths
    assert _quantized_size(model) == size
    resnet = make_model("resnet18_gn", (32, 32, 3), 10)
    assert resnet.kernel_paths()[0] == "stem/kernel" and resnet.kernel_paths()[-1] == "head/kernel"


def test_pytorch_init_of_the_cnn_family():
    """D9 paper scale: kernels and biases ~ U(±1/√fan_in); the reduced scale: LeCun normal, zero biases."""
    p = jax.jit(make_model("cnn1", (32, 32, 3), 10, weight_init="pytorch").init)(jax.random.PRNGKey(0))
    for layer, fan in (("Conv_0", 75), ("Conv_1", 150), ("Dense_0", 400), ("head", 84)):
        for leaf in (p[layer]["kernel"], p[layer]["bias"]):
            assert float(jnp.max(jnp.abs(leaf))) <= fan ** -0.5
            assert float(jnp.max(jnp.abs(leaf))) > 0.8 * fan ** -0.5
    q = jax.jit(make_model("cnn1_s", (8, 8, 1), 10).init)(jax.random.PRNGKey(0))
    assert float(jnp.max(jnp.abs(q["Dense_0"]["bias"]))) == 0.0
    np.testing.assert_allclose(jnp.std(q["Dense_0"]["kernel"]), 128 ** -0.5, rtol=0.05)
    wide = make_model("cnn1", (32, 32, 3), 10, widths="tf_tutorial")
    assert jax.eval_shape(wide.init, jax.random.PRNGKey(0))["Dense_0"]["kernel"].shape == (5 * 5 * 64, 384)


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
