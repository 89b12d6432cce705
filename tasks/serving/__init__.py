"""The served form of released models: logging them as MLflow pyfuncs that take a team's raw records
(:mod:`tasks.serving.logged`), and batch scoring with a registered one (:mod:`tasks.serving.batch`,
``privpipe predict``). The model itself, raw records in and label names out, is privpipe.serving."""
