"""The models: networks chosen by the data's shape, the frozen front of a released model, storing and loading a
released model, and plain training.

    network = make_network("cnn", in_features=3072, hidden_units=(), classes=10, image=(3, 32, 32))
    model = released_model(network, spec.front(projection))   # raw records in, class scores out
    save_released(model, folder, spec=spec); load_released(folder)

- ``networks.py``: the trainable networks (an MLP for a table or projected pixels, the CNNs for images);
- ``front.py``: unit rows, DP-PCA's projection, a fixed scale, or pixels reshaped to images;
- ``released.py``: :class:`ModelSpec` (model.json) and the released model's weights;
- ``training.py``: training without noise (PATE's teachers, the audit's reference model).
"""

from privpipe.models.front import Projection, Reshape, Scale, UnitNorm, apply_front, front_layers, network_maps
from privpipe.models.networks import (
    MNIST_IMAGE,
    MODELS,
    ChannelsLastMaxPool2d,
    make_cnn,
    make_image_cnn,
    make_mlp,
    make_network,
    make_scatter_cnn,
)
from privpipe.models.released import DIVERGED, ModelSpec, diverged, load_released, released_model, save_released
from privpipe.models.training import TrainingConfig, predict_labels, seeded, train_classifier

__all__ = ["apply_front", "UnitNorm", "Projection", "Scale", "Reshape", "make_mlp", "make_cnn", "make_image_cnn",
           "make_scatter_cnn", "make_network", "front_layers", "network_maps", "ModelSpec", "released_model",
           "save_released", "load_released", "seeded", "MODELS", "MNIST_IMAGE", "diverged", "DIVERGED",
           "TrainingConfig", "train_classifier", "predict_labels", "ChannelsLastMaxPool2d"]
