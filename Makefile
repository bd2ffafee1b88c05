# One-word entry points, `make demo` and `make test`. Each first makes the
# virtual environment at .venv/ ready (tools/ensure_venv.sh, run on every
# make and cheap): created when missing, rebuilt when broken (bin/python
# missing or not running, another Python than 3.11, packages missing), the
# package installed again when pyproject.toml changed. Building it needs Python
# 3.11: python3.11 when it is on the PATH, else python3; another one is
# named with `make PYTHON=/path/to/python3.11 demo`.
#
# `make test` first runs the type check (mypy, configured in pyproject.toml's
# [tool.mypy]) in .venv, then the tests.
#
# `make test` also makes .venv-tf2/ ready the same way (`make venv-tf2`):
# current TensorFlow (requirements-tf2.txt) with this checkout installed
# without pyproject.toml's TF 2.15 pins, and runs there the test files that
# tests/tf2_tests.txt lists (tests/conftest.py collects only those on a
# TensorFlow other than 2.15).
#
# `make bench-peers` (optional, heavy, not part of `make test`): the TorchRec
# peer benchmark (bench/peers/compare.py), with TorchRec in its own
# .venv-peers/ (`make venv-peers`: bench/peers/requirements.txt, then
# torchrec without its CUDA dependency, bench/peers/requirements-torchrec.txt).
ifeq ($(origin PYTHON),undefined)
PYTHON := $(shell command -v python3.11 2>/dev/null || echo python3)
endif
VENV := .venv
PY := $(VENV)/bin/python
EXTRAS := test,demo
VENV_TF2 := .venv-tf2
PY_TF2 := $(VENV_TF2)/bin/python
TF2_REQUIREMENTS := requirements-tf2.txt
TF2_PACKAGES := tensorflow keras numpy pytest hypothesis
export TF_CPP_MIN_LOG_LEVEL := 2

VENV_TF_KERAS := .venv-tf-keras
TF_KERAS_REQUIREMENTS := requirements-tf-keras.txt
TF_KERAS_PACKAGES := tensorflow tf_keras numpy pytest hypothesis

VENV_PEERS := .venv-peers
PEERS_REQUIREMENTS := bench/peers/requirements.txt
PEERS_TORCHREC := bench/peers/requirements-torchrec.txt
PEERS_PACKAGES := torch fbgemm_gpu numpy

.PHONY: demo test test-tf2 test-tf-keras venv venv-tf2 venv-tf-keras clean browser venv-peers bench-peers dist

venv:
	@sh tools/ensure_venv.sh '$(PYTHON)' '$(VENV)' '$(EXTRAS)'

venv-tf2:
	@sh tools/ensure_venv.sh '$(PYTHON)' '$(VENV_TF2)' 'requirements=$(TF2_REQUIREMENTS)' '$(TF2_PACKAGES)'

venv-tf-keras:
	@sh tools/ensure_venv.sh '$(PYTHON)' '$(VENV_TF_KERAS)' 'requirements=$(TF_KERAS_REQUIREMENTS)' '$(TF_KERAS_PACKAGES)'

# torchrec after the rest, without its dependencies (requirements.txt says
# why); pip returns at once when it is already there.
venv-peers:
	@sh tools/ensure_venv.sh '$(PYTHON)' '$(VENV_PEERS)' 'requirements=$(PEERS_REQUIREMENTS)' '$(PEERS_PACKAGES)'
	@$(VENV_PEERS)/bin/python -m pip install --quiet --no-deps -r $(PEERS_TORCHREC)

demo: venv
	$(PY) -m examples.train_ctr

test: venv venv-tf2 browser
	$(PY) -m mypy
	$(PY) -m pytest -q
	$(PY_TF2) -m pytest -q

# Only the current-TensorFlow part of `make test`.
test-tf2: venv-tf2
	$(PY_TF2) -m pytest -q

# The Keras example's tests with Keras 2 on current TensorFlow (tf_keras);
# optional, not part of `make test` (requirements-tf-keras.txt says why).
test-tf-keras: venv-tf-keras
	TF_USE_LEGACY_KERAS=1 $(VENV_TF_KERAS)/bin/python -m pytest -q tests/test_keras_example.py

# This library, TF 2.15 and TorchRec on the same workload, side by side
# (bench/peers/compare.py; ours and TF in .venv, TorchRec in .venv-peers).
# Several minutes; run it on an idle machine.
bench-peers: venv venv-peers
	$(PY) -m bench.peers.compare

# Headless Chromium and its driver for the browser test of the profile
# report (Debian's packages). Never fails: where they cannot be installed,
# one line says why and that test is skipped.
CHROMIUM_PACKAGES := chromium chromium-driver
browser:
	@if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then \
	  :; \
	elif ! command -v apt-get >/dev/null 2>&1; then \
	  echo "browser: no apt-get here; install $(CHROMIUM_PACKAGES) by hand, or the browser test is skipped"; \
	elif [ "$$(id -u)" != 0 ]; then \
	  echo "browser: not root, cannot apt-get install $(CHROMIUM_PACKAGES); the browser test is skipped"; \
	elif ! (apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	        apt-get install -y -qq $(CHROMIUM_PACKAGES)) >/dev/null 2>&1; then \
	  echo "browser: apt-get install $(CHROMIUM_PACKAGES) failed; the browser test is skipped"; \
	fi

# The source distribution and the wheel in dist/ (pypa's `build`, in an
# isolated build environment), then their metadata checked as PyPI would
# (`twine check --strict`). tests/test_wheel.py installs such a wheel into
# a fresh environment and runs the README's program there.
dist: venv
	rm -rf dist
	$(PY) -m build --outdir dist .
	$(PY) -m twine check --strict dist/*

# Removes what make and the runs made in this checkout, asking nothing:
# the environments, build output, and runs/ (the demo's and your training
# runs' model directories). The compiled-kernel cache is shared by every
# checkout and environment of this user, so it stays; its folder is named.
clean:
	rm -rf $(VENV) $(VENV_TF2) $(VENV_TF_KERAS) $(VENV_PEERS) build dist *.egg-info .pytest_cache .hypothesis .mypy_cache runs
	@echo "clean: the compiled-kernel cache is kept: $${HOST_EMBEDDING_KERNEL_CACHE:-$${XDG_CACHE_HOME:-$$HOME/.cache}/tpu-embedding-estimator/kernels} (remove it by hand if you like)"
