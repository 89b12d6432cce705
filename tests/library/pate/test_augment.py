"""FixMatch's augmentations of 28×28 images: shapes kept, draws seeded, weak = whole-pixel shifts."""

from __future__ import annotations

import pytest
import torch

from privpipe.pate.augment import is_image_batch, strong_augment, weak_augment

torch.set_num_threads(1)


def centred_squares(rows: int) -> torch.Tensor:
    images = torch.zeros(rows, 1, 28, 28)
    images[:, :, 10:18, 10:18] = torch.rand(rows, 1, 1, 1) + 0.5
    return images


def test_weak_augment_shifts_whole_pixels_within_reach():
    images = centred_squares(16)
    shifted = weak_augment(images, torch.Generator().manual_seed(0))
    assert shifted.shape == images.shape
    # the square stays whole (no interpolation), only moved by at most 2 pixels on each axis
    assert torch.allclose(shifted.sum(dim=(1, 2, 3)), images.sum(dim=(1, 2, 3)))
    for before, after in zip(images[:, 0], shifted[:, 0]):
        rows, cols = after.nonzero(as_tuple=True)
        assert 8 <= rows.min() <= 12 and 8 <= cols.min() <= 12
        assert set(after.unique().tolist()) == set(before.unique().tolist())
    assert not torch.equal(shifted, images)  # 16 draws of 25 shifts: some move


def test_augmentations_keep_flat_rows_flat_and_are_seeded():
    flat = centred_squares(8).reshape(8, 784)
    for augment in (weak_augment, strong_augment):
        first = augment(flat, torch.Generator().manual_seed(3))
        assert first.shape == (8, 784)
        assert torch.equal(first, augment(flat, torch.Generator().manual_seed(3)))
        assert not torch.equal(first, augment(flat, torch.Generator().manual_seed(4)))


def test_strong_augment_moves_and_cuts_out():
    images = torch.ones(32, 1, 28, 28)
    strong = strong_augment(images, torch.Generator().manual_seed(1))
    assert strong.shape == images.shape and torch.isfinite(strong).all()
    assert (strong.amin(dim=(1, 2, 3)) == 0).all()  # every image has a hole (cutout or moved-in border)
    assert (strong <= 1 + 1e-5).all() and (strong >= 0).all()


def test_only_28_by_28_images_are_augmented():
    assert is_image_batch((784,)) and is_image_batch((1, 28, 28)) and not is_image_batch((30,))
    with pytest.raises(ValueError, match="^x:"):
        weak_augment(torch.zeros(4, 30), torch.Generator())
    with pytest.raises(ValueError, match="^x:"):
        strong_augment(torch.zeros(4, 3, 28, 28), torch.Generator())
