"""The fixed ScatterNet front: data-independent, no trainable weights, the shape a linear teacher expects."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from privpipe.features import ScatterNet, scatter_features, scatter_maps
from privpipe.pate.linear_teacher import standardised_linear

torch.set_num_threads(1)


def test_scatter_features_are_fixed_and_shaped():
    rng = np.random.default_rng(0)
    images = rng.random((5, 784)).astype(np.float32)
    features = scatter_features(images, batch_size=2)
    assert features.shape == (5, 81 * 7 * 7) and features.dtype == np.float32
    # no data-dependent state: another call, in other batches and image shape, gives the same numbers
    again = scatter_features(images.reshape(5, 1, 28, 28), batch_size=5)
    np.testing.assert_allclose(features, again, rtol=1e-5, atol=1e-6)
    assert list(ScatterNet().parameters()) == []
    assert ScatterNet().maps == scatter_maps(28, 2) == (81, 7, 7)
    # the first coefficient is a local average: a brighter image has larger ones
    assert (scatter_features(2 * images)[:, 0] > features[:, 0]).all()


def test_standardised_linear_zscores_with_the_rows_statistics():
    rng = np.random.default_rng(1)
    features = rng.normal(loc=5.0, scale=3.0, size=(50, 4)).astype(np.float32)
    features[:, 3] = 2.0  # constant: its std is floored, not divided by 0
    model = standardised_linear(features, classes=3)
    assert isinstance(model[-1], torch.nn.Linear) and model[-1].out_features == 3
    z = model[0](torch.as_tensor(features))
    assert torch.allclose(z[:, :3].mean(dim=0), torch.zeros(3), atol=1e-4)
    assert torch.allclose(z[:, :3].std(dim=0, unbiased=False), torch.ones(3), atol=1e-2)
    assert torch.equal(z[:, 3], torch.zeros(50))


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="^images:"):
        scatter_features(np.zeros((3, 30)))
    with pytest.raises(ValueError, match="^j:"):
        ScatterNet(j=4)
    with pytest.raises(ValueError, match="^j:"):
        ScatterNet(side=8, j=3)
    with pytest.raises(ValueError, match="^classes:"):
        standardised_linear(np.zeros((3, 4)), classes=1)


def test_digits_sized_images_work_at_j1():
    front = ScatterNet(side=8, j=1)
    assert front.maps == (9, 4, 4)
    assert front(torch.rand(3, 64)).shape == (3, 9 * 16)
