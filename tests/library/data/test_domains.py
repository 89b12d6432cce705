"""Target domains and the SVHN / USPS / MNIST-M loaders, on tiny fixtures written here."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.io
from PIL import Image

from digit_formats import usps_line, write_usps
from privpipe.data.domains import digits_target_transform, uci_digits_as_mnist
from privpipe.data.image_sets import load_mnist_m, load_svhn, load_usps
from privpipe.data.records import DataError


def digits(n: int = 12) -> np.ndarray:
    """Digit-like 8×8 rows, values 0..16, with an empty 1-pixel margin as in scikit-learn's digits."""
    rng = np.random.default_rng(0)
    images = np.zeros((n, 8, 8), dtype=np.float32)
    images[:, 1:7, 2:6] = rng.integers(0, 17, size=(n, 6, 4))
    return images.reshape(n, 64)


# --- domains -----------------------------------------------------------------

def test_target_transform_is_deterministic_and_changes_the_data():
    x = digits()
    a, b = digits_target_transform(x), digits_target_transform(x.copy())
    assert a.shape == x.shape and a.dtype == np.float32
    np.testing.assert_array_equal(a, b)
    assert a.min() >= 0.0 and a.max() <= 16.0
    assert np.abs(a - x).mean() > 1.0
    # stroke thickening: more lit pixels than before
    assert (a > 1.0).sum() > (x > 1.0).sum()


def test_target_transform_refuses_wrong_width():
    with pytest.raises(DataError, match="64"):
        digits_target_transform(np.zeros((3, 63)))


def test_uci_digits_as_mnist_is_centred_with_a_zero_border():
    x = digits()
    out = uci_digits_as_mnist(x)
    assert out.shape == (len(x), 784) and out.dtype == np.float32
    assert out.min() >= 0.0 and out.max() <= 1.0
    images = out.reshape(-1, 28, 28)
    border = np.ones((28, 28), bool)
    border[4:24, 4:24] = False
    assert not images[:, border].any()
    # the 8×8 image's own empty margin keeps the digit's mass in the middle of the canvas
    rows, cols = np.nonzero(images.sum(axis=0))
    assert abs((rows.min() + rows.max()) / 2 - 13.5) <= 1.5 and abs((cols.min() + cols.max()) / 2 - 13.5) <= 1.5
    # intensity scale: a full-scale 16 pixel maps to 1.0
    full = np.full((1, 64), 16.0)
    np.testing.assert_allclose(uci_digits_as_mnist(full).reshape(28, 28)[4:24, 4:24], 1.0, rtol=1e-6)


# --- SVHN ----------------------------------------------------------------------

def write_svhn(folder, n=(6, 4), **override):
    rng = np.random.default_rng(1)
    for split, count in zip(("train", "test"), n):
        content = {"X": rng.integers(0, 256, size=(32, 32, 3, count), dtype=np.uint8),
                   "y": np.array([[10], [1], [5], [9], [10], [3]][:count], dtype=np.uint8)}
        content.update(override)
        scipy.io.savemat(folder / f"{split}_32x32.mat", content)


def test_svhn_grayscale_and_rgb(tmp_path):
    write_svhn(tmp_path)
    splits = load_svhn(tmp_path)
    train = splits["train"]
    assert train.features.shape == (6, 1024) and train.features.dtype == np.float32
    assert train.features.min() >= 0.0 and train.features.max() <= 1.0
    assert train.labels.tolist() == [0, 1, 5, 9, 0, 3]
    assert train.ids[0] == "svhn-train-000000" and len(set(train.ids)) == 6
    assert splits["test"].ids.tolist() == load_svhn(tmp_path)["test"].ids.tolist()
    rgb = load_svhn(tmp_path, grayscale=False)["train"]
    assert rgb.features.shape == (6, 3072)
    # luminance is the BT.601 mix of the channel-first RGB planes
    planes = rgb.features.reshape(6, 3, 1024)
    np.testing.assert_allclose(train.features, planes.transpose(0, 2, 1) @ np.array([0.299, 0.587, 0.114]), atol=1e-5)
    # pixel (row 0, col 1) of image 0 is X[0, 1, :, 0]
    x = scipy.io.loadmat(tmp_path / "train_32x32.mat")["X"]
    np.testing.assert_allclose(planes[0, :, 1], x[0, 1, :, 0] / 255.0, atol=1e-6)


@pytest.mark.parametrize("override, message", [
    ({"y": np.array([[1], [2], [11], [3], [4], [5]])}, "labels must be 1..10"),
    ({"X": np.zeros((28, 28, 3, 6), np.uint8)}, "X must be"),
    ({"y": np.array([[1], [2]])}, "y must have shape"),
])
def test_svhn_refuses_malformed_arrays(tmp_path, override, message):
    write_svhn(tmp_path, **override)
    with pytest.raises(DataError, match=message) as caught:
        load_svhn(tmp_path)
    assert "train_32x32.mat" in str(caught.value)


def test_svhn_refuses_missing_wrong_keys_and_truncated_files(tmp_path):
    with pytest.raises(DataError, match="train_32x32.mat.*not found"):
        load_svhn(tmp_path)
    scipy.io.savemat(tmp_path / "train_32x32.mat", {"images": np.zeros((2, 2))})
    with pytest.raises(DataError, match="train_32x32.mat.*expected variables X and y"):
        load_svhn(tmp_path)
    write_svhn(tmp_path)
    data = (tmp_path / "train_32x32.mat").read_bytes()
    (tmp_path / "train_32x32.mat").write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match="train_32x32.mat.*unreadable"):
        load_svhn(tmp_path)


# --- USPS ----------------------------------------------------------------------

def test_usps_scale_labels_and_ids(tmp_path):
    write_usps(tmp_path, train_lines=[usps_line(1, np.full(256, -1.0)), usps_line(10, np.full(256, 1.0)),
                                      "5 1:0.0 256:1.0"])
    splits = load_usps(tmp_path)
    train = splits["train"]
    assert train.features.shape == (3, 256) and train.features.dtype == np.float32
    assert train.labels.tolist() == [0, 9, 4]
    np.testing.assert_allclose(train.features[0], 0.0)
    np.testing.assert_allclose(train.features[1], 1.0)
    # sparse line: absent indices are libsvm zeros, i.e. mid-grey
    np.testing.assert_allclose(train.features[2, [0, 100, 255]], [0.5, 0.5, 1.0])
    assert train.ids.tolist() == ["usps-train-00000", "usps-train-00001", "usps-train-00002"]
    assert splits["test"].ids[3] == "usps-test-00003"


@pytest.mark.parametrize("line, message", [
    ("11 1:0.5", "label 11"),
    ("0 1:0.5", "label 0"),
    ("3 1:0.5 2:abc", "line 2 is not"),
    ("3 257:0.5", "line 2 is not"),
    ("3 0:0.5", "line 2 is not"),
    ("three 1:0.5", "line 2 is not"),
    ("3 1:5.0", "outside"),
])
def test_usps_refuses_malformed_lines(tmp_path, line, message):
    write_usps(tmp_path, test_lines=["1 1:0.5", line])
    with pytest.raises(DataError, match=message) as caught:
        load_usps(tmp_path)
    assert "usps.t.bz2" in str(caught.value)


def test_usps_refuses_missing_and_truncated_files(tmp_path):
    with pytest.raises(DataError, match="usps.bz2.*not found"):
        load_usps(tmp_path)
    write_usps(tmp_path)
    data = (tmp_path / "usps.bz2").read_bytes()
    (tmp_path / "usps.bz2").write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match="usps.bz2.*cannot read"):
        load_usps(tmp_path)


# --- MNIST-M -------------------------------------------------------------------

def write_mnist_m(folder, labels=(3, 0, 7), size=(28, 28)):
    root = folder / "mnist_m"
    rng = np.random.default_rng(3)
    for split in ("train", "test"):
        (root / f"mnist_m_{split}").mkdir(parents=True, exist_ok=True)
        lines = []
        for i, label in enumerate(labels):
            name = f"{i:08d}.png"
            pixels = rng.integers(0, 256, size=(*size[::-1], 3), dtype=np.uint8)
            Image.fromarray(pixels, mode="RGB").save(root / f"mnist_m_{split}" / name)
            lines.append(f"{name} {label}")
        (root / f"mnist_m_{split}_labels.txt").write_text("\n".join(lines) + "\n")
    return root


def test_mnist_m_grayscale_rgb_and_ids(tmp_path):
    root = write_mnist_m(tmp_path)
    splits = load_mnist_m(tmp_path)
    train = splits["train"]
    assert train.features.shape == (3, 784) and train.features.dtype == np.float32
    assert train.features.min() >= 0.0 and train.features.max() <= 1.0
    assert train.labels.tolist() == [3, 0, 7]
    assert train.ids.tolist() == ["mnistm-train-00000000", "mnistm-train-00000001", "mnistm-train-00000002"]
    # the mnist_m folder itself works too, and gives the same records
    np.testing.assert_array_equal(load_mnist_m(root)["test"].features, splits["test"].features)
    rgb = load_mnist_m(tmp_path, grayscale=False)["train"]
    assert rgb.features.shape == (3, 2352)
    pixels = np.asarray(Image.open(root / "mnist_m_train" / "00000001.png"))
    np.testing.assert_allclose(rgb.features[1].reshape(3, 28, 28)[:, 5, 9], pixels[5, 9] / 255.0, atol=1e-6)
    # grayscale within PIL's integer rounding of the same BT.601 mix
    luma = np.asarray(Image.open(root / "mnist_m_train" / "00000001.png").convert("L")) / 255.0
    np.testing.assert_allclose(train.features[1], luma.reshape(-1), atol=1.5 / 255)


def test_mnist_m_refuses_missing_truncated_and_malformed(tmp_path):
    with pytest.raises(DataError, match="mnist_m_train_labels.txt.*not found"):
        load_mnist_m(tmp_path)
    root = write_mnist_m(tmp_path)
    labels = root / "mnist_m_train_labels.txt"
    good = labels.read_text()

    labels.write_text(good + "00000009.png 4\n")
    with pytest.raises(DataError, match="00000009.png.*missing"):
        load_mnist_m(tmp_path)
    for bad, message in (("00000000.png 12\n", "label 12"), ("00000000.png\n", "not '<name>.png <label>'"),
                         ("00000000.png x\n", "non-integer"), ("00000000.png 1\n" * 2, "more than once")):
        labels.write_text(bad)
        with pytest.raises(DataError, match=message) as caught:
            load_mnist_m(tmp_path)
        assert "mnist_m_train_labels.txt" in str(caught.value)
    labels.write_text(good)

    png = root / "mnist_m_train" / "00000002.png"
    png.write_bytes(png.read_bytes()[:60])
    with pytest.raises(DataError, match="00000002.png.*unreadable"):
        load_mnist_m(tmp_path)
    write_mnist_m(tmp_path, size=(32, 28))
    with pytest.raises(DataError, match="00000000.png.*28×28"):
        load_mnist_m(tmp_path)
