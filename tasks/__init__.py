"""Pipeline stages: file I/O around the privpipe library, plus thin Prefect @task wrappers.

Grouped like the library: ``tasks/pate`` wraps ``privpipe/pate``, ``tasks/removal`` wraps
``privpipe/removal``, and so on. Each stage module has a plain ``run_<stage>(params)``
function (what ``dvc repro`` calls through ``privpipe stage <name>``) and a ``<stage>_task``
Prefect task that the flow chains; both exchange file paths, never tensors.
"""

#: the module of each pipeline stage, in pipeline order (`privpipe stage NAME` and dvc.yaml's stages)
STAGE_MODULES = {
    "prepare": "tasks.prepare",
    "partition": "tasks.pate.partition",
    "dp_pca": "tasks.dp_pca",
    "teachers": "tasks.pate.teachers",
    "aggregate": "tasks.pate.aggregate",
    "student": "tasks.pate.student",
    "finetune": "tasks.finetune.stage",
    "head": "tasks.removal.head",
    "evaluate": "tasks.evaluate",
}
