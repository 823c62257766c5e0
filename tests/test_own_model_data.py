"""Bring your own model and data: per-client arrays (fljax.data.from_arrays) and Flax modules (own_model), each
bad input refused in one line."""
import flax.linen as nn
import numpy as np
import pytest

from fljax.data import DataError, from_arrays
from fljax.errors import OptionError
from fljax.models.model import own_model


def _pairs(n=3, dim=4):
    rng = np.random.default_rng(0)
    return [(rng.normal(size=(5 + i, dim)).astype(np.float32), np.arange(5 + i) % 3) for i in range(n)]


def test_from_arrays_pads_clients_and_keeps_every_sample():
    train, test = _pairs(), _pairs()
    data = from_arrays(train=train, test=test)
    assert (data.num_clients, data.num_classes, data.input_shape) == (3, 3, (4,))
    assert list(np.asarray(data.train.count)) == [5, 6, 7]
    np.testing.assert_array_equal(np.asarray(data.train.x[2, :7]), train[2][0])
    assert not np.asarray(data.train.mask[0, 5:]).any()


@pytest.mark.parametrize("train,test,match", [
    ([], _pairs(), "train must be a non-empty list of \\(x, y\\) pairs"),
    (_pairs(), _pairs(2), "one \\(x, y\\) pair per client: 3 train pairs, 2 test pairs"),
    ([(np.ones((3, 4)), np.ones(3))], _pairs(1), "y must be a 1-d array of integer labels"),
    ([(np.ones((3, 4)), np.arange(2))], _pairs(1), "x must hold one row per label \\(2\\)"),
    ([(np.ones((0, 4)), np.arange(0))], _pairs(1), "client 0 has no samples"),
    ([(np.full((2, 4), np.nan), np.arange(2))], _pairs(1), "x holds NaN or Inf"),
    ([(np.ones((2, 5)), np.arange(2))], _pairs(1), "same shape per sample"),
    ([(np.ones((2, 4)), np.array([0, -1]))], _pairs(1), "labels must be in \\[0, 3\\)"),
])
def test_from_arrays_refuses_bad_input_in_one_line(train, test, match):
    with pytest.raises(DataError, match=match) as e:
        from_arrays(train=train, test=test)
    assert "\n" not in str(e.value)


class _Dropout(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(3)(nn.Dropout(0.5, deterministic=False)(x))


class _FixedBatchNorm(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(3)(nn.BatchNorm(use_running_average=False)(x))


class _Counter(nn.Module):
    @nn.compact
    def __call__(self, x):
        self.variable("counts", "n", lambda: 0)
        return nn.Dense(3)(x)


def test_own_model_accepts_a_plain_module_and_refuses_what_it_cannot_run():
    model = own_model(nn.Dense(3), (4,), 3)
    assert model.name == "Dense" and model.num_params() == 15
    with pytest.raises(OptionError, match="_Dropout has Dropout: its __call__ must take train: bool"):
        own_model(_Dropout(), (4,), 3)
    with pytest.raises(OptionError, match="_FixedBatchNorm has BatchNorm: its __call__ must take train: bool"):
        own_model(_FixedBatchNorm(), (4,), 3)
    with pytest.raises(OptionError, match="_Counter keeps variables \\['counts'\\] besides its params: only "
                                          "BatchNorm's 'batch_stats' is supported"):
        own_model(_Counter(), (4,), 3)
    with pytest.raises(OptionError, match="must return logits of shape \\[batch, 3\\], got \\(2, 5\\)"):
        own_model(nn.Dense(5), (4,), 3)
    with pytest.raises(OptionError, match="must be a flax.linen Module, got str"):
        own_model("mlp", (4,), 3)


class _ImageCNN(nn.Module):
    """A user's small CNN for [batch, H, W, C] images."""

    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(4, (3, 3))(x))
        return nn.Dense(10)(x.reshape((x.shape[0], -1)))


def test_a_model_for_inputs_of_another_rank_is_refused_in_one_line_naming_both_shapes():
    """A CNN on vector data: one line naming the model, the inputs its convolution takes and the data's shape
    (not numpy's broadcasting error from inside the module)."""
    import fljax

    config = {"data": {"dataset": "synthetic", "num_clients": 4}, "algo": {"cohort_size": 2}, "rounds": 1}
    shape = fljax.api.load_data(config).input_shape
    assert len(shape) == 1  # vectors: the rank the CNN cannot take
    with pytest.raises(OptionError) as e:
        fljax.run(config, model=_ImageCNN(), progress=False)
    text = str(e.value)
    assert "\n" not in text and "broadcast" not in text
    assert "_ImageCNN takes inputs [batch, H, W, channels] (its first Conv, kernel (3, 3))" in text
    assert f"inputs of shape {tuple(shape)}" in text and "'synthetic" in text


def test_without_a_config_the_api_starts_where_the_command_line_does():
    """``fljax.run(model=MyCNN())`` with no config: the command line's quick-start preset (digits images), the
    same config as ``fljax run`` with the same choices, on which a user's CNN trains."""
    import fljax
    from fljax.cli import _load, make_parser

    cli = _load(make_parser().parse_args(["run", "--algorithm", "fedprox", "--set", "rounds=1"])).config
    assert fljax.make_config(algorithm="fedprox", rounds=1) == cli
    assert cli.data.dataset == "digits"
    result = fljax.run(model=_ImageCNN(), rounds=1, eval_every=1, progress=False)
    assert result.runs[0].data.input_shape == (8, 8, 1) and 0 <= result.final["personal_acc"] <= 1
