"""privpipe: privacy-preserving ML building blocks.

The library half of the project: algorithms and data handling as plain functions
and classes on arrays and models. It imports nothing of Prefect, MLflow or DVC;
``tasks/`` and ``flows/`` wrap it for orchestration and tracking.
"""

__version__ = "0.1.0"
