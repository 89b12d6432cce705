"""Certified data removal (Guo et al. 2020): a loss-perturbed linear head and its removal budget."""

from privpipe.removal.guarantee import RemovalGuarantee, combined_guarantee
from privpipe.removal.head import RemovableHead, RemovalStep
from privpipe.removal.logistic import GAMMA, fit_perturbed, gradient, hessian, objective
from privpipe.removal.mechanism import Mechanism, NoRemoval, RequestMechanism, request_mechanism
from privpipe.removal.meta import AppliedBatch, DamagedHeadFile, HeadMeta, HeadSettings, HistoryEntry

__all__ = ["RemovalGuarantee", "combined_guarantee", "RemovableHead", "RemovalStep", "GAMMA", "fit_perturbed",
           "gradient", "hessian", "objective", "Mechanism", "NoRemoval", "RequestMechanism", "request_mechanism",
           "HeadMeta", "HeadSettings", "AppliedBatch", "HistoryEntry", "DamagedHeadFile"]
