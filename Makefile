# One-word entry points. Each target creates the virtual environment at .venv/
# from this repository's own files when it is missing or out of date.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export TF_CPP_MIN_LOG_LEVEL := 2

.PHONY: demo test venv clean browser

venv: $(STAMP)

$(STAMP): setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m examples.train_ctr

test: $(STAMP) browser
	$(PY) -m pytest -q

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

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
