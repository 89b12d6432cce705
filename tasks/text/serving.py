"""The registered federated text model: text in, class name out (an MLflow pyfunc).

Bundles the encoder folder, the trained weights and the spec, so the registered version
serves on its own: ``mlflow.pyfunc.load_model("models:/privpipe-text/1").predict(["..."])``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from mlflow.pyfunc import PythonModel

from privpipe.text import embed, load_encoder, tokenize
from tasks.text.model import load_text_model, predict_batches

__all__ = ["FederatedTextClassifier"]


class FederatedTextClassifier(PythonModel):
    def load_context(self, context) -> None:
        encoder = Path(context.artifacts["encoder"])
        self.model, self.spec = load_text_model(Path(context.artifacts["model"]), encoder=encoder)
        self.encoder, self.tokenizer = load_encoder(encoder)

    def predict(self, context, model_input, params=None) -> list[str]:
        texts = list(model_input.iloc[:, 0]) if hasattr(model_input, "iloc") else list(model_input)
        inputs: tuple[np.ndarray, ...]
        if self.spec["mode"] == "frozen":
            inputs = (embed(self.encoder, self.tokenizer, texts, max_length=self.spec["max_length"],
                            batch_size=self.spec["embed_batch_size"]),)
        else:
            inputs = tokenize(self.tokenizer, texts, max_length=self.spec["max_length"])
        with torch.no_grad():
            labels = predict_batches(self.model, tuple(np.asarray(a) for a in inputs))
        return [self.spec["classes"][int(k)] for k in labels]
