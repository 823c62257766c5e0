"""fljax.ops.schedule: QuPeD §14 T8 (λ(e) and η(e) at chosen epochs; the r-rule κ reproduces S = r·σ₀)."""
import jax
import numpy as np
import pytest

from fljax.ops import schedule as S


def test_epoch_clock_and_decay():
    assert [int(S.epoch_of(t, 11)) for t in (0, 10, 11, 21, 22, 1099)] == [1, 1, 2, 2, 3, 100]
    np.testing.assert_allclose(S.exp_decay(0.1, 0.99, 1), 0.1)
    np.testing.assert_allclose(S.exp_decay(0.1, 0.99, 250), 0.1 * 0.99 ** 249, rtol=1e-5)
    np.testing.assert_allclose(S.epoch_continuous(22, 11), 3.0)
    np.testing.assert_allclose(S.epoch_continuous(5, 10), 1.5)


@pytest.mark.parametrize("e", [1, 7, 80])
def test_penalty_lambda_rules(e):
    """QuPeD §6: 2-bit 1e-6·e; 1-bit 5e-7·e/0.99^e (CIFAR-10)."""
    np.testing.assert_allclose(S.penalty_lambda(1e-6, e, 0.99, False), 1e-6 * e, rtol=1e-6)
    np.testing.assert_allclose(S.penalty_lambda(5e-7, e, 0.99, True), 5e-7 * e / 0.99 ** e, rtol=1e-5)


@pytest.mark.parametrize("compensated,r", [(False, 0.3), (True, 0.5)])
def test_r_rule_kappa_reproduces_cumulative_pull(compensated, r):
    """Summing λ(e_t)·η(e_t)/2 over every iteration t < T_ft with the r-rule's κ gives r·σ₀ (spec §6, §12:
    E = 100, E_ft = 20, I = 11, γ = 0.99^2.5)."""
    with jax.enable_x64(True):
        epochs, ft, iters, lr0, sigma0 = 100, 20, 11, 0.1, 0.0437
        gamma = S.rescaled_gamma(epochs)
        np.testing.assert_allclose(gamma, 0.99 ** 2.5)
        kappa = float(S.penalty_kappa(r, sigma0, epochs - ft, iters, lr0, gamma, compensated))
        pull = 0.0
        for t in range((epochs - ft) * iters):
            e = int(S.epoch_of(t, iters))
            pull += float(S.penalty_lambda(kappa, e, gamma, compensated) * S.exp_decay(lr0, gamma, e)) / 2
        np.testing.assert_allclose(pull, r * sigma0, rtol=1e-6)


def test_paper_scale_pull_matches_spec():
    """Spec §6: with the paper's κ on CIFAR-10 (E = 250, E_ft = 50, I = 40) the cumulative pull is about 0.012
    (2-bit, 1e-6·e) and 0.020 (1-bit, 5e-7·e/0.99^e); on FEMNIST (E = 30, E_ft = 5, I = 60) 0.004 / 0.001."""
    def pull(kappa, epochs, iters, compensated):
        return float(S.penalty_kappa(1.0, 1.0, epochs, iters, 0.1, 0.99, compensated)) ** -1 * kappa
    assert pull(1e-6, 200, 40, False) == pytest.approx(0.012, abs=0.001)
    assert pull(5e-7, 200, 40, True) == pytest.approx(0.020, abs=0.001)
    assert pull(5e-6, 25, 60, False) == pytest.approx(0.004, abs=0.0005)
    assert pull(1e-6, 25, 60, True) == pytest.approx(0.001, abs=0.0005)


def test_center_lr_rule():
    """Spec §12: η₂ = 1e-4·20160/l̄ (CNN1: 1e-4; CNN1-S 70,144/3 → 8.6e-5; CNN2-S 121,216/4 → 6.6e-5)."""
    assert S.center_lr(60480 / 3) == pytest.approx(1e-4)
    assert S.center_lr(70144 / 3) == pytest.approx(8.6e-5, rel=0.01)
    assert S.center_lr((4608 + 18432 + 65536 + 32768) / 4) == pytest.approx(6.6e-5, rel=0.01)
