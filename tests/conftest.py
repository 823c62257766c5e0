import numpy as np
import pytest

import fljax.data as D


@pytest.fixture(scope="session")
def synth20():
    """Synthetic(1,1) with 20 small clients (sizes capped at 120)."""
    return D.make_federated("synthetic", 20, seed=0, max_samples=120)


@pytest.fixture(scope="session")
def digits10():
    return D.make_federated("digits", 10, "dirichlet", seed=0, alpha=0.5)


def assert_trees_close(a, b, rtol=1e-5, atol=1e-6):
    import jax

    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol)


def pytest_configure(config):
    """A persistent compilation cache per test process: simulations built again with the same shapes (a resumed
    run, the separate runs a sweep is compared with) load their compiled programs instead of compiling again."""
    import tempfile

    import jax

    config._fljax_cache_dir = tempfile.mkdtemp(prefix="fljax-test-jax-cache-")
    jax.config.update("jax_compilation_cache_dir", config._fljax_cache_dir)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def pytest_unconfigure(config):
    """Remove this process's compilation cache (it only serves one test session)."""
    import shutil

    if getattr(config, "_fljax_cache_dir", None):
        shutil.rmtree(config._fljax_cache_dir, ignore_errors=True)


# ------------------------------------------------------------------------------------------------ the smoke subset
# `python -m pytest -m smoke`: a quick check of every package (docs/testing.md), a few tests each, chosen among the
# fast ones that test against a definition. Entries are node ids (a test function takes all its parameters) or
# whole files; an entry naming a test its (collected) file does not have is an error, so a renamed test cannot
# silently leave the subset.
SMOKE = (
    # fljax.tree
    "tests/test_tree.py",
    # fljax.ops
    "tests/test_ops_prox.py::test_soft_threshold_subgradient_conditions",
    "tests/test_ops_prox.py::test_svt_equals_svd_definition_and_optimality",
    "tests/test_ops_gossip.py::test_gossip_is_the_receiver_row_einsum",
    "tests/test_ops_gossip.py::test_ring_spectral_gap_oracle",
    "tests/test_ops_admm.py::test_dual_ascent_z_form_gd_branch_hand_formulas",
    "tests/test_ops_admm.py::test_admm_consensus_eq13",
    "tests/test_ops_quant.py::test_T1_prox_x_attains_minimum_over_candidates",
    "tests/test_ops_quant.py::test_T2_center_update_signs_balance_and_sorting",
    "tests/test_ops_sam.py::test_sam_on_quadratic_matches_oracle",
    "tests/test_ops_schedule.py",
    "tests/test_ops_sparsity.py::test_erk_densities_by_hand_and_budget",
    "tests/test_ops_partition.py::test_split_merge_round_trip_and_grad_through_one_part",
    "tests/test_ops_distill.py::test_info_nce_against_naive_loop",
    "tests/test_ops_meta.py::test_adapt_is_one_gradient_step",
    "tests/test_ops_compress.py::test_top_k_keeps_the_largest_magnitudes_of_each_leaf_and_contracts",
    "tests/test_ops_privacy.py::test_clip_above_every_norm_with_no_noise_is_plain_weighted_averaging_bit_for_bit",
    "tests/test_ops_robust.py::test_krum_and_multi_krum_follow_blanchard_et_al[11-2]",
    "tests/test_ops_robust.py::test_bulyan_is_recursive_krum_then_the_beta_closest_to_the_median[11-2]",
    "tests/test_ops_robust.py::test_median_and_trimmed_mean_follow_their_definitions_over_the_valid_slots[8]",
    "tests/test_ops_attacks.py::test_alie_and_ipm_craft_from_the_benign_valid_rows[10-2]",
    "tests/test_ops_attacks.py::test_min_max_and_min_sum_follow_the_papers_search[6-2-max-std]",
    "tests/test_ops_attacks.py::test_image_trigger_is_a_max_valued_corner_patch_on_the_chosen_rows",
    # fljax.privacy
    "tests/test_privacy_accounting.py::test_abadi_et_al_mnist_reference_point",
    # fljax.data
    "tests/test_data.py::test_partitioners_use_every_sample_once_and_are_reproducible",
    "tests/test_data.py::test_federated_splits_are_what_their_options_specify[digits-pathological]",
    "tests/test_data.py::test_federated_splits_are_what_their_options_specify[synthetic-None0]",
    "tests/test_clock_chunks.py::test_chunk_rows_equals_python_slicing_for_every_count_and_position",
    "tests/test_own_model_data.py::test_from_arrays_pads_clients_and_keeps_every_sample",
    "tests/test_data_text.py::test_chunking_is_fedjax_s_documented_example",
    # fljax.models
    "tests/test_models.py::test_parameter_counts_match_papers",
    "tests/test_models.py::test_model_errors",
    "tests/test_text.py::test_token_loss_and_accuracies_follow_their_per_token_definition",
    # fljax.engine
    "tests/test_engine.py::test_fedavg_one_client_full_batch_is_gradient_descent",
    "tests/test_engine.py::test_summaries_match_numpy",
    "tests/test_engine.py::test_cohort_sampling",
    "tests/test_engine_stopping.py::test_caps_divergence_and_tolerance_rules",
    # fljax.algorithms
    "tests/test_engine.py::test_fedprox_rounds_equal_the_proximal_gradient_loop_of_eq_2",
    "tests/test_baselines.py::test_pfedme_local_round",
    "tests/test_fedgia.py::test_round_stepper_matches_literal_algorithm_1[ls-G-3-0.5]",
    "tests/test_augfl.py::test_negative_table_lists_other_classes_first",
    "tests/test_quped.py::test_D16_momentum_is_heavy_ball_sgd_with_coupled_weight_decay",
    # fljax.runner
    "tests/test_runner.py::test_block_schedule_ends_at_evaluations_and_checkpoints",
    "tests/test_runner.py::test_run_directory_layout_and_json_log",
    "tests/test_runner.py::test_json_round_trips_plain_and_gzipped",
    "tests/test_sweep.py::test_grid_parsing_and_points",
    "tests/test_plots.py::test_run_plots_draw_the_seed_mean_its_band_and_the_histogram_of_the_clients",
    "tests/test_reliability.py::test_graceful_installs_its_handler_and_restores_the_previous_ones",
    # fljax.hypergrad
    "tests/test_hypergrad.py::test_holdout_moves_round_fraction_of_every_clients_rows_to_the_validation_split",
    "tests/test_hypergrad.py::test_a_step_into_a_diverging_run_is_halved_until_the_run_is_better",
    # fljax.config, fljax.api, fljax.cli
    "tests/test_config.py::test_errors_carry_their_key",
    "tests/test_config.py::test_overrides_refuse_malformed_keys_and_values",
    "tests/test_first_run.py::test_run_without_a_config_file_uses_the_compare_preset",
    "tests/test_cli.py::test_help_everywhere",
    "tests/test_cli.py::test_list_shows_every_registry",
    # the suite itself
    "tests/test_lint.py",
)


def _smoke_entry(nodeid: str) -> str | None:
    """The SMOKE entry that selects a test (by file, function or full node id), or None."""
    for key in (nodeid, nodeid.split("[")[0], nodeid.split("::")[0]):
        if key in SMOKE:
            return key
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Mark the SMOKE tests ``smoke``; refuse an entry naming a test that a wholly collected file does not have."""
    for item in items:
        entry = _smoke_entry(item.nodeid)
        if entry is not None:
            item.add_marker(pytest.mark.smoke)
    if any("::" in arg for arg in config.args):
        return  # single tests asked for: their files were not collected whole
    ids = {item.nodeid for item in items}
    modules = {item.nodeid.split("::")[0]: getattr(item, "module", None) for item in items}
    stale = [e for e in SMOKE if "::" in e and e.split("::")[0] in modules
             and not (e in ids if "[" in e else hasattr(modules[e.split("::")[0]], e.split("::")[1]))]
    if stale:
        raise pytest.UsageError(f"tests/conftest.py SMOKE names tests that do not exist: {stale}")
