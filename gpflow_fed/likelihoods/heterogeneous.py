"""HeterogeneousLikelihood: one latent function, a different likelihood per output type.

The last column of ``Y`` holds the index of the likelihood of each row (GPflow's ``SwitchedLikelihood``
convention). Unlike the stock class, the index is validated: a non-integer or out-of-range index raises a
``ValueError`` naming the offending value instead of being silently mis-partitioned.

In Recyclable GPs (Moreno-Muñoz et al., *Recyclable Gaussian Processes*, §4.3 "Heterogeneous tasks") each data
type gets its own local model:
:meth:`HeterogeneousLikelihood.split` separates a dataset by type so that each part is fitted with its own
likelihood (Gauss–Hermite ``variational_expectations`` for non-Gaussian ones), and the ensemble bound, which
has no likelihood term, combines them unchanged.
"""

from __future__ import annotations

from typing import Any, Dict, Sequence, Tuple

import gpflow
import numpy as np
import tensorflow as tf
from check_shapes import check_shapes

__all__ = ["HeterogeneousLikelihood"]


class HeterogeneousLikelihood(gpflow.likelihoods.SwitchedLikelihood):
    """``p(y_n | f_n) = p_{j_n}(y_n | f_n)`` with ``j_n = Y[n, -1]`` an integer in ``[0, J)``.

    :param likelihood_list: the J scalar likelihoods, e.g. ``[Gaussian(), Bernoulli(invlink=tf.sigmoid)]``.
    :raises ValueError: for an empty list. :raises TypeError: for non-scalar likelihoods.
    """

    def __init__(self, likelihood_list: Sequence[gpflow.likelihoods.ScalarLikelihood], **kwargs: Any) -> None:
        likelihoods = list(likelihood_list)
        if not likelihoods:
            raise ValueError("HeterogeneousLikelihood needs at least one likelihood")
        for j, lik in enumerate(likelihoods):
            if not isinstance(lik, gpflow.likelihoods.ScalarLikelihood):
                raise TypeError(
                    f"likelihood {j} is a {type(lik).__name__}; HeterogeneousLikelihood needs scalar likelihoods"
                )
        super().__init__(likelihoods, **kwargs)

    @property
    def num_likelihoods(self) -> int:
        """J."""
        return len(self.likelihoods)

    @check_shapes("Y: [N, P]")
    def check_index(self, Y: Any) -> np.ndarray:
        """Validate the index column of ``Y`` and return it as integers ``[N]``.

        :raises ValueError: if ``Y`` has no value column, or an index is not an integer in ``[0, J)``.
        """
        Y = np.asarray(Y)
        if Y.shape[1] < 2:
            raise ValueError(f"Y must be [N, P + 1] with the likelihood index as last column, got shape {Y.shape}")
        index = Y[:, -1]
        bad = ~np.isfinite(index) | (index != np.round(index)) | (index < 0) | (index >= self.num_likelihoods)
        if np.any(bad):
            raise ValueError(
                f"likelihood index (last column of Y) must be an integer in [0, {self.num_likelihoods}); "
                f"found {index[bad][:5].tolist()} at rows {np.flatnonzero(bad)[:5].tolist()}"
            )
        return index.astype(int)

    def _partition_and_stitch(self, args: Sequence[Any], func_name: str) -> tf.Tensor:
        Y = args[-1]
        if tf.executing_eagerly():
            self.check_index(np.asarray(Y))
        else:
            index = Y[..., -1]
            checks = [
                tf.debugging.assert_equal(index, tf.round(index), message="likelihood index must be an integer"),
                tf.debugging.assert_non_negative(index, message="likelihood index must be ≥ 0"),
                tf.debugging.assert_less(
                    index, tf.cast(self.num_likelihoods, index.dtype), message="likelihood index out of range"
                ),
            ]
            # in a graph the partition below must wait for the checks, or it may fail first with its own message
            with tf.control_dependencies(checks):
                args = (*args[:-1], tf.identity(Y))
        return super()._partition_and_stitch(args, func_name)

    @check_shapes("X: [N, D]", "Y: [N, P]")
    def split(self, X: Any, Y: Any) -> Dict[int, Tuple[np.ndarray, np.ndarray]]:
        """``{j: (X_j, Y_j)}`` with the index column removed: one dataset per data type (one local model each)."""
        index = self.check_index(Y)
        X, Y = np.asarray(X), np.asarray(Y)
        return {int(j): (X[index == j], Y[index == j, :-1]) for j in np.unique(index)}

    @staticmethod
    @check_shapes("Y: [N, P]", "return: [N, P1]")
    def with_index(Y: Any, index: int) -> np.ndarray:
        """``Y`` with a constant likelihood-index column appended (P1 = P + 1)."""
        Y = np.asarray(Y, dtype=gpflow.default_float())
        return np.concatenate([Y, np.full((Y.shape[0], 1), float(index), dtype=Y.dtype)], axis=1)
