"""Association losses: their known minima, agreement with the plain-probability definitions,
numerical safety at large norms, and the loss-weight schedule."""

from __future__ import annotations

import math

import pytest
import torch

from privpipe.pate.association import association_weight, class_cover_loss, cover_loss, visit_loss, walker_loss

torch.set_num_threads(1)
NORM = 10.0  # similarities of 100 against 0: off-class walk probabilities ~e^-100


def one_hot(classes: list[int], *, width: int = 3, norm: float = NORM) -> torch.Tensor:
    return norm * torch.nn.functional.one_hot(torch.tensor(classes), width).float()


def reference_walks(source: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    similarity = source.double() @ target.double().T
    return similarity.softmax(dim=1), similarity.T.softmax(dim=1)


def test_walker_loss_reaches_the_entropy_of_t_when_classes_associate():
    labels = [0, 0, 1, 2, 2, 2]  # same-class counts 2, 2, 1, 3, 3, 3
    expected = (2 * math.log(2) + math.log(1) + 3 * math.log(3)) / 6
    source, y = one_hot(labels), torch.tensor(labels)
    matched = walker_loss(source, y, one_hot([0, 1, 1, 2]))
    assert matched.item() == pytest.approx(expected, abs=1e-4)
    # targets halfway between classes 0 and 1: a walk from either comes back to one of the
    # three sources of classes 0 and 1 uniformly, so every row's cross-entropy is log 3
    mixed = one_hot([0, 0, 2])
    mixed[:2] = NORM / math.sqrt(2) * torch.tensor([1.0, 1.0, 0.0])
    mixed_loss = walker_loss(source, y, mixed).item()
    assert mixed_loss == pytest.approx(math.log(3), abs=1e-4) and mixed_loss > expected + 0.3
    # every target in class 0: walks from classes 1 and 2 all return to class 0
    collapsed = walker_loss(source, y, one_hot([0, 0, 0, 0]))
    assert collapsed.item() > expected + 10 and torch.isfinite(collapsed)


def test_visit_loss_is_log_targets_when_all_are_visited_equally():
    source = one_hot([0, 0, 1, 1])
    assert visit_loss(source, one_hot([0, 1])).item() == pytest.approx(math.log(2), abs=1e-4)
    assert visit_loss(torch.zeros(5, 3), torch.randn(7, 3)).item() == pytest.approx(math.log(7), abs=1e-5)
    # a class-2 target no source walks to: above the 3-target minimum
    assert visit_loss(source, one_hot([0, 1, 2])).item() > math.log(3) + 1


def test_cover_loss_is_log_sources_when_every_source_is_reached_equally():
    # PATE-T: uniform over the labeled source samples, V_i = 1/|A|
    source = one_hot([0, 1, 2])
    assert cover_loss(source, one_hot([0, 1, 2, 2, 1, 0])).item() == pytest.approx(math.log(3), abs=1e-4)
    # two identical sources share the walks of the two targets next to them: uniform over the 4 samples
    doubled = one_hot([0, 0, 1, 2])
    assert cover_loss(doubled, one_hot([0, 0, 1, 2])).item() == pytest.approx(math.log(4), abs=1e-4)
    # every target next to source 0: the other sources are never reached
    collapsed = cover_loss(source, one_hot([0, 0, 0, 0]))
    assert collapsed.item() > math.log(3) + 10 and torch.isfinite(collapsed)


def test_cover_over_samples_asks_for_more_than_cover_over_classes():
    # class 0 has two sources but only one of them is reached: covered per class, not per sample
    source = torch.cat([one_hot([0]), 0.5 * one_hot([0]), one_hot([1, 2])])
    labels, target = torch.tensor([0, 0, 1, 2]), one_hot([0, 1, 2])
    assert class_cover_loss(source, labels, target, classes=3).item() == pytest.approx(math.log(3), abs=1e-4)
    assert cover_loss(source, target).item() > math.log(4) + 1


def test_class_cover_loss_is_log_classes_when_targets_cover_them_equally():
    labels = torch.tensor([0, 0, 1, 1, 2, 2])
    source = one_hot(labels.tolist())
    spread = class_cover_loss(source, labels, one_hot([0, 1, 2, 2, 1, 0]), classes=3)
    assert spread.item() == pytest.approx(math.log(3), abs=1e-4)
    collapsed = class_cover_loss(source, labels, one_hot([0, 0, 0, 0, 0, 0]), classes=3)
    assert collapsed.item() > math.log(3) + 10 and torch.isfinite(collapsed)
    # a class absent from the batch is not asked for
    present = torch.tensor([0, 0, 2, 2])
    assert class_cover_loss(one_hot(present.tolist()), present, one_hot([0, 2]), classes=3).item() == \
        pytest.approx(math.log(2), abs=1e-4)


def test_losses_match_their_definitions_on_random_embeddings():
    generator = torch.Generator().manual_seed(0)
    source, target = torch.randn(8, 4, generator=generator), torch.randn(6, 4, generator=generator)
    labels = torch.tensor([0, 1, 1, 2, 0, 2, 2, 1])
    p_ab, p_ba = reference_walks(source, target)
    same = (labels[:, None] == labels[None, :]).double()
    t = same / same.sum(dim=1, keepdim=True)
    walker = -(t * torch.log(p_ab @ p_ba)).sum(dim=1).mean()
    visit = -torch.log(p_ab.mean(dim=0)).mean()
    reach = p_ba.mean(dim=0)
    class_cover = -torch.log(torch.stack([reach[labels == c].sum() for c in range(3)])).mean()
    assert walker_loss(source, labels, target).item() == pytest.approx(walker.item(), rel=1e-5)
    assert visit_loss(source, target).item() == pytest.approx(visit.item(), rel=1e-5)
    assert cover_loss(source, target).item() == pytest.approx(-torch.log(reach).mean().item(), rel=1e-5)
    assert class_cover_loss(source, labels, target, classes=3).item() == pytest.approx(class_cover.item(), rel=1e-5)


@pytest.mark.parametrize("scale", [1.0, 1000.0])
def test_gradients_are_finite_and_reach_both_batches(scale):
    generator = torch.Generator().manual_seed(1)
    source = (scale * torch.randn(6, 3, generator=generator)).requires_grad_()
    target = (scale * torch.randn(5, 3, generator=generator)).requires_grad_()
    labels = torch.tensor([0, 0, 1, 1, 2, 2])
    loss = walker_loss(source, labels, target) + visit_loss(source, target) \
        + cover_loss(source, target) + class_cover_loss(source, labels, target, classes=3)
    loss.backward()
    assert torch.isfinite(loss)
    for grad in (source.grad, target.grad):
        assert torch.isfinite(grad).all() and grad.abs().sum() > 0


def test_association_weight_delays_then_ramps():
    schedule = {step: association_weight(step, weight=2.0, delay_steps=10, ramp_steps=20)
                for step in (0, 9, 10, 15, 20, 30, 100)}
    assert schedule == {0: 0.0, 9: 0.0, 10: 0.0, 15: 0.5, 20: 1.0, 30: 2.0, 100: 2.0}
    assert association_weight(4, weight=0.7, delay_steps=5, ramp_steps=0) == 0.0
    assert association_weight(5, weight=0.7, delay_steps=5, ramp_steps=0) == 0.7
    assert association_weight(0, weight=1.0, delay_steps=0, ramp_steps=4) == 0.0


@pytest.mark.parametrize("argument, kwargs", [
    ("step", {"step": -1}), ("weight", {"weight": -0.5}), ("weight", {"weight": math.inf}),
    ("delay_steps", {"delay_steps": 1.5}), ("ramp_steps", {"ramp_steps": -2}),
])
def test_association_weight_refuses_bad_arguments(argument, kwargs):
    values = {"step": 0, "weight": 1.0, "delay_steps": 0, "ramp_steps": 0} | kwargs
    with pytest.raises(ValueError, match=f"^{argument}:"):
        association_weight(values.pop("step"), **values)


def test_losses_refuse_bad_inputs():
    source, target, labels = torch.randn(4, 3), torch.randn(5, 3), torch.tensor([0, 1, 0, 1])
    with pytest.raises(ValueError, match="^target_emb:"):
        walker_loss(source, labels, torch.randn(5, 2))
    with pytest.raises(ValueError, match="^target_emb:"):
        visit_loss(source, target[:0])
    with pytest.raises(ValueError, match="^source_emb:"):
        visit_loss(torch.randn(4), target)
    with pytest.raises(ValueError, match="^source_labels:"):
        walker_loss(source, labels[:3], target)
    with pytest.raises(ValueError, match="^source_labels:"):
        walker_loss(source, labels.float(), target)
    with pytest.raises(ValueError, match="^source_labels: label 2"):
        class_cover_loss(source, torch.tensor([0, 1, 2, 1]), target, classes=2)
    with pytest.raises(ValueError, match="^classes:"):
        class_cover_loss(source, labels, target, classes=0)
    with pytest.raises(ValueError, match="^target_emb:"):
        cover_loss(source, torch.randn(5, 2))
