"""Pipeline stages: file I/O around the privpipe library, plus thin Prefect @task wrappers.

Each stage module has a plain ``run_<stage>(params, ...)`` function (what ``dvc repro``
calls through ``privpipe stage <name>``) and a ``<stage>_task`` Prefect task that the
flow chains; both exchange file paths, never tensors.
"""
