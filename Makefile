# privpipe — every target installs what it needs into .venv first.
#   make run     the pipeline on the embedded default (scikit-learn's digits)
#   make test    the quality gates (ruff, mypy), the docs site (mkdocs --strict) and the test suite (offline)
#   make repro   the same pipeline through DVC (dvc repro)
#   make ui      the MLflow UI on http://127.0.0.1:5000 (another port: make ui PORT=5001)
#   make serve   the scheduled deployments (retraining, deletion processing) on a local Prefect server
#   make bench   the benchmarks (needs ../shared/data or --mnist DIR)

PYTHON ?= python3
PORT ?= 5000
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)

export PYTHONUNBUFFERED := 1
export DVC_NO_ANALYTICS := 1
export MLFLOW_DISABLE_TELEMETRY := true
export DO_NOT_TRACK := true
export NO_MKDOCS_2_WARNING := 1

.PHONY: install run test repro serve ui bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -qq --upgrade pip
	$(BIN)/pip install -qq -e '.[test]'
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/privpipe run

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/mkdocs build --strict --quiet
	$(BIN)/python -m pytest -q

repro: $(STAMP)
	$(BIN)/privpipe init-data
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/dvc repro
	@# the lifetime ledgers the run charged (dvc repro holds DVC's lock while it runs)
	if ls data/budget/*.json >/dev/null 2>&1; then $(BIN)/dvc add -q data/budget/*.json; fi

serve: $(STAMP)
	$(BIN)/privpipe serve

ui: $(STAMP)
	MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false $(BIN)/mlflow ui \
	  --backend-store-uri sqlite:///$(abspath mlflow.db) --host 127.0.0.1 --port $(PORT) --workers 1

bench: $(STAMP)
	$(BIN)/python bench/epoch_time.py
	$(BIN)/python bench/accountant_speed.py
	$(BIN)/python bench/mnist_dpsgd.py --rows all

clean:
	rm -rf artifacts data/prepared mlflow.db mlartifacts .prefect .site
