"""A recipe fitted to the data where a params file writes none (tasks.recipe), and the warning for one that
cannot train."""

from __future__ import annotations

import pytest

from conftest import write_params
from own_data import write_cancer_csv, write_image_folder
from tasks.recipe import TABLE_RULE, TableRule, fitted_recipe, load_run_params, recipe_warnings


def _user_file(project, **sections):
    import yaml

    (project / "params.yaml").write_text(yaml.safe_dump(sections))


def test_a_table_without_recipe_keys_gets_the_linear_recipe_scaled_to_its_rows(project):
    write_cancer_csv(project / "clinic/patients.csv")
    _user_file(project, prepare={"dataset": "csv", "path": "clinic/patients.csv", "id_column": "patient_id",
                                 "label_column": "diagnosis"})
    params = load_run_params("params.yaml")
    assert params.finetune.hidden_units == () and params.finetune.model == "mlp" and not params.dp_pca.enabled
    assert params.finetune.lot_size == 32 and params.finetune.epochs == TABLE_RULE.epochs


def test_an_image_folder_without_recipe_keys_gets_scatternet_and_its_cnn(project):
    write_image_folder(project / "photos", size=(20, 20), per_class=40)
    _user_file(project, prepare={"dataset": "imagefolder", "path": "photos"})
    params = load_run_params("params.yaml")
    assert params.features.transform == "scatternet" and params.features.scatter_j == 2
    assert params.finetune.model == "cnn" and not params.dp_pca.enabled and params.finetune.momentum == 0.9


def test_one_recipe_key_written_keeps_the_files_recipe_and_digits_keep_theirs(project):
    write_image_folder(project / "photos", per_class=40)
    _user_file(project, prepare={"dataset": "imagefolder", "path": "photos"}, finetune={"epochs": 3})
    params = load_run_params("params.yaml")
    assert params.features.transform == "none" and params.finetune.epochs == 3
    write_params(project)  # the project's params.yaml: digits, every key written
    assert load_run_params("params.yaml").finetune.hidden_units == (1000,)


@pytest.mark.parametrize("side, j", [(8, 1), (32, 2)])
def test_small_images_take_one_scattering_scale(side, j):
    recipe = fitted_recipe(kind="imagefolder", records=2000, side=side, train_epsilon=2.4)
    assert recipe.values["features"]["scatter_j"] == j and recipe.values["finetune"]["epochs"] == 19


def test_a_recipe_too_short_for_its_data_is_warned_about(project):
    write_params(project, finetune={"epochs": 2, "lot_size": 64})
    from privpipe.config import load_params

    lines = recipe_warnings(load_params("params.yaml"), records=100)
    assert any("2 epoch(s) in lots of 64 over 100 records is 2 DP-SGD steps" in line for line in lines)
    assert recipe_warnings(load_params("params.yaml"), records=100_000) == []


@pytest.mark.parametrize("records, lot", [(100, 32), (451, 32), (4_000, 256), (100_000, 512)])
def test_a_table_rule_takes_lots_of_a_sixteenth_of_its_rows_as_a_power_of_two_from_32_to_512(records, lot):
    rule = TableRule(hidden_units=(16,), epochs=20, learning_rate=0.5, max_grad_norm=2.0)
    finetune = rule.recipe(records).values["finetune"]
    assert finetune["lot_size"] == lot and finetune["hidden_units"] == (16,) and finetune["epochs"] == 20
    assert finetune["learning_rate"] == 0.5 and finetune["max_grad_norm"] == 2.0 and finetune["momentum"] == 0.0
    assert fitted_recipe(kind="csv", records=records, side=None, train_epsilon=3.0) == TABLE_RULE.recipe(records)
