"""Where the served text model's class lived before tasks/ was grouped (issue 16).

MLflow pickles a pyfunc model's class by its module path: text model versions registered
before the regroup name ``tasks.text_serving.FederatedTextClassifier``, and this alias keeps
them loadable. New versions name :mod:`tasks.text.serving`.
"""

from tasks.text.serving import FederatedTextClassifier

__all__ = ["FederatedTextClassifier"]
