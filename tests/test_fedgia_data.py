"""FedGiA's data (fljax.problems.fedgia_data): the V.1 generator and its quirks, qot splits, size-class packing."""
import itertools

import numpy as np
import pytest

from fljax.problems import pack_trials, qot_instance, size_blocks, v1_instance


def uniform_rows_expected(seed, m, n, block_len):
    """Replay the generator's draws up to the permutation P and count the rows the U[−5, 5] blocks cover (spec §5.1
    steps 1–5): block j starts at client P_{q1+j}'s offset and has length d_j (loop counter) or d_{P_{q1+j}}."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(50, 151, size=m)
    d = int(sizes.sum())
    rng.standard_normal((d, n))
    rng.standard_normal(d)
    perm = rng.permutation(m)
    start = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    q1 = -(-m // 3)
    q2 = -(-2 * m // 3) - q1
    covered = np.zeros(d, bool)
    for j in range(q2):
        length = sizes[j] if block_len == "loop" else sizes[perm[q1 + j]]
        covered[start[perm[q1 + j]]:start[perm[q1 + j]] + length] = True
    return int(covered.sum()), sizes


@pytest.mark.parametrize("block_len", ["loop", "own"])
def test_v1_generator_follows_the_reference_code(block_len):
    m, n = 12, 100
    inst = v1_instance(5, m=m, n=n, block_len=block_len)
    expected, sizes = uniform_rows_expected(5, m, n, block_len)
    assert [len(b) for _, b in inst] == sizes.tolist() and all(a.shape == (k, n) for (a, _), k in zip(inst, sizes))
    a = np.vstack([a for a, _ in inst])
    # U[−5, 5] rows: variance ≈ 25/3 and no entry beyond 5; N(0, 1) rows have variance ≈ 1, and a Student-t(5)
    # row reaching variance 4 has entries beyond 5
    uniform = (a.var(axis=1) > 4.0) & (np.abs(a).max(axis=1) <= 5.0)
    assert int(uniform.sum()) == expected
    # the two block-length readings cover different rows (the loop counter's d_j spills or falls short)
    other = uniform_rows_expected(5, m, n, "own" if block_len == "loop" else "loop")[0]
    assert other != expected


def test_v1_paper_text_generator_and_ranges():
    inst = v1_instance(1, m=9, n=100, generator="paper_text", d_range=(20, 40))
    sizes = [len(b) for _, b in inst]
    assert min(sizes) >= 20 and max(sizes) <= 40
    d = sum(sizes)
    a = np.vstack([a for a, _ in inst])
    uniform = (a.var(axis=1) > 4.0) & (np.abs(a).max(axis=1) <= 5.0)
    assert int(uniform.sum()) == -(-2 * d // 3) - (-(-d // 3))
    with pytest.raises(ValueError, match="generator"):
        v1_instance(0, generator="text")
    # trials are reproducible from their seed and differ between seeds
    np.testing.assert_array_equal(v1_instance(3, m=4, n=5)[2][0], v1_instance(3, m=4, n=5)[2][0])
    assert not np.array_equal(v1_instance(3, m=4, n=5)[2][1], v1_instance(4, m=4, n=5)[2][1])


def test_qot_split_preprocessing():
    inst = qot_instance(0, m=128)
    sizes = np.array([len(b) for _, b in inst])
    assert sizes.sum() == 8992 and sizes.min() > 0.025 * 8992 / 128 and len(inst) == 128
    a = np.vstack([a for a, _ in inst])
    b = np.concatenate([b for _, b in inst])
    np.testing.assert_allclose(np.linalg.norm(a, axis=0), 1.0, rtol=1e-12)   # unit-norm columns
    assert set(np.unique(b)) == {0.0, 1.0} and b.sum() == 741              # labels −1 → 0
    assert not np.array_equal(sizes, [len(b) for _, b in qot_instance(1, m=128)])
    with pytest.raises(ValueError, match="min_client_frac"):
        qot_instance(0, m=128, min_client_frac=60.0)


def test_size_blocks_is_optimal_and_pack_trials_keeps_every_row():
    rng = np.random.default_rng(0)
    sizes = rng.integers(1, 60, size=(3, 7))
    up = lambda v: -(-int(v) // 4) * 4
    best = None
    peak = np.sort(sizes, axis=1).max(axis=0)
    for cuts in itertools.chain.from_iterable(itertools.combinations(range(1, 7), k) for k in range(0, 3)):
        edges = (0,) + cuts + (7,)
        cost = sum((hi - lo) * up(peak[hi - 1]) for lo, hi in zip(edges[:-1], edges[1:]))
        best = cost if best is None else min(best, cost)
    blocks = size_blocks(sizes, 3, row_multiple=4)
    assert sum((hi - lo) * rows for lo, hi, rows in blocks) == best
    assert blocks[0][0] == 0 and blocks[-1][1] == 7

    inst = [[(rng.standard_normal((k, 3)), rng.standard_normal(k)) for k in row] for row in sizes]
    data = pack_trials(inst, blocks=3, row_multiple=4)
    assert data.num_clients == 7 and data.num_trials == 3 and data.dim == 3
    for t in range(3):
        assert sorted(data.order[t]) == list(range(7))
        pos = 0
        for blk in data.blocks:
            for j in range(blk.num_clients):
                a, b = inst[t][data.order[t][pos]]
                k = len(b)
                np.testing.assert_array_equal(blk.A[t, j, :k], a)
                assert not blk.A[t, j, k:].any() and not blk.b[t, j, k:].any()
                assert blk.mask[t, j].sum() == k == blk.d[t, j]
                assert blk.lam[t, j] == pytest.approx(np.linalg.eigvalsh(a.T @ a)[-1], rel=1e-12)
                pos += 1
    one = pack_trials(inst)                                  # one block keeps the natural client order
    assert len(one.blocks) == 1 and (one.order == np.arange(7)).all() and one.blocks[0].rows == -(-sizes.max() // 8) * 8
    with pytest.raises(ValueError, match="clients"):
        pack_trials([inst[0], inst[1][:5]])
