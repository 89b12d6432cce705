"""Associative losses between a labeled (source) and an unlabeled (target) batch of embeddings.

    weight = association_weight(step, weight=1.0, delay_steps=200, ramp_steps=300)
    loss = (cross_entropy(logits, labels)
            + weight * (walker_loss(source_emb, labels, target_emb)
                        + 0.5 * visit_loss(source_emb, target_emb)
                        + 0.1 * cover_loss(source_emb, target_emb)))

Haeusser et al. 2017 ("Learning by association"; "Associative domain adaptation"): with
similarities ``M = A Bᵀ`` between source rows ``A`` and target rows ``B``, a walk goes
source → target with ``P_ab = softmax_rows(M)`` and back with ``P_ba = softmax_rows(Mᵀ)``.

- walker: the round trip ``P_aba = P_ab P_ba`` should end at a source of the start's class,
  uniformly: cross-entropy to ``T_ij = 1[y_i = y_j] / #{k: y_k = y_i}``. Minimum: the entropy of T.
- visit: every target should be visited, ``mean_i P_ab[i]`` close to uniform. Minimum: log(#targets).
- cover (PATE-T, eq. 7): the reverse walk target → source should reach every labeled source
  sample, ``P_cover[i] = mean_k P_ba[k, i]`` close to uniform ``V_i = 1/|A|`` (|A| = source rows
  in the batch). Minimum: log(#sources). The paper writes H(P_cover, V), which is the constant
  log|A| for any distribution P_cover; we take H(V, P_cover), as the visit loss does, so that
  the loss has a gradient and its minimum is the uniform reach.
- class cover (an option, ``class_cover_loss``): the same reverse walk summed per class,
  ``q_c = Σ_{i: y_i = c} P_cover[i]``, close to uniform over the classes present.
  Minimum: log(#present classes).

All three are computed in log space (log-softmax and log-sum-exp), not as ``log(p + ε)``,
so they are exact at their minima and finite for embeddings of any norm.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["walker_loss", "visit_loss", "cover_loss", "class_cover_loss", "association_weight"]


def _check_embeddings(source_emb: Tensor, target_emb: Tensor) -> None:
    for name, emb in (("source_emb", source_emb), ("target_emb", target_emb)):
        if emb.ndim != 2 or emb.shape[0] < 1:
            raise ValueError(f"{name}: must be (rows ≥ 1, dim), got shape {tuple(emb.shape)}")
    if source_emb.shape[1] != target_emb.shape[1]:
        raise ValueError(f"target_emb: dimension {target_emb.shape[1]} differs from source_emb's "
                         f"{source_emb.shape[1]}")


def _check_labels(source_labels: Tensor, rows: int) -> None:
    if source_labels.shape != (rows,):
        raise ValueError(f"source_labels: must have shape ({rows},), got {tuple(source_labels.shape)}")
    if source_labels.is_floating_point() or source_labels.dtype == torch.bool:
        raise ValueError(f"source_labels: must be integer class indices, got dtype {source_labels.dtype}")


def _log_walks(source_emb: Tensor, target_emb: Tensor) -> tuple[Tensor, Tensor]:
    """log P_ab (sources × targets) and log P_ba (targets × sources)."""
    similarity = source_emb @ target_emb.T
    return torch.log_softmax(similarity, dim=1), torch.log_softmax(similarity.T, dim=1)


def _log_matmul_exp(log_a: Tensor, log_b: Tensor) -> Tensor:
    """log(exp(log_a) @ exp(log_b)), with each row's and column's max factored out so the
    product of probabilities does not underflow; the shifts are constants of the result."""
    row_max = log_a.amax(dim=1, keepdim=True).detach()
    col_max = log_b.amax(dim=0, keepdim=True).detach()
    product = torch.exp(log_a - row_max) @ torch.exp(log_b - col_max)
    # only walks with no overlap at all get here as 0: floor them at the smallest normal float
    return row_max + col_max + torch.log(product.clamp_min(torch.finfo(product.dtype).tiny))


def walker_loss(source_emb: Tensor, source_labels: Tensor, target_emb: Tensor) -> Tensor:
    """Cross-entropy H(T, P_aba), averaged over source rows (a scalar)."""
    _check_embeddings(source_emb, target_emb)
    _check_labels(source_labels, source_emb.shape[0])
    log_ab, log_ba = _log_walks(source_emb, target_emb)
    log_aba = _log_matmul_exp(log_ab, log_ba)
    same_class = (source_labels[:, None] == source_labels[None, :]).to(log_aba.dtype)
    target = same_class / same_class.sum(dim=1, keepdim=True)
    return -(target * log_aba).sum(dim=1).mean()


def visit_loss(source_emb: Tensor, target_emb: Tensor) -> Tensor:
    """Cross-entropy from the uniform distribution over targets to ``mean_i P_ab[i]`` (a scalar)."""
    _check_embeddings(source_emb, target_emb)
    log_ab, _ = _log_walks(source_emb, target_emb)
    log_visit = torch.logsumexp(log_ab, dim=0) - math.log(source_emb.shape[0])
    return -log_visit.mean()


def _log_reach(source_emb: Tensor, target_emb: Tensor) -> Tensor:
    """log P_cover: the probability that a reverse walk from a uniformly drawn target ends at source i."""
    _, log_ba = _log_walks(source_emb, target_emb)
    return torch.logsumexp(log_ba, dim=0) - math.log(target_emb.shape[0])


def cover_loss(source_emb: Tensor, target_emb: Tensor) -> Tensor:
    """PATE-T's cover loss: cross-entropy from the uniform distribution over the source rows
    (``V_i = 1/|A|``) to the reverse walk's reach ``P_cover[i] = mean_k P_ba[k, i]`` (a scalar)."""
    _check_embeddings(source_emb, target_emb)
    return -_log_reach(source_emb, target_emb).mean()


def class_cover_loss(source_emb: Tensor, source_labels: Tensor, target_emb: Tensor, *, classes: int) -> Tensor:
    """Cross-entropy from the uniform distribution over the source classes present in the
    batch to the class-visit distribution of the reverse walk,
    ``q_c = mean_k Σ_{i: y_i = c} P_ba[k, i]`` (a scalar).

    Labels must lie in ``[0, classes)``; classes absent from the batch do not count.
    """
    if isinstance(classes, bool) or int(classes) != classes or classes < 1:
        raise ValueError(f"classes: must be an integer >= 1, got {classes!r}")
    _check_embeddings(source_emb, target_emb)
    _check_labels(source_labels, source_emb.shape[0])
    if source_labels.min() < 0 or source_labels.max() >= classes:
        bad = int(source_labels.min() if source_labels.min() < 0 else source_labels.max())
        raise ValueError(f"source_labels: label {bad} out of range [0, {classes})")
    log_reach = _log_reach(source_emb, target_emb)
    present = torch.unique(source_labels)
    member = source_labels[None, :] == present[:, None]
    log_class_visit = torch.logsumexp(log_reach[None, :].masked_fill(~member, -math.inf), dim=1)
    return -log_class_visit.mean()


def association_weight(step: int, *, weight: float, delay_steps: int, ramp_steps: int) -> float:
    """0 before ``delay_steps``, then linear from 0 to ``weight`` over ``ramp_steps``, then ``weight``.

    Haeusser et al. hold the association losses back until the classifier is reasonable,
    since early embeddings associate at random. ``ramp_steps=0`` switches them on at once.
    """
    for name, value in (("step", step), ("delay_steps", delay_steps), ("ramp_steps", ramp_steps)):
        if isinstance(value, bool) or int(value) != value or value < 0:
            raise ValueError(f"{name}: must be an integer >= 0, got {value!r}")
    if not (weight >= 0 and math.isfinite(weight)):
        raise ValueError(f"weight: must be finite and >= 0, got {weight!r}")
    if step < delay_steps:
        return 0.0
    if ramp_steps == 0:
        return float(weight)
    return float(weight) * min((step - delay_steps) / ramp_steps, 1.0)
