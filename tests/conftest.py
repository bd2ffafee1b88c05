"""Test-session setup: quiet TensorFlow logs, the hypothesis profiles, and
which test files run on which TensorFlow.

Two environments run the tests (`make test` runs both): .venv/ with TF 2.15
and tensorflow-estimator runs every file; .venv-tf2/ with current
TensorFlow (Python 3.12, with both Keras 3 and Keras 2 as `tf_keras`) runs
the files that tests/tf2_tests.txt lists, in two sessions: with
`TF_USE_LEGACY_KERAS=1` (Keras 2, what TPUEstimator programs use) the files
of its `[keras 2]` section, without it (Keras 3, TF's default) those of its
`[keras 3]` section. Files not listed are not collected there, and the
session's header says how many were left out, so nothing is counted as
passed that did not run; a listed file that is missing or fails to import
fails the run. A test inside a listed file that needs TF 2.15 carries
`@pytest.mark.tf215`: deselected on current TensorFlow (pytest's summary
counts it as deselected, never as passed). A test that runs on both stacks
but whose second run would add little beside its time (`make test` must
stay under 35 minutes) carries `@pytest.mark.reference_only`: it runs with
TF 2.15 only, deselected (and counted so) on current TensorFlow; each one
says why in a comment.
"""
import os
import pathlib

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import hypothesis  # pylint: disable=g-import-not-at-top

import pytest  # pylint: disable=g-import-not-at-top

# TensorFlow as the library imports it (without TF 2.21's GPU-build import
# notices, estimator_spec/tf_import.py).
from estimator_spec import tf_import  # pylint: disable=g-import-not-at-top

tf_import.import_tensorflow()
import tensorflow as tf  # pylint: disable=g-import-not-at-top,wrong-import-position

from estimator_spec import quiet  # pylint: disable=g-import-not-at-top

quiet.silence_deprecation_notices()

TESTS = pathlib.Path(__file__).resolve().parent
TF2_LIST = TESTS / "tf2_tests.txt"
ON_TF215 = tf.__version__.startswith("2.15.")


KERAS_2 = os.environ.get("TF_USE_LEGACY_KERAS", "").lower() in ("1", "true")


def tf2_test_files(section=None):
  """The test files (names) of a section of tests/tf2_tests.txt ('keras 2'
  or 'keras 3'; this session's Keras when None)."""
  if section is None:
    section = "keras 2" if KERAS_2 else "keras 3"
  names, current = [], None
  for line in TF2_LIST.read_text().splitlines():
    line = line.split("#", 1)[0].strip()
    if line.startswith("[") and line.endswith("]"):
      current = line[1:-1].strip()
    elif line and current == section:
      names.append(line)
  return names


def pytest_configure(config):
  config.addinivalue_line(
      "markers", "reference_only: runs with TF 2.15 only (time); "
      "deselected on current TensorFlow.")
  config.addinivalue_line(
      "markers", "tf215: needs TF 2.15 (or tensorflow-estimator); "
      "deselected on current TensorFlow.")
  if not ON_TF215:
    missing = [n for section in ("keras 2", "keras 3")
               for n in tf2_test_files(section) if not (TESTS / n).is_file()]
    if missing:
      raise pytest.UsageError(
          f"{TF2_LIST} lists test files that do not exist: {missing}")


def _selection_note():
  if ON_TF215:
    return f"TensorFlow {tf.__version__}: every test file runs"
  listed = set(tf2_test_files())
  section = "keras 2" if KERAS_2 else "keras 3"
  keras = "Keras 2 (TF_USE_LEGACY_KERAS=1)" if KERAS_2 else "Keras 3"
  others = sorted(p.name for p in TESTS.glob("test_*.py")
                  if p.name not in listed)
  return (f"TensorFlow {tf.__version__} with {keras}: only the {len(listed)} "
          f"test files of the [{section}] section of tests/{TF2_LIST.name} "
          f"run here; the other {len(others)} run in .venv/ (TF 2.15) or in "
          "the other Keras's session (not collected here)")


def pytest_report_header(config):
  del config
  return _selection_note()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
  # Also under -q, which hides the header; pytest's counts stay the last
  # line.
  del exitstatus, config
  if not ON_TF215:
    terminalreporter.write_line(_selection_note())


def pytest_ignore_collect(collection_path, config):
  del config
  if ON_TF215 or collection_path.suffix != ".py":
    return None
  if not collection_path.name.startswith("test_"):
    return None
  if collection_path.parent != TESTS:
    return None
  return collection_path.name not in set(tf2_test_files()) or None


# The files whose tests take minutes, longest first: they start first, so
# that `make test`'s two workers (a file's tests on one) end together.
LONGEST_FIRST = ("test_two_stacks.py", "test_demo.py",
                 "test_cluster_training.py", "test_wheel.py",
                 "test_cluster_harness.py", "test_migrate.py",
                 "test_tpu_programs.py", "test_engine_kernels.py",
                 "test_enqueue_oracle.py", "test_mid_level_conformance.py",
                 "test_cli.py")


def _start_rank(item):
  name = item.path.name
  return (LONGEST_FIRST.index(name) if name in LONGEST_FIRST else
          len(LONGEST_FIRST))


def pytest_collection_modifyitems(config, items):
  items.sort(key=_start_rank)  # stable: the rest keep their order
  if ON_TF215:
    return

  def stays(item):
    return not (item.get_closest_marker("tf215") or
                item.get_closest_marker("reference_only"))

  deselected = [item for item in items if not stays(item)]
  if deselected:
    config.hook.pytest_deselected(items=deselected)
    items[:] = [item for item in items if stays(item)]

# Local runs draw new examples each time ("project"); CI (CI=true, as
# .ci/run is started) draws the same examples on every run ("ci"), so that a
# fresh `make test` never fails by chance. HYPOTHESIS_PROFILE picks either.
_COMMON = dict(
    deadline=None,
    print_blob=True,
    suppress_health_check=[hypothesis.HealthCheck.too_slow],
)
hypothesis.settings.register_profile("project", **_COMMON)
hypothesis.settings.register_profile("ci", derandomize=True, database=None,
                                     **_COMMON)
_ci = os.environ.get("CI", "").lower() in ("1", "true", "yes")
hypothesis.settings.load_profile(
    os.environ.get("HYPOTHESIS_PROFILE", "ci" if _ci else "project"))
