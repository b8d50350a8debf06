"""GPflow models of gpflow-fed."""

from .bayesian_linear_regression import (
    BayesianLinearRegression,
    blr_log_marginal_likelihood,
    blr_posterior,
    blr_statistics,
)
from .aggregated_sgpr import AggregatedSGPR, collapsed_sgpr_bound
from .dpo_svgp import DPOSVGP, BaseDPOSVGP, FederatedDPOSVGP
from .ensemble_pyramid import fit_pyramid
from .ensemble_svgp import EnsembleSVGP, RecyclableWarning, as_recyclable
from .experts import COMBINATION_RULES, ExpertCommittee
from .mean_predictor import MeanPredictor
from .neural_regression import NetworkMean, NeuralRegression
from .personalised_gp import PersonalisedGPs
from .privacy_aware_gpr import PrivacyAwareGPR, PrivacyRelease, fit_hyperparameters, release
from .recyclable import RecyclableModel, export_svgp, load_recyclable, save_recyclable, train_local_svgp
from .recyclable_training import LocalSVGPTrainer
from .saving import export_saved_model, load_model, save_model
from .standardized import StandardizedModel

__all__: list = [
    "PrivacyAwareGPR",
    "PrivacyRelease",
    "fit_hyperparameters",
    "release",
    "BayesianLinearRegression",
    "blr_log_marginal_likelihood",
    "blr_posterior",
    "blr_statistics",
    "EnsembleSVGP",
    "RecyclableModel",
    "RecyclableWarning",
    "as_recyclable",
    "export_svgp",
    "fit_pyramid",
    "load_recyclable",
    "save_recyclable",
    "train_local_svgp",
    "LocalSVGPTrainer",
    "DPOSVGP",
    "BaseDPOSVGP",
    "FederatedDPOSVGP",
    "AggregatedSGPR",
    "collapsed_sgpr_bound",
    "COMBINATION_RULES",
    "ExpertCommittee",
    "MeanPredictor",
    "NetworkMean",
    "NeuralRegression",
    "PersonalisedGPs",
    "StandardizedModel",
    "export_saved_model",
    "load_model",
    "save_model",
]
