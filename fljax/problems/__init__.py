"""fljax.problems: convex and non-convex regression on clients' rows (FedGiA's experiments) and their data.

Importing it registers FedGiA's data sets and the data kind of consensus regression (:mod:`fljax.problems.sources`).
"""
from fljax.problems import sources  # noqa: F401 - registers FedGiA's data sets
from fljax.problems.fedgia_data import (ClientBlocks, pack_trials, qot_instance, sct_standin_instance, size_blocks,
                                       v1_instance)
from fljax.problems.regression import (LOSSES, ClientData, LeastSquares, Logistic, Loss, NonconvexLogistic,
                                       lambda_max_host, lambda_max_power, make_loss)

__all__ = ["ClientBlocks", "pack_trials", "qot_instance", "sct_standin_instance", "size_blocks", "v1_instance",
           "LOSSES", "ClientData", "LeastSquares", "Logistic", "Loss", "NonconvexLogistic", "lambda_max_host",
           "lambda_max_power", "make_loss"]
