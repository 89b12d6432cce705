"""Write a folder of small colour images in torchvision's ImageFolder layout, for the images tutorial
(docs/tutorials/own-data.md):

    .venv/bin/python examples/colour_digits.py                          # writes data/raw/colour-digits/<class>/*.png
    .venv/bin/privpipe run --params examples/params-colour-digits.yaml  # every stage on them, DP-SGD at ε = 3

scikit-learn's 1,797 digits (8×8, grey; they ship with scikit-learn, nothing is downloaded), each scaled
to 16×16 and painted in a random light colour on a random dark background (as in MNIST, the ink carries
the signal): one sub-folder per class, named after it (``zero`` … ``nine``), one PNG per image. The
record id `privpipe forget` names is the path under the folder's parent, e.g. ``colour-digits/three/0003.png``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

__all__ = ["CLASSES", "write_colour_digits"]

CLASSES = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
SCALE = 2  # 8×8 → 16×16


def write_colour_digits(folder: Path, *, seed: int = 0) -> int:
    """The images under ``folder``; returns how many were written."""
    from PIL import Image  # deferred: only this script needs it
    from sklearn.datasets import load_digits  # deferred: sklearn.datasets takes seconds

    digits = load_digits()
    rng = np.random.default_rng(seed)
    for name in CLASSES:
        (folder / name).mkdir(parents=True, exist_ok=True)
    for index, (image, label) in enumerate(zip(digits.images, digits.target)):
        ink = np.kron(image / 16.0, np.ones((SCALE, SCALE)))[..., None]  # 0..1, nearest-neighbour upscale
        foreground, background = rng.uniform(180, 255, size=3), rng.uniform(0, 20, size=3)  # light ink, dark ground
        pixels = ink * foreground + (1 - ink) * background
        Image.fromarray(pixels.round().astype(np.uint8), mode="RGB").save(folder / CLASSES[label] / f"{index:04d}.png")
    return len(digits.images)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("data/raw/colour-digits"), help="the folder to write")
    args = parser.parse_args()
    print(f"{args.out}: {write_colour_digits(args.out)} colour images in {len(CLASSES)} class folders")


if __name__ == "__main__":
    main()
