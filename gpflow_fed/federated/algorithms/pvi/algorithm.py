"""PVI for sparse GPs with a distribution over inducing inputs and DPO factors.

Paper: *Federated Learning of Sparse Gaussian Processes* (Alg. 2; equation numbers below are that paper's),
built on partitioned variational inference (Ashman et al., arXiv:2202.12275); docs guide 'PVI'.

What crosses the network (per client update; ``H = D + 2`` hyperparameters, or ``D + 1`` for a
non-Gaussian likelihood; arrays absent when the corresponding quantity is not learned):

====================  ==============================================  ===================================
direction             arrays                                          size (floats)
====================  ==============================================  ===================================
server → client       ``versions`` (accepted updates per client)      K
                      ``qZ_nu, qZ_lam`` (q(Z), "distribution")        2MD
                      ``Z`` ("fixed" / "fedavg")                      MD
                      ``qrho_nu, qrho_lam`` (q(log β))                2H
                      DPO: ``V, m, s, sizes`` (other clients' sets)   Σ_{j≠k} M_j (D + 2) + K
                      CPO: ``eta, Lam`` (Σ_j natural params on u)     M + M(M+1)/2
client → server       ``dZ_nu, dZ_lam`` (Δ natural params of q(Z))    2MD
                      ``Z`` ("fedavg": the locally moved Z_k)         MD
                      ``drho_nu, drho_lam``                           2H
                      DPO: ``V, m, s`` (the new pseudo-set)           M_k (D + 2)
                      CPO: ``d_eta, d_Lam`` (Δ natural params on u)   M + M(M+1)/2
====================  ==============================================  ===================================

**Privacy:** DPO pseudo-inputs ``V_k`` leave the client; they are initialised at a random subset of the
client's own inputs (``pseudo_init="data"``, the default) and may stay close to them. Use
``pseudo_init="prior"`` (N(0, I) draws) to avoid starting from real inputs.
"""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union, cast

import gpflow
import numpy as np

from ...protocol.algorithm import TRAIN_PHASE, Aggregate, Algorithm, FederationInfo, ReplySpec
from ...protocol.client import Client
from ...protocol.messages import Message
from ....inducing_variables import S_FLOOR, GaussianInducingPoints, NaturalFactor, PseudoObservations
from ....models.dpo_svgp import FederatedDPOSVGP
from ....posteriors import LogNormalHyperparameters
from .batched import BatchedLocalProblem, LocalFit, LocalJob, LocalPlan
from .factors import NaturalGaussian, pack_lower, unpack_lower
from .local import LocalProblem, initial_log_beta, num_hyperparameters, stack_sets

PARAMETERISATIONS = ("dpo", "cpo")
SCHEDULES = ("sequential", "synchronous")
INDUCING_MODES = ("distribution", "fixed", "fedavg")


@dataclass(frozen=True)
class ClientUpdate:
    """What PVI's ``on_client_update`` hook receives after each client update: the client, the worker that ran
    it (holding the fitted q(Z), q(log β) and own factor until its next use), the client's new factors if the
    server accepts them (``tZ``, ``trho``; CPO ``t_eta``, ``t_Lam``) and the reply's metrics."""

    client_id: str
    worker: LocalProblem
    factors: Dict[str, Any]
    metrics: Dict[str, float]


@dataclass
class PVIState:
    """The server state: accepted-update counters, global q(Z)/q(log β) in natural parameters
    (or a point Z), every client's DPO pseudo-set (or the summed CPO natural parameters over u).

    ``client_ids`` (the order of ``versions`` and of the broadcast pseudo-sets) and ``client_sizes`` (the
    weights ``N_k / N`` of the FedAvg step on Z) are the federation's shape, as the server knows it.
    """

    versions: np.ndarray
    qZ: Optional[NaturalGaussian]
    Z: np.ndarray
    qrho: Optional[NaturalGaussian]
    sets: Dict[str, Dict[str, np.ndarray]] = field(default_factory=dict)
    eta: Optional[np.ndarray] = None
    Lam: Optional[np.ndarray] = None
    rejected: int = 0
    client_ids: Tuple[str, ...] = ()
    client_sizes: Dict[str, int] = field(default_factory=dict)


def _factor_shapes(factor: Any) -> Optional[Dict[str, Tuple[int, ...]]]:
    """The shapes of a client's own DPO factor ``V, m, log_s`` (None for anything else)."""
    try:
        return {name: tuple(np.shape(factor[name])) for name in ("V", "m", "log_s")}
    except Exception:  # noqa: BLE001 - not a DPO factor: the per-client path refuses it
        return None


def _inducing_init(inducing_variable: Any) -> tuple:
    if isinstance(inducing_variable, GaussianInducingPoints):
        return inducing_variable.Z_mean.numpy(), inducing_variable.Z_var.numpy()
    if isinstance(inducing_variable, gpflow.inducing_variables.InducingPoints):
        return inducing_variable.Z.numpy(), None
    Z: np.ndarray = np.asarray(inducing_variable, dtype=gpflow.default_float())
    if Z.ndim != 2 or not np.all(np.isfinite(Z)):
        raise ValueError("inducing_variable must be a finite [M, D] array, InducingPoints or GaussianInducingPoints")
    return Z, None


class PVI(Algorithm[PVIState]):
    """Partitioned variational inference for a sparse GP with q(Z) and DPO (or CPO) u-factors.

    Each client update maximises the local free energy (paper eq. 7, with the Z-KL scaled by α as in §4.1) over
    its own u-factor, q(Z) and q(log β) by Adam with early stopping; the new Z/β factors come by division
    (``t_k = q / q_cavity`` in natural parameters), and the server adds ``(1 − damping)·Δ`` to the global natural
    parameters (paper Alg. 2; damping as in PVI). A communication is one
    client update: the sequential schedule asks client ``r mod K`` in round r; the synchronous one asks every
    sampled client and sums their deltas. A synchronous update that would make q(Z) or q(log β) improper
    (a non-positive precision) is rejected: the state is kept and a warning issued. A cavity with a
    non-positive precision is clipped to 1e-6 on the client, so that it stays a proper distribution; the
    ``cavity_clipped`` metric counts the clipped coordinates.

    Damping applies to the natural parameters of the Z, β and CPO u-factors; DPO pseudo-sets are replaced.

    :param kernel: SE-ARD ``gpflow.kernels.SquaredExponential`` when hyperparameters are learned (its values
        initialise the mean of q(log β)); any GPflow kernel otherwise.
    :param inducing_variable: the initial Z ``[M, D]`` (array or ``InducingPoints``) or a
        ``GaussianInducingPoints`` (initial mean and variance of q(Z)).
    :param likelihood: any GPflow likelihood (Gaussian: closed-form ELL and learned noise).
    :param parameterisation: ``"dpo"`` (paper eq. 12) or ``"cpo"`` (paper §5.1, full S_k).
    :param schedule: ``"sequential"`` (paper Alg. 2) or ``"synchronous"``.
    :param rounds: number of communications.
    :param damping: δ ∈ [0, 1); the server applies ρ = 1 − δ of each delta (ρ = 1: no damping, as in the paper).
    :param alpha: α ∈ [0, 1], the weight of the Z-KL (paper eq. 14; 0.1 in the paper).
    :param learn_inducing: ``"distribution"`` (q(Z)), ``"fixed"`` (Z fixed, the paper's
        fixed-Z baseline) or ``"fedavg"``
        (paper Alg. 1: point Z, J joint steps, server averages Z weighted by N_k/N).
    :param learn_hyperparameters: log-normal q(β) with LogNormal(0, 1) priors (paper eqs. 8–10); else fixed.
    :param pseudo_fraction, max_pseudo: M_k = min(⌊pseudo_fraction·N_k⌋, max_pseudo) (paper §6.2: 0.8, 500).
    :param local_steps, patience: Adam step cap and early-stopping patience per client update (the paper runs
        each "until convergence of the local free energy", App. D; the Monte-Carlo objective needs a cap).
    :param fedavg_steps: J of Alg. 1.
    :param local_solver: ``"auto"`` solves the conjugate case (Gaussian likelihood, fixed Z and β, CPO, or
        DPO with M_k = N_k) exactly; ``"adam"`` always optimises.
    :param initial_factors: ``"split"`` (paper Alg. 2, line 2: q⁰(Z) q⁰(log β) = p̃(Z) p(log β) Π_k t_k⁰, the
        initial q (means ``inducing_variable`` and the kernel's values, variances ``init_Z_var`` and
        ``init_rho_var``) shared equally among the K initial factors, t_k⁰ = (q⁰ / prior)^{1/K}, so that the first
        clients' cavities keep (K − 1)/K of its precision) or ``"prior"`` (t_k⁰ ≡ 1: the server starts at the
        prior and q⁰ only starts the first client's optimiser, whose cavity is then the prior).
    :param on_client_update: called with a :class:`ClientUpdate` after every client update (a diagnostics hook;
        it runs where the client update runs).

    **Batched local steps.** With DPO factors, q(Z) learned or Z fixed, a Gaussian likelihood and no
    ``on_client_update`` hook, the local optimisation has a batched form (:meth:`batched`, :meth:`client_updates`):
    ``LocalRuntime`` (``batched=True``, its default) fits a cohort of at least ``min_batch`` clients (the synchronous
    schedule; the sequential one asks one client a round) in one compiled computation per size bucket and memory chunk
    (:class:`~.batched.BatchedLocalProblem`: padded rows and pseudo-points masked out exactly, each client's Adam
    state, noise stream and early stopping its own), with the same replies to round-off; the messages, policy and
    ledger stay per client. A client whose batched fit fails, and every conjugate client, is computed on its own;
    ``LocalRuntime(batched=False)`` keeps one call a client.
    """

    name = "pvi"

    def __init__(
        self,
        kernel: gpflow.kernels.Kernel,
        inducing_variable: Any,
        likelihood: gpflow.likelihoods.Likelihood,
        parameterisation: str = "dpo",
        schedule: str = "sequential",
        rounds: int = 100,
        damping: float = 0.0,
        alpha: float = 0.1,
        learn_inducing: str = "distribution",
        learn_hyperparameters: bool = True,
        *,
        client_fraction: float = 1.0,
        pseudo_fraction: float = 0.8,
        max_pseudo: int = 500,
        pseudo_init: str = "data",
        init_Z_var: float = 0.01,
        init_rho_var: float = 0.01,
        init_S: float = 1e-2,
        num_samples: int = 1,
        num_predict_samples: int = 100,
        learning_rate: float = 1e-2,
        local_steps: int = 5000,
        patience: int = 50,
        fedavg_steps: int = 1000,
        local_solver: str = "auto",
        jitter: float = 1e-6,
        initial_factors: str = "prior",
        on_client_update: Optional[Callable[[ClientUpdate], None]] = None,
    ) -> None:
        super().__init__(rounds, client_fraction)
        checks = [
            (
                parameterisation in PARAMETERISATIONS,
                f"parameterisation must be one of {PARAMETERISATIONS}, got {parameterisation!r}",
            ),
            (schedule in SCHEDULES, f"schedule must be one of {SCHEDULES}, got {schedule!r}"),
            (
                learn_inducing in INDUCING_MODES,
                f"learn_inducing must be one of {INDUCING_MODES}, got {learn_inducing!r}",
            ),
            (0.0 <= float(damping) < 1.0, f"damping must lie in [0, 1) (0 = no damping), got {damping}"),
            (0.0 <= float(alpha) <= 1.0, f"alpha must lie in [0, 1], got {alpha}"),
            (0.0 < float(pseudo_fraction) <= 1.0, f"pseudo_fraction must lie in (0, 1], got {pseudo_fraction}"),
            (int(max_pseudo) >= 1, f"max_pseudo (the cap on M_k) must be ≥ 1, got {max_pseudo}"),
            (pseudo_init in ("data", "prior"), f"pseudo_init must be 'data' or 'prior', got {pseudo_init!r}"),
            (min(init_Z_var, init_rho_var) > 0, "init_Z_var and init_rho_var must be positive"),
            (
                init_S > S_FLOOR,
                f"init_S must exceed the floor {S_FLOOR} on pseudo-observation variances, got {init_S}",
            ),
            (
                min(num_samples, num_predict_samples, local_steps, patience, fedavg_steps) >= 1,
                "sample counts and step counts must be ≥ 1",
            ),
            (learning_rate > 0 and jitter > 0, "learning_rate and jitter must be positive"),
            (local_solver in ("auto", "adam"), f"local_solver must be 'auto' or 'adam', got {local_solver!r}"),
            (
                initial_factors in ("split", "prior"),
                f"initial_factors must be 'split' or 'prior', got {initial_factors!r}",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
        if not isinstance(kernel, gpflow.kernels.Kernel):
            raise TypeError(f"kernel must be a gpflow Kernel, got {type(kernel).__name__}")
        if on_client_update is not None and not callable(on_client_update):
            raise TypeError(f"on_client_update must be callable, got {type(on_client_update).__name__}")
        if not isinstance(likelihood, gpflow.likelihoods.Likelihood):
            raise TypeError(f"likelihood must be a gpflow Likelihood, got {type(likelihood).__name__}")
        if learn_hyperparameters and not isinstance(kernel, gpflow.kernels.SquaredExponential):
            raise TypeError("learn_hyperparameters=True needs a gpflow.kernels.SquaredExponential (SE-ARD) kernel")
        self.Z0, Z0_var = _inducing_init(inducing_variable)
        self.Z0_var = np.full_like(self.Z0, init_Z_var) if Z0_var is None else Z0_var
        self.kernel, self.likelihood = kernel, likelihood
        self.parameterisation, self.schedule, self.learn_inducing = parameterisation, schedule, learn_inducing
        self.rho_step = 1.0 - float(damping)
        self.damping, self.alpha = float(damping), float(alpha)
        self.learn_hyperparameters = bool(learn_hyperparameters)
        self.pseudo_fraction, self.max_pseudo, self.pseudo_init = float(pseudo_fraction), int(max_pseudo), pseudo_init
        self.init_rho_var, self.init_S = float(init_rho_var), float(init_S)
        self.num_samples, self.num_predict_samples = int(num_samples), int(num_predict_samples)
        self.learning_rate, self.local_steps, self.patience = float(learning_rate), int(local_steps), int(patience)
        self.fedavg_steps, self.local_solver, self.jitter = int(fedavg_steps), local_solver, float(jitter)
        self.num_hyper = num_hyperparameters(self.Z0.shape[1], likelihood, self.learn_hyperparameters)
        self.initial_factors = initial_factors
        self.on_client_update = on_client_update
        self._workers: Dict[int, LocalProblem] = {}
        #: the batched local step of this run (:meth:`client_updates`), built on its first use
        self._batched: Optional[BatchedLocalProblem] = None

    # --- configuration -------------------------------------------------------------------------------
    def num_pseudo(self, num_data: int) -> int:
        """M_k = min(⌊pseudo_fraction·N_k⌋, max_pseudo) (paper §6.2)."""
        return min(int(np.floor(self.pseudo_fraction * num_data)), self.max_pseudo)

    def validate(self, dataset: Any) -> None:
        if dataset.output_dim != 1:
            raise ValueError(f"PVI is single-output: Y must have one column, got P = {dataset.output_dim}")
        if dataset.input_dim != self.Z0.shape[1]:
            raise ValueError(f"inducing inputs have D = {self.Z0.shape[1]} but the data have D = {dataset.input_dim}")
        for k, n in enumerate(dataset.client_sizes):
            if self.num_pseudo(n) < 1:
                raise ValueError(
                    f"client {k} has N_k = {n}: M_k = ⌊{self.pseudo_fraction}·N_k⌋ < 1 pseudo-point; "
                    "raise pseudo_fraction or merge small clients"
                )

    def select_clients(self, round: int, client_ids: Sequence[str], rng: np.random.Generator) -> List[str]:
        if self.schedule == "sequential":
            return [client_ids[round % len(client_ids)]]
        return super().select_clients(round, client_ids, rng)

    def aggregation(self, phase: str) -> str:
        return "collect"

    def reply_spec(self, state: PVIState, round: int, phase: str) -> ReplySpec:
        """What every reply holds (module table), shaped by the broadcast of ``state``: ``dZ_nu, dZ_lam [M, D]``
        where q(Z) is learned, ``Z [M, D]`` for ``"fedavg"``, ``drho_nu, drho_lam [H]`` where q(log β) is learned;
        DPO: the pseudo-set ``V [M_k, D], m [M_k, 1], s [M_k]``, CPO: ``d_eta [M, 1], d_Lam [M(M+1)/2]``.

        M_k depends on the sender (``min(⌊pseudo_fraction·N_k⌋, max_pseudo)`` of its registered N_k), so the spec
        leaves it free (``None``) and :meth:`check_reply` holds each client to its own M_k."""
        M, D = self.Z0.shape
        spec: Dict[str, Tuple[Optional[int], ...]] = {}
        if state.qZ is not None:
            spec.update(dZ_nu=(M, D), dZ_lam=(M, D))
        if self.learn_inducing == "fedavg":
            spec["Z"] = (M, D)
        if state.qrho is not None:
            H = int(state.qrho.nu.shape[0])
            spec.update(drho_nu=(H,), drho_lam=(H,))
        if self.parameterisation == "dpo":
            spec.update(V=(None, D), m=(None, 1), s=(None,))
        else:
            spec.update(d_eta=(M, 1), d_Lam=(M * (M + 1) // 2,))
        return spec

    def check_reply(self, state: PVIState, phase: str, message: Message, num_data: int) -> Optional[str]:
        """DPO: the pseudo-set ``V, m, s`` has the M_k rows of the sender's registered ``num_data`` (:meth:`num_pseudo`;
        :meth:`reply_spec` leaves M_k free); CPO replies have no per-client size."""
        if self.parameterisation != "dpo":
            return None
        expected = self.num_pseudo(num_data)
        if any(np.shape(message.arrays[name])[0] != expected for name in ("V", "m", "s")):
            return f"its pseudo-set is not the M_k = {expected} points of its {num_data} registered data points"
        return None

    def copy_state(self, state: PVIState) -> PVIState:
        return copy.deepcopy(state)

    def _conjugate(self, num_data: int) -> bool:
        return (
            self.local_solver == "auto"
            and isinstance(self.likelihood, gpflow.likelihoods.Gaussian)
            and not self.learn_hyperparameters
            and self.learn_inducing == "fixed"
            and (self.parameterisation == "cpo" or self.num_pseudo(num_data) == num_data)
        )

    def initial_q(self) -> Tuple[Optional[NaturalGaussian], Optional[NaturalGaussian]]:
        """The server's q⁰(Z) and q⁰(log β) (``None`` where not learned): the priors N(0, 1) for
        ``initial_factors="prior"``; the initial q (``Z0``, ``init_Z_var``; the kernel's values, ``init_rho_var``)
        for ``"split"``."""
        qZ = NaturalGaussian.standard(self.Z0.shape) if self.learn_inducing == "distribution" else None
        qrho = NaturalGaussian.standard((self.num_hyper,)) if self.num_hyper else None
        if self.initial_factors == "split":
            if qZ is not None:
                qZ = NaturalGaussian.from_moments(self.Z0, self.Z0_var)
            if qrho is not None:
                mean = initial_log_beta(self.kernel, self.likelihood, self.Z0.shape[1])
                qrho = NaturalGaussian.from_moments(mean, np.full(mean.shape, self.init_rho_var))
        return qZ, qrho

    # --- server --------------------------------------------------------------------------------------
    def initial_state(self, info: FederationInfo) -> PVIState:
        M = self.Z0.shape[0]
        qZ, qrho = self.initial_q()
        state = PVIState(
            versions=np.zeros(info.num_clients, dtype=np.int64),
            qZ=qZ,
            Z=self.Z0.copy(),
            qrho=qrho,
            client_ids=tuple(info.client_ids),
            client_sizes={cid: int(n) for cid, n in info.client_sizes.items()},
        )
        if self.parameterisation == "cpo":
            state.eta, state.Lam = np.zeros((M, 1)), np.zeros((M, M))
        return state

    def broadcast(self, state: PVIState, round: int, phase: str) -> Mapping[str, np.ndarray]:
        arrays: Dict[str, np.ndarray] = {"versions": state.versions}
        if state.qZ is not None:
            arrays.update(qZ_nu=state.qZ.nu, qZ_lam=state.qZ.lam)
        else:
            arrays["Z"] = state.Z
        if state.qrho is not None:
            arrays.update(qrho_nu=state.qrho.nu, qrho_lam=state.qrho.lam)
        if self.parameterisation == "dpo":
            ids = state.client_ids
            skip = ids[round % len(ids)] if self.schedule == "sequential" else None
            included = [cid for cid in ids if cid in state.sets and cid != skip]
            arrays.update(stack_sets([state.sets[c] for c in included], self.Z0.shape[1]))
            arrays["sizes"] = np.array(
                [state.sets[c]["m"].shape[0] if c in included else 0 for c in ids], dtype=np.int64
            )
        else:
            # a "cpo" state holds eta and Lam
            arrays.update(eta=cast(np.ndarray, state.eta), Lam=pack_lower(cast(np.ndarray, state.Lam)))
        return arrays

    def server_update(self, state: PVIState, aggregate: Aggregate) -> PVIState:
        messages = aggregate.messages or ()
        qZ, qrho = state.qZ, state.qrho
        for msg in messages:
            if qZ is not None:
                qZ = qZ + NaturalGaussian(msg["dZ_nu"], msg["dZ_lam"]).scale(self.rho_step)
            if qrho is not None:
                qrho = qrho + NaturalGaussian(msg["drho_nu"], msg["drho_lam"]).scale(self.rho_step)
        improper = [name for name, q in (("q(Z)", qZ), ("q(log β)", qrho)) if q is not None and not q.is_proper]
        if improper:
            warnings.warn(
                f"round {aggregate.round}: rejected the update of {list(aggregate.senders)}: "
                f"it makes {', '.join(improper)} improper (non-positive precision); "
                "increase damping (e.g. 1 − 1/K) or use the sequential schedule",
                RuntimeWarning,
                stacklevel=2,
            )
            return replace(state, rejected=state.rejected + 1)
        new = replace(state, versions=state.versions.copy(), qZ=qZ, qrho=qrho, sets=dict(state.sets), Z=state.Z.copy())
        M = self.Z0.shape[0]
        num_data = float(sum(state.client_sizes.values()))
        for msg in messages:
            if self.parameterisation == "dpo":
                new.sets[msg.sender] = {k: np.array(msg[k]) for k in ("V", "m", "s")}
            else:
                new.eta = cast(np.ndarray, new.eta) + self.rho_step * msg["d_eta"]  # a "cpo" state holds eta, Lam
                new.Lam = cast(np.ndarray, new.Lam) + self.rho_step * unpack_lower(msg["d_Lam"], M)
            if self.learn_inducing == "fedavg":
                new.Z = new.Z + state.client_sizes[msg.sender] / num_data * (msg["Z"] - state.Z)
            new.versions[state.client_ids.index(msg.sender)] += 1
        return new

    def round_metrics(self, state: PVIState, aggregates: Sequence[Aggregate]) -> Dict[str, float]:
        out = super().round_metrics(state, aggregates)
        out["rejected_updates"] = float(state.rejected)
        return out

    def result(self, state: PVIState) -> FederatedDPOSVGP:
        """The GPflow model of the server state (it predicts as in the paper's §6): a
        :class:`~gpflow_fed.models.FederatedDPOSVGP` whose u-factor is every client's DPO pseudo-set (their union)
        or the summed CPO natural parameters, with q(Z) (or the point Z) and q(log β) (or the kernel's fixed
        values)."""
        Z, Z_var = (state.Z, None) if state.qZ is None else state.qZ.moments()
        if self.parameterisation == "dpo":
            sets = stack_sets([state.sets[c] for c in state.client_ids if c in state.sets], self.Z0.shape[1])
            M = self.Z0.shape[0]  # before any client has replied, t ≡ 1: zero natural parameters (the prior)
            if sets["m"].shape[0] == 0:
                pseudo: Any = NaturalFactor(np.zeros((M, 1)), np.zeros((M, M)), Z=Z)
            else:
                pseudo = PseudoObservations(sets["V"], sets["m"], sets["s"], Z=Z)
        else:
            pseudo = NaturalFactor(state.eta, state.Lam, Z=Z)
        q_Z = None if Z_var is None else GaussianInducingPoints(Z, Z_var)
        q_beta = None if state.qrho is None else LogNormalHyperparameters(*state.qrho.moments(), self.Z0.shape[1])
        return FederatedDPOSVGP(
            gpflow.utilities.deepcopy(self.kernel),
            gpflow.utilities.deepcopy(self.likelihood),
            pseudo,
            q_Z,
            q_beta,
            alpha=self.alpha,
            num_predict_samples=self.num_predict_samples,
            jitter=self.jitter,
        )

    # --- client --------------------------------------------------------------------------------------
    def setup_client(self, client: Client, info: FederationInfo) -> None:
        """The client's own factors and optimiser position, and its position in the federation (its entry in the
        broadcast ``versions`` and ``sizes``)."""
        M, D = self.Z0.shape
        # t_k⁰ = (q⁰ / prior)^{1/K} (zero natural parameters for initial_factors="prior", where q⁰ is the prior)
        share = 1.0 / len(info.client_ids)
        qZ, qrho = self.initial_q()
        tZ = NaturalGaussian.unit((M, D)) if qZ is None else (qZ - NaturalGaussian.standard((M, D))).scale(share)
        H = self.num_hyper
        trho = NaturalGaussian.unit((H,)) if qrho is None else (qrho - NaturalGaussian.standard((H,))).scale(share)
        client.state.update(
            index=info.client_ids.index(client.id),
            num_pseudo=self.num_pseudo(client.num_data),
            factor=None,
            counter=0,
            jitter=self.jitter,
            version=0,
            pending=None,
            tZ=tZ,
            trho=trho,
            t_eta=np.zeros((M, 1)),
            t_Lam=np.zeros((M, M)),
        )

    def local_problem(self, num_pseudo: int) -> LocalProblem:
        """The worker shared by every client with M_k = ``num_pseudo`` (one compiled step per shape signature,
        reused across clients and rounds; see :class:`~.pvi_local.LocalProblem`)."""
        key = num_pseudo if self.parameterisation == "dpo" else 0
        if key not in self._workers:
            self._workers[key] = LocalProblem(
                self.kernel,
                self.likelihood,
                self.Z0.shape[1],
                learn_hyperparameters=self.learn_hyperparameters,
                M=self.Z0.shape[0],
                num_pseudo=num_pseudo,
                mode="distribution" if self.learn_inducing == "distribution" else "point",
                param=self.parameterisation,
                alpha=self.alpha,
                num_samples=self.num_samples,
                learning_rate=self.learning_rate,
            )
        return self._workers[key]

    def client_update(self, client: Client, broadcast: Message) -> Message:
        plan = self._local_plan(client, broadcast)
        st = client.state
        problem = self.local_problem(st["num_pseudo"])
        problem.load(client.data, st["factor"], seed=client.seed, counter=st["counter"], jitter=st["jitter"])
        problem.set_q(plan.start_Z, plan.start_rho)
        problem.set_cavity(plan.cavZ, plan.cavR, plan.others)
        # local optimisation
        steps, free_energy = 0, float("nan")
        if self._conjugate(client.num_data):
            factor = self._conjugate_factor(client, problem)
        else:
            which = "all" if self.learn_inducing == "distribution" else "factor"
            free_energy, steps = problem.fit(which, self.local_steps, self.patience)
            if self.learn_inducing == "fedavg":
                free_energy, joint = problem.fit("joint", self.fedavg_steps, self.fedavg_steps + 1)
                steps += joint
            factor = problem.own_factor_arrays()
        fitted = LocalFit(
            factor=factor,
            snapshot=problem.snapshot(),
            counter=int(problem.counter.numpy()),
            jitter=float(problem.jitter.numpy()),
            q_Z=problem.q_Z_moments(),
            q_rho=problem.q_rho_moments(),
            free_energy=free_energy,
            steps=steps,
        )
        return self._local_reply(client, broadcast, plan, fitted, problem)

    def batched(self, phase: str) -> bool:
        """The ``train`` phase's local optimisation has a batched form (:class:`~.batched.BatchedLocalProblem`) for DPO
        factors with q(Z) learned (``"distribution"``) or Z fixed, a Gaussian likelihood, no ``on_client_update`` hook
        (it receives the per-client worker) and PVI's own :meth:`client_update` (a subclass that replaces it is asked
        per client)."""
        return (
            phase == TRAIN_PHASE
            and self.parameterisation == "dpo"
            and self.learn_inducing in ("distribution", "fixed")
            and isinstance(self.likelihood, gpflow.likelihoods.Gaussian)
            and self.on_client_update is None
            and type(self).client_update is PVI.client_update
        )

    def client_updates(
        self, clients: Sequence[Client], broadcast: Message, memory_budget: int
    ) -> List[Union[Message, Exception]]:
        """:meth:`client_update` of every client of a ``train`` cohort, the local optimisations together
        (:class:`~.batched.BatchedLocalProblem`): per client, the reply (or the error) :meth:`client_update` gives, to
        round-off. Each client's plan (cavities, pending factors) and reply are :meth:`client_update`'s own; a conjugate
        client, one whose own factor is not of its M_k's shape, and one whose batched fit failed (a Cholesky error or a
        non-finite free energy, which the per-client fit retries with more jitter) are computed by
        :meth:`client_update` alone, so they get the per-client answer, a failure included."""
        if not self.batched(broadcast.phase):
            return super().client_updates(clients, broadcast, memory_budget)
        out: List[Optional[Union[Message, Exception]]] = [None] * len(clients)
        jobs: List[LocalJob] = []
        members: List[int] = []
        D = self.Z0.shape[1]
        for k, client in enumerate(clients):
            if self._conjugate(client.num_data):
                continue
            try:
                plan = self._local_plan(client, broadcast)
            except Exception as exc:  # noqa: BLE001 - this client's update fails, as client_update's would
                out[k] = exc
                continue
            st = client.state
            if _factor_shapes(st["factor"]) == {"V": (st["num_pseudo"], D), "m": (st["num_pseudo"], 1),
                                                "log_s": (st["num_pseudo"],)}:  # fmt: skip
                jobs.append(LocalJob(client.data, st["factor"], client.seed, st["counter"], st["jitter"], plan))
                members.append(k)
            # else client_update's load refuses it, below
        fits = self._batched_problem(jobs[0]).fit(jobs, memory_budget) if jobs else []
        for k, job, fitted in zip(members, jobs, fits):
            if fitted is None:
                continue
            try:
                out[k] = self._local_reply(clients[k], broadcast, job.plan, fitted, None)
            except Exception as exc:  # noqa: BLE001 - this client's update fails, as client_update's would
                out[k] = exc
        for k, client in enumerate(clients):
            if out[k] is None:  # computed on its own: the per-client path's answer, a failure included
                try:
                    out[k] = self.client_update(client, broadcast)
                except Exception as exc:  # noqa: BLE001 - this client's update fails, as client_update's would
                    out[k] = exc
        return cast(List[Union[Message, Exception]], out)

    def _batched_problem(self, job: LocalJob) -> BatchedLocalProblem:
        """The run's batched local step, built on its first use from a per-client worker (its maths and Adam)."""
        if self._batched is None:
            template = self.local_problem(len(job.factor["m"]))
            which = "all" if self.learn_inducing == "distribution" else "factor"
            self._batched = BatchedLocalProblem(template, which, self.local_steps, self.patience)
        return self._batched

    def _local_plan(self, client: Client, broadcast: Message) -> LocalPlan:
        """What client k's local optimisation starts from: its own factor (drawn on its first update), the pending
        factors the server accepted (applied once), the cavities ``q / t_k`` over Z, log β and u (paper eq. 7) and the
        start of q(Z), q(log β). Applying the pending factors and drawing the first factor are the only changes to the
        client's state, each done once, so calling it again for the same broadcast gives the same plan."""
        st = client.state
        idx = st["index"]
        if st["factor"] is None:
            st["factor"] = self._init_factor(client)
        versions = broadcast["versions"]
        pending = st["pending"]
        if pending is not None and versions[idx] == pending["version"]:
            st.update(pending)
        st["pending"] = None
        clipped = 0
        # cavities over Z and log β (paper eq. 7): q / t_k^old in natural parameters
        qZ = NaturalGaussian(broadcast["qZ_nu"], broadcast["qZ_lam"]) if "qZ_nu" in broadcast.arrays else None
        qrho = NaturalGaussian(broadcast["qrho_nu"], broadcast["qrho_lam"]) if "qrho_nu" in broadcast.arrays else None
        first = int(np.sum(versions)) == 0
        cavZ = cavR = None
        start_rho: Optional[Tuple[np.ndarray, np.ndarray]] = None
        if qZ is not None:
            cavZ, n = (qZ - st["tZ"]).clipped()
            clipped += n
            start_Z: Tuple[np.ndarray, Optional[np.ndarray]] = (self.Z0, self.Z0_var) if first else qZ.moments()
        else:
            start_Z = (broadcast["Z"], None)
        if qrho is not None:
            cavR, n = (qrho - st["trho"]).clipped()
            clipped += n
            start = (
                initial_log_beta(self.kernel, self.likelihood, self.Z0.shape[1]),
                np.full(qrho.nu.shape, self.init_rho_var),
            )
            start_rho = start if first else qrho.moments()
        # cavity over u: every other client's factor
        if self.parameterisation == "dpo":
            sizes = broadcast["sizes"]
            begin = int(np.sum(sizes[:idx]))
            keep = np.ones(int(np.sum(sizes)), dtype=bool)
            keep[begin : begin + int(sizes[idx])] = False
            # clients not yet heard from contribute t ≡ 1 (the cavity has a dynamic size)
            others = {k: broadcast[k][keep] for k in ("V", "m", "s")}
        else:
            others = {
                "eta": broadcast["eta"] - st["t_eta"],
                "Lam": unpack_lower(broadcast["Lam"], self.Z0.shape[0]) - st["t_Lam"],
            }
        return LocalPlan(versions, qZ, qrho, cavZ, cavR, start_Z, start_rho, others, clipped)

    def _local_reply(
        self, client: Client, broadcast: Message, plan: LocalPlan, fitted: LocalFit, problem: Optional[LocalProblem]
    ) -> Message:
        """Client k's reply from its fitted local problem: the new factors by division (Δ = q_new − q in natural
        parameters; DPO: the new pseudo-set itself), kept pending until the server's versions show it accepted them.

        :param problem: the per-client worker that fitted it (given to ``on_client_update``; None on the batched path,
            which :meth:`batched` declines when the hook is set)."""
        st = client.state
        idx = st["index"]
        st.update(factor=fitted.snapshot, counter=fitted.counter, jitter=fitted.jitter)
        st["q_moments"] = {"Z": fitted.q_Z, "rho": fitted.q_rho}
        arrays: Dict[str, np.ndarray] = {}
        new_state: Dict[str, Any] = {"version": int(plan.versions[idx]) + 1}
        if plan.qZ is not None:
            delta = NaturalGaussian.from_moments(*fitted.q_Z) - plan.qZ
            arrays.update(dZ_nu=delta.nu, dZ_lam=delta.lam)
            new_state["tZ"] = st["tZ"] + delta.scale(self.rho_step)
        if self.learn_inducing == "fedavg":
            arrays["Z"] = fitted.q_Z[0]
        if plan.qrho is not None:
            delta = NaturalGaussian.from_moments(*fitted.q_rho) - plan.qrho
            arrays.update(drho_nu=delta.nu, drho_lam=delta.lam)
            new_state["trho"] = st["trho"] + delta.scale(self.rho_step)
        factor = fitted.factor
        if self.parameterisation == "dpo":
            arrays.update(factor)
        else:
            d_eta, d_Lam = factor["eta"] - st["t_eta"], factor["Lam"] - st["t_Lam"]
            arrays.update(d_eta=d_eta, d_Lam=pack_lower(0.5 * (d_Lam + d_Lam.T)))
            new_state.update(t_eta=st["t_eta"] + self.rho_step * d_eta, t_Lam=st["t_Lam"] + self.rho_step * d_Lam)
        st["pending"] = new_state
        metrics = {"local_steps": float(fitted.steps), "cavity_clipped": float(plan.clipped)}
        if np.isfinite(fitted.free_energy):  # not computed by the conjugate solver
            metrics["free_energy"] = fitted.free_energy
        if self.on_client_update is not None and problem is not None:
            self.on_client_update(ClientUpdate(client.id, problem, dict(new_state), metrics))
        return self.reply(client, broadcast, arrays, weight=float(client.num_data), metrics=metrics)

    def _init_factor(self, client: Client) -> Dict[str, np.ndarray]:
        """Initial own factor: m = 0, S = init_S·I (zero means, as in the paper's App. D); DPO V_k = a random
        subset of X_k (or N(0, I) draws; never all equal, since identical rows never separate)."""
        M, D = self.Z0.shape
        if self.parameterisation == "dpo":
            Mk = self.num_pseudo(client.num_data)
            X = client.data[0]
            if self.pseudo_init == "data":
                V = X[client.rng.choice(X.shape[0], size=Mk, replace=False)]
            else:
                V = client.rng.standard_normal((Mk, D))
            return {"V": np.array(V), "m": np.zeros((Mk, 1)), "log_s": np.full(Mk, np.log(self.init_S - S_FLOOR))}
        return {"m": np.zeros((M, 1)), "S_raw": np.diag(np.full(M, 0.5 * np.log(self.init_S - S_FLOOR)))}

    def _conjugate_factor(self, client: Client, problem: LocalProblem) -> Dict[str, np.ndarray]:
        """The exact optimum of the local free energy in the conjugate case (Gaussian likelihood, fixed Z and β):
        the factor equals the client's own likelihood projected on u (paper eq. 11; spec T6)."""
        X, Y = client.data
        noise = float(self.likelihood.variance.numpy())
        if self.parameterisation == "dpo":
            problem.load(
                client.data,
                {"V": X, "m": Y, "log_s": np.full(X.shape[0], np.log(noise - S_FLOOR))},
                seed=client.seed,
                counter=0,
                jitter=self.jitter,
            )
            return problem.own_factor_arrays()
        Z = problem.q_Z.Z_mean.numpy()
        Kzz = self.kernel(Z).numpy() + self.jitter * np.eye(Z.shape[0])
        Kzx = self.kernel(Z, X).numpy()
        A = np.linalg.solve(Kzz, Kzx)  # K_ZZ⁻¹ K_ZX (natural parameters over u; the client's own data)
        return {"eta": A @ Y / noise, "Lam": A @ A.T / noise}
