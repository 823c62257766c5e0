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
