# One-word entry points, `make demo` and `make test`. Each first makes the
# virtual environment at .venv/ ready (tools/ensure_venv.sh, run on every
# make and cheap): created when missing, rebuilt when broken (bin/python
# missing or not running, another Python than 3.11, packages missing), the
# package installed again when pyproject.toml changed. .venv holds Python
# 3.11 and what pyproject.toml installs there: TensorFlow 2.15 and
# tensorflow-estimator.
#
# `make test` first runs the type check (mypy, configured in pyproject.toml's
# [tool.mypy]) in .venv, then the tests. Each test session runs on
# TEST_WORKERS processes (pytest-xdist, default 2: this machine's cores;
# `make TEST_WORKERS=1 test` runs them in one), a test file's tests on one
# worker so that a module's shared fixtures are built once.
#
# `make test` also makes .venv-tf2/ ready the same way (`make venv-tf2`):
# Python 3.12 with this checkout installed as in .venv, `pip install -e
# '.[test]'`, where pyproject.toml's markers choose TensorFlow 2.21 with
# Keras 2 (tf_keras) and Keras 3. It runs there the test files that
# tests/tf2_tests.txt lists, in two sessions: with TF_USE_LEGACY_KERAS=1
# (tf.keras is tf_keras, as TPUEstimator programs run on TensorFlow 2.21)
# the [keras 2] section, then without it (Keras 3, TensorFlow's default)
# the [keras 3] section; tests/conftest.py chooses the section.
#
# The Python that builds each environment: PYTHON for .venv (3.11),
# PYTHON_TF2 for .venv-tf2 (3.12), given on the command line
# (`make PYTHON_TF2=/path/to/python3.12 test`) or in the environment.
# Without it, tools/ensure_venv.sh looks for one when it has to build:
# python3.11 (python3.12) on the PATH when it runs, else pyenv's newest
# 3.11 (3.12), else python3 when it is that version; otherwise it stops
# with one message saying how to point make at one.
#
# `make bench-peers` (optional, heavy, not part of `make test`): the TorchRec
# peer benchmark (bench/peers/compare.py), with TorchRec in its own
# .venv-peers/ (`make venv-peers`, Python 3.11: bench/peers/requirements.txt,
# then torchrec without its CUDA dependency,
# bench/peers/requirements-torchrec.txt).
PYTHON ?=
PYTHON_TF2 ?=
VENV := .venv
PY := $(VENV)/bin/python
PY_VERSION := 3.11
EXTRAS := test,demo
PACKAGES := tensorflow tensorflow_estimator
VENV_TF2 := .venv-tf2
PY_TF2 := $(VENV_TF2)/bin/python
PY_TF2_VERSION := 3.12
EXTRAS_TF2 := test
PACKAGES_TF2 := tensorflow tf_keras
TEST_WORKERS ?= 2
PYTEST := -m pytest -q -n $(TEST_WORKERS) --dist loadfile
export TF_CPP_MIN_LOG_LEVEL := 2
# The test sessions set TF_USE_LEGACY_KERAS themselves: one from the
# caller's environment is not passed on, so the Keras 3 session is Keras 3.
unexport TF_USE_LEGACY_KERAS

VENV_PEERS := .venv-peers
PEERS_REQUIREMENTS := bench/peers/requirements.txt
PEERS_TORCHREC := bench/peers/requirements-torchrec.txt
PEERS_PACKAGES := torch fbgemm_gpu numpy

.PHONY: demo test test-tf2 venv venv-tf2 clean browser venv-peers bench-peers dist

venv:
	@sh tools/ensure_venv.sh 'PYTHON=$(PYTHON)' $(PY_VERSION) '$(VENV)' '$(EXTRAS)' '$(PACKAGES)'

venv-tf2:
	@sh tools/ensure_venv.sh 'PYTHON_TF2=$(PYTHON_TF2)' $(PY_TF2_VERSION) '$(VENV_TF2)' '$(EXTRAS_TF2)' '$(PACKAGES_TF2)'

# torchrec after the rest, without its dependencies (requirements.txt says
# why); pip returns at once when it is already there.
venv-peers:
	@sh tools/ensure_venv.sh 'PYTHON=$(PYTHON)' $(PY_VERSION) '$(VENV_PEERS)' 'requirements=$(PEERS_REQUIREMENTS)' '$(PEERS_PACKAGES)'
	@$(VENV_PEERS)/bin/python -m pip install --quiet --no-deps -r $(PEERS_TORCHREC)

demo: venv
	$(PY) -m examples.train_ctr

test: venv venv-tf2 browser
	$(PY) -m mypy
	$(PY) $(PYTEST)
	TF_USE_LEGACY_KERAS=1 $(PY_TF2) $(PYTEST)
	$(PY_TF2) $(PYTEST)

# Only the TensorFlow 2.21 part of `make test`: the [keras 2] session, then
# the [keras 3] one.
test-tf2: venv-tf2
	TF_USE_LEGACY_KERAS=1 $(PY_TF2) $(PYTEST)
	$(PY_TF2) $(PYTEST)

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
# .venv-tf-keras is the environment an earlier version of this Makefile made.
clean:
	rm -rf $(VENV) $(VENV_TF2) .venv-tf-keras $(VENV_PEERS) build dist *.egg-info .pytest_cache .hypothesis .mypy_cache runs
	@echo "clean: the compiled-kernel cache is kept: $${HOST_EMBEDDING_KERNEL_CACHE:-$${XDG_CACHE_HOME:-$$HOME/.cache}/tpu-embedding-estimator/kernels} (remove it by hand if you like)"
