"""fljax.ops: composable pytree transformations (prox, gossip, ADMM, SAM, partitions, sparse masks, quantizers,
schedules, distillation, meta-gradients, differential privacy, compressed uploads, robust aggregation rules and
attacks, heterogeneous local work and staleness). Each operator is a small pure
function on pytrees, safe under ``jit`` and ``vmap`` over a leading client axis; see ``docs/ops.md`` for the API
reference with formulas and paper equations (``docs/privacy.md`` for privacy and compression).

The submodules are the primary namespaces (``ops.prox.L1``, ``ops.gossip.Ring``); the most used names are
re-exported here. ``ops.gossip`` is the submodule, so the operator of the same name is called
``ops.gossip.gossip(W, tree)``; ``Identity`` exists in ``prox``, ``gossip`` and ``compress`` and is not re-exported.
``ops.robust`` and ``ops.attacks`` re-export nothing (their ``mean``, ``median``, ``scale`` would shadow other names):
call ``ops.robust.krum``, ``ops.attacks.alie``.
"""
from fljax.ops import (admm, attacks, compress, distill, gossip, heterogeneity, meta, partition, privacy, prox, quant,
                       robust, sam,
                       schedule, sparsity)
from fljax.ops.admm import (admm_consensus, augmented_lagrangian, augmented_lagrangian_grad, cg_solver,
                            cholesky_solver, consensus_from_z, dual_ascent, gd_branch, inverse_solver, linearised_prox,
                            linearized_primal, woodbury_inverse_solver, woodbury_solver, z_form)
from fljax.ops.compress import QSGD, RandomK, ScaledSign, TopK, error_feedback, make_compressor
from fljax.ops.distill import ProjectionHead, crd_critic, crd_loss, feature_l2, info_nce, kl_divergence
from fljax.ops.gossip import (Mixing, check_mixing, consensus_distance, contraction, gossip_gather, is_connected,
                              is_doubly_stochastic, is_row_stochastic, is_symmetric, make_topology,
                              metropolis_hastings, spectral_gap)
from fljax.ops.heterogeneity import local_steps_norm, staleness_weight
from fljax.ops.meta import adapt, hvp, meta_grad
from fljax.ops.partition import count, mask_from_paths, mask_not, masked_average, merge, split
from fljax.ops.privacy import (clip_by_norm, clip_per_layer, poisson_cohort, private_mean,
                               private_value_and_grad)
from fljax.ops.prox import (L1, Box, ElasticNet, GroupLasso, HardThreshold, L2Norm, NonNegative, Nuclear, Prox,
                            SquaredL2, chain, make_prox, matricize, measured_stats, on, per_leaf, proximal_penalty,
                            soft_threshold, svt, transmission_bytes, unmatricize)
from fljax.ops.quant import (R, assign, bits_accounting, center_update, hard_quantize, init_centers, prox_x,
                             soft_quantize)
from fljax.ops.schedule import epoch_of, exp_decay, penalty_kappa, penalty_lambda
from fljax.ops.sam import sam_perturbation, sam_value_and_grad

