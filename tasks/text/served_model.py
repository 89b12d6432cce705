"""The registered text model's code, logged as this file (MLflow models-from-code) instead of a
pickled object: what loading a version runs is privpipe's own loader, readable among the
version's artifacts (``code/``), which rebuilds the module from plain files: the weights
(``weights.npy``), the spec (``spec.json``) and the encoder folder. No pickle is logged.

Never imported by privpipe itself: MLflow executes it when it logs and when it loads the model.
"""

from mlflow.models import set_model

from tasks.text.serving import FederatedTextClassifier

set_model(FederatedTextClassifier())
