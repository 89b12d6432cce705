"""Target domains for domain-adapted PATE students: ``target = digits_target_transform(digits.features)``.

A PATE student trained by associative domain adaptation needs unlabeled data
from a related but shifted domain. Two are built here from scikit-learn's
digits (8×8, pixel values 0–16):

- ``digits_target_transform``: a fixed restyling of the digits themselves, the
  target domain of the default embedded run (digits → bold digits);
- ``uci_digits_as_mnist``: the digits redrawn in MNIST's format, the target
  domain of the at-scale run (MNIST → UCI digits).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray
from scipy import ndimage

from privpipe.data.records import DataError

__all__ = ["digits_target_transform", "uci_digits_as_mnist", "as_mnist_canvas", "DIGITS_MAX", "MNIST_SIDE",
           "MNIST_BOX"]

DIGITS_MAX = 16.0  # scikit-learn digits pixel range is 0..16
DIGITS_SIDE = 8
MNIST_SIDE = 28
MNIST_BOX = 20  # MNIST digits fit a 20×20 box centred in 28×28 (4 px border)
_DILATION_SIZE = 2
_BLUR_SIGMA = 0.4


def _as_images(features: np.ndarray, side: int) -> np.ndarray:
    """Rows of ``side*side`` pixels as an (n, side, side) float32 stack; DataError on any other shape."""
    features = np.asarray(features)
    if features.ndim != 2 or features.shape[1] != side * side:
        raise DataError(f"expected rows of {side}×{side} = {side * side} pixels, got shape {features.shape}")
    if not np.isfinite(features).all():
        raise DataError("pixel values contain NaN or infinite values")
    return features.astype(np.float32).reshape(-1, side, side)


def digits_target_transform(features: np.ndarray) -> np.ndarray:
    """Restyle 8×8 digits as bolder, softer strokes: the default run's target domain.

    Grey dilation with a 2×2 window (every stroke grows by one pixel up and
    left), then a Gaussian blur with σ = 0.4 px (zeros outside the image),
    clipped to 0..16. Fixed and deterministic: no parameters, no randomness.

    Chosen by measurement on scikit-learn digits (70/30 stratified splits,
    features /16, mean of two splits): a classifier trained on plain digits
    scores 63% (logistic regression) / 50% (MLP, 64 hidden) on transformed
    held-out digits, against 93% / 96% when trained on transformed digits —
    a 30–46 point gap, while the domain stays as learnable as the source.

    Parameters
    ----------
    features : (n, 64) array of 8×8 digits, values 0..16.

    Returns
    -------
    (n, 64) float32 array, values 0..16.
    """
    images = _as_images(features, DIGITS_SIDE)
    # size 1 on the batch axis: each image is processed on its own
    bold = ndimage.grey_dilation(images, size=(1, _DILATION_SIZE, _DILATION_SIZE))
    soft = ndimage.gaussian_filter(bold, sigma=(0.0, _BLUR_SIGMA, _BLUR_SIGMA), mode="constant")
    # scipy is untyped (soft is Any to mypy): the result's type, stated
    out: NDArray[np.float32] = np.clip(soft, 0.0, DIGITS_MAX).reshape(len(images), -1).astype(np.float32)
    return out


def as_mnist_canvas(features: np.ndarray, *, side: int, box: int) -> np.ndarray:
    """Square images in [0, 1] (rows of side² pixels) redrawn in MNIST's format: upscaled
    bilinearly to ``box``×``box`` and centred on a 28×28 zero canvas.

    USPS (16×16, digits filling the frame) uses box 20, like MNIST's digits; SVHN crops
    (32×32, digit and surroundings) use box 28, the whole canvas.
    """
    if not 1 <= box <= MNIST_SIDE:
        raise ValueError(f"box must be in 1..{MNIST_SIDE}, got {box}")
    images = _as_images(features, side)
    factor = box / side
    # grid_mode: scale pixel areas, not corner-to-corner; "nearest" edges avoid darkening the rim
    scaled = ndimage.zoom(images, (1.0, factor, factor), order=1, grid_mode=True, mode="nearest") if factor != 1 \
        else images
    border = (MNIST_SIDE - box) // 2
    canvas = np.zeros((len(images), MNIST_SIDE, MNIST_SIDE), dtype=np.float32)
    canvas[:, border:border + box, border:border + box] = np.clip(scaled, 0.0, 1.0)
    return canvas.reshape(len(images), -1)


def uci_digits_as_mnist(features_8x8: np.ndarray) -> np.ndarray:
    """Redraw 8×8 digits (0..16) in MNIST's format, as ``load_mnist`` returns it.

    Each digit is upscaled bilinearly (pixel-centre aligned, like PIL or
    ``torch.nn.functional.interpolate(align_corners=False)``) to 20×20, placed
    in the centre of a 28×28 canvas with a 4-pixel zero border as in MNIST,
    and rescaled from 0..16 to MNIST's [0, 1].

    Parameters
    ----------
    features_8x8 : (n, 64) array of 8×8 digits, values 0..16.

    Returns
    -------
    (n, 784) float32 array, values in [0, 1].
    """
    # zoom is linear, so scaling to [0, 1] first gives the same pixels as scaling after
    return as_mnist_canvas(_as_images(features_8x8, DIGITS_SIDE).reshape(len(features_8x8), -1) / DIGITS_MAX,
                           side=DIGITS_SIDE, box=MNIST_BOX)
