"""`make demo` / `make test` and the checks of .venv and .venv-tf2 they run
first.

tools/ensure_venv.sh is run against temporary directories holding fake
interpreters (small shell scripts), fake pyenv installations and fake,
broken virtual environments. No test creates a real virtual environment or
installs anything: builds are run with VENV_DRY_RUN=1, which prints the
commands instead, and the one test that runs make's test sessions runs
them with a fake interpreter that only reports how it was called.
"""
import importlib.util
import os
import pathlib
import shutil
import stat
import subprocess
import sys
import tomllib

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
SCRIPT = REPO / "tools" / "ensure_venv.sh"
# What the Makefile gives tools/ensure_venv.sh for each environment.
EXTRAS = "test,demo"
PACKAGES = "tensorflow tensorflow_estimator"
EXTRAS_TF2 = "test"
PACKAGES_TF2 = "tensorflow tf_keras"
# The minor version of the Python running these tests: the fake venvs whose
# bin/python is this interpreter hold it.
RUNNING = f"{sys.version_info[0]}.{sys.version_info[1]}"

pytestmark = pytest.mark.skipif(shutil.which("sh") is None, reason="no sh")


def _executable(path, text):
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text("#!/bin/sh\n" + text + "\n")
  path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
  return path


def _fake_python(directory, version, name="python"):
  """An 'interpreter' that answers every question with its version."""
  return _executable(directory / name, f"echo {version}")


def _failing_shim(directory, name):
  """A pyenv shim for a version pyenv has not selected: it does not run."""
  return _executable(
      directory / name, f'echo "pyenv: {name}: command not found" >&2\nexit 127')


def _fake_pyenv(directory, root, versions=()):
  """`pyenv` in directory whose root holds fake interpreters of versions."""
  for version in versions:
    minor = version.rsplit(".", 1)[0]
    _fake_python(root / "versions" / version / "bin", version, f"python{minor}")
  root.mkdir(parents=True, exist_ok=True)
  _executable(directory / "pyenv", f'[ "$1" = root ] && echo "{root}"')
  return root


def _tools(tmp_path):
  """A PATH entry with only what make and the script need, and no Python."""
  tools = tmp_path / "tools"
  tools.mkdir(exist_ok=True)
  for tool in ("make", "sh", "env", "cksum", "cut", "dirname", "cat", "rm"):
    if shutil.which(tool) and not (tools / tool).exists():
      (tools / tool).symlink_to(shutil.which(tool))
  return tools


def _wrapper(path, *python_args, pythonpath=None):
  """A venv python that is this test's own interpreter, as configured."""
  env = f"PYTHONPATH={pythonpath} " if pythonpath else ""
  args = " ".join(python_args)
  return _executable(path, f'{env}exec "{sys.executable}" {args} "$@"')


def _checksum(name):
  return subprocess.run(
      f"cksum < {name}", shell=True, cwd=REPO, capture_output=True,
      text=True, check=True).stdout.split()[0]


def _stamp(version=None, extras=EXTRAS):
  version = version or ".".join(str(n) for n in sys.version_info[:3])
  return (f"python={version} extras={extras} "
          f"pyproject.toml={_checksum('pyproject.toml')}\n")


def _run(python, venv, version="3.11", what=EXTRAS, packages=PACKAGES,
         path=None, **env):
  """tools/ensure_venv.sh; python is its first argument as given
  (NAME=PYTHON, or a bare PYTHON)."""
  full_env = dict(os.environ)
  full_env.pop("PYENV_ROOT", None)
  full_env.update(env)
  if path is not None:
    full_env["PATH"] = path
  return subprocess.run(
      ["sh", str(SCRIPT), str(python), version, str(venv), what, packages],
      capture_output=True, text=True, env=full_env, timeout=120)


def _usable_venv(tmp_path):
  venv = tmp_path / "venv"
  _wrapper(venv / "bin" / "python", pythonpath=REPO)
  (venv / ".installed").write_text(_stamp())
  return venv


def _commands(output):
  return [line for line in output.splitlines() if line.startswith("+ ")]


# --- .venv: Python 3.11, pyproject.toml's dependencies and extras ----------

def test_unsupported_python_is_named_with_the_way_to_point_make_at_311(
    tmp_path):
  python = _fake_python(tmp_path / "bin", "3.12.1", "python3")
  venv = tmp_path / "venv"
  result = _run(f"PYTHON={python}", venv)
  assert result.returncode == 2
  message = result.stderr.strip()
  assert "\n" not in message, "one message"
  assert f"PYTHON={python}" in message and "Python 3.12.1" in message
  assert "Python 3.11 is needed" in message
  assert "make PYTHON=/path/to/python3.11 test" in message
  assert f"to create {venv}" in message
  assert not venv.exists(), "nothing is built with the wrong Python"


def test_a_bare_python_argument_is_named_python(tmp_path):
  python = _fake_python(tmp_path / "bin", "3.13.0")
  result = _run(python, tmp_path / "venv")
  assert result.returncode == 2
  assert f"cannot use PYTHON={python} " in result.stderr


def test_missing_python_is_named(tmp_path):
  result = _run(f"PYTHON={tmp_path / 'no-such-python'}", tmp_path / "venv")
  assert result.returncode == 2
  assert "was not found" in result.stderr
  assert "make PYTHON=/path/to/python3.11 test" in result.stderr


def test_a_venv_without_bin_python_is_rebuilt_with_python_311(tmp_path):
  python = _fake_python(tmp_path / "bin", "3.11.9")
  venv = tmp_path / "venv"
  (venv / "lib").mkdir(parents=True)
  result = _run(f"PYTHON={python}", venv, VENV_DRY_RUN="1")
  assert result.returncode == 0, result.stderr
  assert f"rebuilding {venv} with {python} (Python 3.11.9)" in result.stdout
  assert f"{venv}/bin/python is missing" in result.stdout
  assert _commands(result.stdout) == [
      f"+ {python} -m venv --clear {venv}",
      f"+ {venv}/bin/python -m pip install --quiet --upgrade pip",
      f"+ {venv}/bin/python -m pip install --quiet -e {REPO}[{EXTRAS}]",
  ]


def test_a_broken_venv_with_an_unsupported_python_says_both(tmp_path):
  python = _fake_python(tmp_path / "bin", "3.12.1")
  venv = tmp_path / "venv"
  _executable(venv / "bin" / "python", "exit 1")
  result = _run(f"PYTHON={python}", venv)
  assert result.returncode == 2
  assert f"to rebuild {venv} ({venv}/bin/python does not run)" in (
      result.stderr)
  assert "Python 3.12.1" in result.stderr
  assert (venv / "bin" / "python").exists(), "nothing removed"


@pytest.mark.parametrize("wanted,held,name", [
    ("3.11", "3.12.1", "PYTHON"), ("3.12", "3.11.9", "PYTHON_TF2")])
def test_a_venv_of_another_python_is_rebuilt_with_the_wanted_one(
    tmp_path, wanted, held, name):
  python = _fake_python(tmp_path / "bin", f"{wanted}.4")
  venv = tmp_path / "venv"
  _fake_python(venv / "bin", held)
  (venv / ".installed").write_text(_stamp(held))
  check = _run(f"{name}={python}", venv, wanted, VENV_CHECK_ONLY="1")
  assert check.returncode == 1
  assert "rebuild needed" in check.stdout
  assert f"holds Python {held}, not {wanted}" in check.stdout
  result = _run(f"{name}={python}", venv, wanted, VENV_DRY_RUN="1")
  assert result.returncode == 0, result.stderr
  assert f"+ {python} -m venv --clear {venv}" in result.stdout


@pytest.mark.parametrize("packages", [PACKAGES, PACKAGES_TF2])
def test_a_venv_lacking_its_packages_is_rebuilt(tmp_path, packages):
  python = _fake_python(tmp_path / "bin", f"{RUNNING}.9")
  venv = tmp_path / "venv"
  # -S: no site-packages, so no tensorflow; the checkout's packages are found.
  _wrapper(venv / "bin" / "python", "-S", pythonpath=REPO)
  (venv / ".installed").write_text(_stamp())
  check = _run(f"PYTHON={python}", venv, RUNNING, packages=packages,
               VENV_CHECK_ONLY="1")
  assert check.returncode == 1
  assert f"packages missing: {packages}" in check.stdout
  assert "estimator_spec" not in check.stdout
  result = _run(f"PYTHON={python}", venv, RUNNING, packages=packages,
                VENV_DRY_RUN="1")
  assert f"rebuilding {venv}" in result.stdout
  assert f"+ {python} -m venv --clear {venv}" in result.stdout


def test_packages_of_another_checkout_do_not_count(tmp_path):
  other = tmp_path / "other_checkout"
  for package in ("estimator_spec", "tpu_embedding_columns"):
    (other / package).mkdir(parents=True)
    (other / package / "__init__.py").write_text("")
  venv = tmp_path / "venv"
  _wrapper(venv / "bin" / "python", pythonpath=other)
  (venv / ".installed").write_text(_stamp())
  check = _run("PYTHON=unused", venv, RUNNING, packages="tensorflow",
               VENV_CHECK_ONLY="1")
  assert check.returncode == 1
  assert f"estimator_spec (from {other.resolve()}/estimator_spec)" in (
      check.stdout)


def test_the_current_directory_does_not_count(tmp_path):
  venv = tmp_path / "venv"
  _wrapper(venv / "bin" / "python", "-S")
  (venv / ".installed").write_text(_stamp())
  result = subprocess.run(
      ["sh", str(SCRIPT), "unused", RUNNING, str(venv), EXTRAS, "tensorflow"],
      capture_output=True, text=True, cwd=REPO, timeout=120,
      env=dict(os.environ, VENV_CHECK_ONLY="1"))
  assert result.returncode == 1
  assert "estimator_spec" in result.stdout


def test_a_usable_venv_is_reused_silently_whatever_python_is(tmp_path):
  python = _fake_python(tmp_path / "bin", "3.10.1")
  venv = _usable_venv(tmp_path)
  result = _run(f"PYTHON={python}", venv, RUNNING, packages="tensorflow")
  assert result.returncode == 0, result.stderr
  assert result.stdout == "" and result.stderr == ""
  check = _run(f"PYTHON={python}", venv, RUNNING, packages="tensorflow",
               VENV_CHECK_ONLY="1")
  assert check.returncode == 0 and "usable" in check.stdout
  # The same venv is not the one of another Python version.
  other = "3.12" if RUNNING != "3.12" else "3.11"
  check = _run(f"PYTHON={python}", venv, other, packages="tensorflow",
               VENV_CHECK_ONLY="1")
  assert check.returncode == 1 and f"not {other}" in check.stdout


@pytest.mark.parametrize("stamp", [
    None, "python=3.11.7 extras=test pyproject.toml=1\n",
    # This pyproject.toml, but installed by another micro version.
    _stamp(f"{RUNNING}.999")])
def test_a_missing_or_old_stamp_installs_again_into_the_same_venv(
    tmp_path, stamp):
  venv = _usable_venv(tmp_path)
  if stamp is None:
    (venv / ".installed").unlink()
  else:
    (venv / ".installed").write_text(stamp)
  result = _run("PYTHON=unused", venv, RUNNING, packages="tensorflow",
                VENV_DRY_RUN="1")
  assert result.returncode == 0, result.stderr
  assert f"installing this checkout into {venv}" in result.stdout
  assert f"-m pip install --quiet -e {REPO}[{EXTRAS}]" in result.stdout
  assert "venv --clear" not in result.stdout


@pytest.mark.parametrize("args", [
    ["PYTHON=", "3.11", "venv", EXTRAS],              # PACKAGES left out
    ["PYTHON=", "311", "venv", EXTRAS, PACKAGES],     # not major.minor
    ["PYTHON=", "venv", EXTRAS, PACKAGES, "3.11"]])   # the old order
def test_wrong_arguments_are_refused_and_nothing_is_built(tmp_path, args):
  result = subprocess.run(["sh", str(SCRIPT), *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
  assert result.returncode == 1
  assert "tools/ensure_venv.sh" in result.stderr
  assert not list(tmp_path.iterdir())


# --- .venv-tf2: Python 3.12, the same install, TensorFlow 2.21 ------------

def test_venv_tf2_is_built_with_python_312_and_pyprojects_own_stack(tmp_path):
  python = _fake_python(tmp_path / "bin", "3.12.1", "python3.12")
  venv = tmp_path / "venv-tf2"
  result = _run(f"PYTHON_TF2={python}", venv, "3.12", EXTRAS_TF2,
                PACKAGES_TF2, VENV_DRY_RUN="1")
  assert result.returncode == 0, result.stderr
  assert f"creating {venv} with {python} (Python 3.12.1)" in result.stdout
  # No requirements file and no --no-deps: pyproject.toml's markers give
  # TensorFlow 2.21 and tf_keras on Python 3.12.
  assert _commands(result.stdout) == [
      f"+ {python} -m venv --clear {venv}",
      f"+ {venv}/bin/python -m pip install --quiet --upgrade pip",
      f"+ {venv}/bin/python -m pip install --quiet -e {REPO}[{EXTRAS_TF2}]",
  ]


def test_venv_tf2_with_another_python_names_python_tf2(tmp_path):
  python = _fake_python(tmp_path / "bin", "3.11.9")
  venv = tmp_path / "venv-tf2"
  result = _run(f"PYTHON_TF2={python}", venv, "3.12", EXTRAS_TF2,
                PACKAGES_TF2)
  assert result.returncode == 2
  message = result.stderr.strip()
  assert "\n" not in message
  assert f"cannot use PYTHON_TF2={python} to create {venv}" in message
  assert "it is Python 3.11.9" in message
  assert "Python 3.12 is needed" in message
  assert "make PYTHON_TF2=/path/to/python3.12 test" in message
  assert "PYTHON=" not in message.replace("PYTHON_TF2=", "")
  assert not venv.exists()


# --- Finding a Python when none is given -------------------------------------

def _find(tmp_path, path, version="3.12", name="PYTHON_TF2", **env):
  venv = tmp_path / "venv"
  return venv, _run(f"{name}=", venv, version, EXTRAS_TF2, PACKAGES_TF2,
                    path=path, VENV_DRY_RUN="1", **env)


def test_python312_on_the_path_is_used_when_it_runs(tmp_path):
  tools = _tools(tmp_path)
  python = _fake_python(tmp_path / "bin", "3.12.7", "python3.12")
  root = _fake_pyenv(tmp_path / "pyenv-bin", tmp_path / "pyenv", ["3.12.9"])
  venv, result = _find(
      tmp_path, f"{python.parent}:{tmp_path / 'pyenv-bin'}:{tools}")
  assert result.returncode == 0, result.stderr
  assert f"creating {venv} with {python} (Python 3.12.7)" in result.stdout
  assert _commands(result.stdout)[0] == f"+ {python} -m venv --clear {venv}"
  assert str(root) not in result.stdout


@pytest.mark.parametrize("on_path", ["failing shim", "another version"])
@pytest.mark.parametrize("pyenv", ["pyenv command", "PYENV_ROOT only"])
def test_else_pyenvs_newest_312_is_used(tmp_path, on_path, pyenv):
  tools = _tools(tmp_path)
  shims = tmp_path / "shims"
  if on_path == "failing shim":
    _failing_shim(shims, "python3.12")
  else:
    _fake_python(shims, "3.11.9", "python3.12")
  root = _fake_pyenv(tmp_path / "pyenv-bin", tmp_path / "pyenv",
                     ["3.12.1", "3.12.3", "3.12.10", "3.11.7", "3.13.0"])
  # A 3.12 that does not run is passed over, however new.
  _executable(root / "versions" / "3.12.11" / "bin" / "python3.12", "exit 1")
  path = f"{shims}:{tools}"
  env = {}
  if pyenv == "pyenv command":
    path = f"{shims}:{tmp_path / 'pyenv-bin'}:{tools}"
  else:
    env["PYENV_ROOT"] = str(root)
  venv, result = _find(tmp_path, path, **env)
  assert result.returncode == 0, result.stderr
  newest = root / "versions" / "3.12.10" / "bin" / "python3.12"
  assert f"creating {venv} with {newest} (Python 3.12.10)" in result.stdout
  assert _commands(result.stdout)[0] == f"+ {newest} -m venv --clear {venv}"


def test_a_given_python_tf2_wins_over_those_found(tmp_path):
  tools = _tools(tmp_path)
  on_path = _fake_python(tmp_path / "bin", "3.12.7", "python3.12")
  given = _fake_python(tmp_path / "given", "3.12.2", "python")
  venv = tmp_path / "venv"
  result = _run(f"PYTHON_TF2={given}", venv, "3.12", EXTRAS_TF2, PACKAGES_TF2,
                path=f"{on_path.parent}:{tools}", VENV_DRY_RUN="1")
  assert result.returncode == 0, result.stderr
  assert _commands(result.stdout)[0] == f"+ {given} -m venv --clear {venv}"


def test_python3_is_the_last_resort_when_it_is_the_wanted_version(tmp_path):
  tools = _tools(tmp_path)
  python3 = _fake_python(tmp_path / "bin", "3.11.9", "python3")
  venv, result = _find(tmp_path, f"{python3.parent}:{tools}", "3.11",
                       "PYTHON")
  assert result.returncode == 0, result.stderr
  assert _commands(result.stdout)[0] == f"+ {python3} -m venv --clear {venv}"


def test_no_python_312_anywhere_is_one_message_with_what_was_tried(tmp_path):
  tools = _tools(tmp_path)
  shim = _failing_shim(tmp_path / "shims", "python3.12")
  python3 = _fake_python(tmp_path / "shims", "3.11.7", "python3")
  root = _fake_pyenv(tmp_path / "pyenv-bin", tmp_path / "pyenv", ["3.11.7"])
  venv, result = _find(
      tmp_path, f"{shim.parent}:{tmp_path / 'pyenv-bin'}:{tools}")
  assert result.returncode == 2
  message = result.stderr.strip()
  assert "\n" not in message, "one message"
  assert f"found no Python 3.12 to create {venv}: PYTHON_TF2 not given" in (
      message)
  assert f"python3.12 on the PATH ({shim}) does not run" in message
  assert f"pyenv has no 3.12 ({root}/versions/3.12*/bin/python3.12)" in message
  assert f"python3 ({python3}) is Python 3.11.7" in message
  assert "make PYTHON_TF2=/path/to/python3.12 test" in message
  assert not venv.exists()
  assert result.stdout == ""
  # Without pyenv and without any python: the same message, saying so.
  venv, result = _find(tmp_path, str(tools))
  assert result.returncode == 2
  assert "no python3.12 on the PATH; no pyenv." in result.stderr
  assert "make PYTHON_TF2=/path/to/python3.12 test" in result.stderr


# --- A venv installed from a requirements file (.venv-peers) ---------------

REQUIREMENTS = "bench/peers/requirements.txt"
REQUIREMENTS_WHAT = f"requirements={REQUIREMENTS}"


def _requirements_stamp(version=None, requirements_checksum=None):
  version = version or ".".join(str(n) for n in sys.version_info[:3])
  requirements_checksum = requirements_checksum or _checksum(REQUIREMENTS)
  return (f"python={version} requirements={REQUIREMENTS}:"
          f"{requirements_checksum} pyproject.toml={_checksum('pyproject.toml')}\n")


def _run_requirements(python, venv, packages="tensorflow numpy",
                      version=None, **env):
  return _run(f"PYTHON={python}", venv, version or RUNNING,
              REQUIREMENTS_WHAT, packages, **env)


def test_a_requirements_venv_is_built_from_the_file_then_the_checkout_no_deps(
    tmp_path):
  python = _fake_python(tmp_path / "bin", "3.11.9")
  venv = tmp_path / "venv-peers"
  result = _run_requirements(python, venv, version="3.11", VENV_DRY_RUN="1")
  assert result.returncode == 0, result.stderr
  assert f"creating {venv}" in result.stdout
  assert _commands(result.stdout) == [
      f"+ {python} -m venv --clear {venv}",
      f"+ {venv}/bin/python -m pip install --quiet --upgrade pip",
      f"+ {venv}/bin/python -m pip install --quiet -r {REPO}/{REQUIREMENTS}",
      f"+ {venv}/bin/python -m pip install --quiet --no-deps -e {REPO}",
  ]


def test_a_usable_requirements_venv_is_reused_and_a_changed_file_reinstalls(
    tmp_path):
  venv = tmp_path / "venv-peers"
  _wrapper(venv / "bin" / "python", pythonpath=REPO)
  (venv / ".installed").write_text(_requirements_stamp())
  result = _run_requirements("unused", venv, packages="tensorflow")
  assert result.returncode == 0, result.stderr
  assert result.stdout == "" and result.stderr == ""
  # The stamp of an extras venv does not do for a requirements venv.
  (venv / ".installed").write_text(_stamp())
  check = _run_requirements("unused", venv, packages="tensorflow",
                            VENV_CHECK_ONLY="1")
  assert check.returncode == 1
  assert f"install needed: pyproject.toml or {REQUIREMENTS} changed" in check.stdout
  # An older requirements file: installed again into the same venv.
  (venv / ".installed").write_text(
      _requirements_stamp(requirements_checksum="1"))
  result = _run_requirements("unused", venv, packages="tensorflow",
                             VENV_DRY_RUN="1")
  assert result.returncode == 0, result.stderr
  assert f"installing this checkout into {venv}" in result.stdout
  assert f"-m pip install --quiet -r {REPO}/{REQUIREMENTS}" in result.stdout
  assert f"-m pip install --quiet --no-deps -e {REPO}" in result.stdout
  assert "venv --clear" not in result.stdout


def test_a_requirements_venv_with_an_unsupported_python_names_the_file(
    tmp_path):
  python = _fake_python(tmp_path / "bin", "3.13.0")
  venv = tmp_path / "venv-peers"
  result = _run_requirements(python, venv, version="3.11")
  assert result.returncode == 2
  assert "Python 3.13.0" in result.stderr
  assert (f"Python 3.11 is needed: the packages of {REQUIREMENTS} are "
          f"installed into {venv}") in result.stderr
  assert not venv.exists()


def test_a_missing_requirements_file_is_named(tmp_path):
  result = _run("PYTHON=unused", tmp_path / "venv", "3.11",
                "requirements=no-such-file.txt", "numpy")
  assert result.returncode == 1
  assert f"{REPO}/no-such-file.txt does not exist" in result.stderr
  assert not (tmp_path / "venv").exists()


# --- The Makefile -----------------------------------------------------------

def _make(*args, path=None, **env):
  full_env = dict(os.environ)
  for name in ("PYTHON", "PYTHON_TF2", "MAKEFLAGS", "PYENV_ROOT"):
    full_env.pop(name, None)
  full_env.update(env)
  if path is not None:
    full_env["PATH"] = path
  return subprocess.run(["make", "--no-print-directory", *args], cwd=REPO,
                        capture_output=True, text=True, env=full_env,
                        timeout=120)


needs_make = pytest.mark.skipif(shutil.which("make") is None, reason="no make")

CHECK_VENV = (f"sh tools/ensure_venv.sh 'PYTHON=' 3.11 '.venv' '{EXTRAS}' "
              f"'{PACKAGES}'")
CHECK_VENV_TF2 = (f"sh tools/ensure_venv.sh 'PYTHON_TF2=' 3.12 '.venv-tf2' "
                  f"'{EXTRAS_TF2}' '{PACKAGES_TF2}'")
PYTEST = "-m pytest -q -n 2 --dist loadfile"
KERAS_2_SESSION = f"TF_USE_LEGACY_KERAS=1 .venv-tf2/bin/python {PYTEST}"
KERAS_3_SESSION = f".venv-tf2/bin/python {PYTEST}"


@needs_make
def test_demo_and_test_check_the_venvs_first():
  demo = _make("-n", "demo").stdout.splitlines()
  assert demo == [CHECK_VENV, ".venv/bin/python -m examples.train_ctr"]
  test = _make("-n", "test").stdout
  assert test.index("tools/ensure_venv.sh") < test.index("chromium")
  lines = test.rstrip().splitlines()
  # The type check and the whole suite in .venv (TF 2.15), then the two
  # sessions of tests/tf2_tests.txt in .venv-tf2 (TF 2.21): Keras 2, Keras 3.
  assert lines[-4:] == [".venv/bin/python -m mypy",
                        f".venv/bin/python {PYTEST}",
                        KERAS_2_SESSION, KERAS_3_SESSION]
  checks = [line for line in lines if "tools/ensure_venv.sh" in line]
  assert checks == [CHECK_VENV, CHECK_VENV_TF2]


@needs_make
def test_venv_tf2_and_test_tf2_targets():
  assert _make("-n", "venv-tf2").stdout.splitlines() == [CHECK_VENV_TF2]
  test = _make("-n", "test-tf2").stdout.rstrip().splitlines()
  assert test == [CHECK_VENV_TF2, KERAS_2_SESSION, KERAS_3_SESSION]
  # TEST_WORKERS sets the processes of every session.
  test = _make("-n", "test-tf2", "TEST_WORKERS=1").stdout
  assert test.count("-m pytest -q -n 1 --dist loadfile") == 2


@needs_make
def test_the_pythons_given_to_make_reach_the_checks():
  line = _make("-n", "venv-tf2", "PYTHON_TF2=/opt/py/bin/python3.12").stdout
  assert "'PYTHON_TF2=/opt/py/bin/python3.12' 3.12 '.venv-tf2'" in line
  line = _make("-n", "venv-tf2", PYTHON_TF2="/env/python3.12").stdout
  assert "'PYTHON_TF2=/env/python3.12' 3.12 '.venv-tf2'" in line
  line = _make("-n", "venv", "PYTHON=/opt/py/bin/python3.11").stdout
  assert "'PYTHON=/opt/py/bin/python3.11' 3.11 '.venv'" in line
  # Each variable builds its own environment only.
  line = _make("-n", "venv", "PYTHON_TF2=/opt/py/bin/python3.12").stdout
  assert line.startswith("sh tools/ensure_venv.sh 'PYTHON=' 3.11")


@needs_make
def test_make_test_tf2_runs_a_keras_2_then_a_keras_3_session(tmp_path):
  # A .venv-tf2 that the check finds usable (Python 3.12.1, its stamp,
  # tensorflow and tf_keras as empty packages) and whose python, run as
  # `-m pytest`, reports its Keras variable instead of testing.
  packages = tmp_path / "packages"
  for name in ("tensorflow", "tf_keras"):
    (packages / name).mkdir(parents=True)
    (packages / name / "__init__.py").write_text("")
  venv = tmp_path / "venv-tf2"
  _executable(venv / "bin" / "python", f"""case "$1" in
  -c) echo 3.12.1 ;;
  -) exec env PYTHONPATH={packages}:{REPO} "{sys.executable}" "$@" ;;
  *) echo "session TF_USE_LEGACY_KERAS=${{TF_USE_LEGACY_KERAS-unset}}" \\
       "TF_CPP_MIN_LOG_LEVEL=${{TF_CPP_MIN_LOG_LEVEL-unset}} $*" ;;
esac""")
  (venv / ".installed").write_text(_stamp("3.12.1", EXTRAS_TF2))
  # TF_USE_LEGACY_KERAS=1 in the caller's environment does not leak into
  # the Keras 3 session.
  result = _make("test-tf2", f"VENV_TF2={venv}", TF_USE_LEGACY_KERAS="1")
  assert result.returncode == 0, result.stdout + result.stderr
  sessions = [line for line in result.stdout.splitlines()
              if line.startswith("session ")]
  assert sessions == [
      f"session TF_USE_LEGACY_KERAS=1 TF_CPP_MIN_LOG_LEVEL=2 {PYTEST}",
      f"session TF_USE_LEGACY_KERAS=unset TF_CPP_MIN_LOG_LEVEL=2 {PYTEST}",
  ]


@needs_make
def test_make_finds_pyenvs_312_when_the_shim_does_not_run(tmp_path):
  # This machine's case: pyenv's shim python3.12 is on the PATH but fails
  # unless PYENV_VERSION is set; pyenv's own 3.12 builds .venv-tf2.
  tools = _tools(tmp_path)
  shim = _failing_shim(tmp_path / "shims", "python3.12")
  root = _fake_pyenv(tmp_path / "pyenv-bin", tmp_path / "pyenv",
                     ["3.11.7", "3.12.1"])
  venv = tmp_path / "venv-tf2"
  result = _make("venv-tf2", f"VENV_TF2={venv}", VENV_DRY_RUN="1",
                 path=f"{shim.parent}:{tmp_path / 'pyenv-bin'}:{tools}")
  assert result.returncode == 0, result.stderr
  python = root / "versions" / "3.12.1" / "bin" / "python3.12"
  assert f"creating {venv} with {python} (Python 3.12.1)" in result.stdout
  assert f"+ {python} -m venv --clear {venv}" in result.stdout
  # Without pyenv: make stops with the one message saying what to do.
  result = _make("venv-tf2", f"VENV_TF2={venv}", VENV_DRY_RUN="1",
                 path=f"{shim.parent}:{tools}")
  assert result.returncode != 0
  messages = [line for line in result.stderr.splitlines()
              if line.startswith("make: found no")]
  assert len(messages) == 1
  assert "make PYTHON_TF2=/path/to/python3.12 test" in messages[0]
  assert not venv.exists()


@needs_make
def test_make_finds_python311_on_the_path_for_venv(tmp_path):
  tools = _tools(tmp_path)
  python = _fake_python(tmp_path / "bin", "3.11.9", "python3.11")
  venv = tmp_path / "venv"
  result = _make("venv", f"VENV={venv}", VENV_DRY_RUN="1",
                 path=f"{python.parent}:{tools}")
  assert result.returncode == 0, result.stderr
  assert f"+ {python} -m venv --clear {venv}" in result.stdout
  assert f"-m pip install --quiet -e {REPO}[{EXTRAS}]" in result.stdout


@needs_make
def test_make_with_an_unsupported_python_stops_with_the_message(tmp_path):
  python = _fake_python(tmp_path / "bin", "3.12.1")
  venv = tmp_path / "venv"
  result = _make("demo", f"PYTHON={python}", f"VENV={venv}")
  assert result.returncode != 0
  assert "Python 3.12.1" in result.stderr
  assert "make PYTHON=/path/to/python3.11 test" in result.stderr
  assert "examples.train_ctr" not in result.stdout
  assert not venv.exists()


@needs_make
def test_the_requirements_environments_and_their_targets_are_gone():
  for target in ("venv-tf-keras", "test-tf-keras"):
    result = _make("-n", target)
    assert result.returncode != 0
    assert f"No rule to make target '{target}'" in result.stderr
  for name in ("requirements-tf2.txt", "requirements-tf-keras.txt"):
    assert not (REPO / name).exists()
    for user in ("Makefile", "tools/ensure_venv.sh", "pyproject.toml"):
      assert name not in (REPO / user).read_text(), (user, name)
  # `make clean` still removes an .venv-tf-keras an earlier make left.
  clean = _make("-n", "clean").stdout
  assert ".venv-tf2 " in clean and ".venv-tf-keras " in clean


# --- pyproject.toml: the stack by Python version ---------------------------

STACK_311 = {"tensorflow-cpu==2.15.*", "tensorflow-estimator==2.15.*",
             "protobuf>=3.20.3,<5", "numpy<2", "google-crc32c>=1.5,<2"}
STACK_312 = {"tensorflow==2.21.*", "tf_keras==2.21.*", "tensorboard==2.21.*",
             "protobuf>=6.31.1,<8", "numpy>=2,<3", "google-crc32c>=1.5,<2"}


@pytest.mark.parametrize("python,stack", [
    ("3.11.7", STACK_311), ("3.12.1", STACK_312), ("3.13.0", STACK_312)])
def test_pyproject_chooses_the_stack_by_python_version(python, stack):
  from packaging.requirements import Requirement  # pylint: disable=import-outside-toplevel
  from packaging.specifiers import SpecifierSet  # pylint: disable=import-outside-toplevel
  project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
  assert python in SpecifierSet(project["requires-python"])
  environment = {"python_version": python.rsplit(".", 1)[0],
                 "python_full_version": python}
  chosen = set()
  for line in project["dependencies"]:
    requirement = Requirement(line)
    assert requirement.marker is not None, f"{line}: for which Python?"
    if requirement.marker.evaluate(environment):
      chosen.add(f"{requirement.name}{requirement.specifier}")
  # packaging writes a specifier's parts in its own order.
  assert chosen == {f"{Requirement(r).name}{Requirement(r).specifier}"
                    for r in stack}
  minor = python.rsplit(".", 1)[0]
  assert (f"Programming Language :: Python :: {minor}"
          in project["classifiers"])


def test_pyproject_refuses_the_pythons_without_a_stack():
  from packaging.specifiers import SpecifierSet  # pylint: disable=import-outside-toplevel
  requires = SpecifierSet(tomllib.loads(
      (REPO / "pyproject.toml").read_text())["project"]["requires-python"])
  for python in ("3.10.13", "3.14.0"):
    assert python not in requires


def test_the_type_check_is_strict_on_the_config_model_and_in_the_test_extra():
  pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
  assert any(requirement.startswith("mypy") for requirement in
             pyproject["project"]["optional-dependencies"]["test"])
  mypy = pyproject["tool"]["mypy"]
  assert mypy["strict"] is True
  assert "estimator_spec/config" in mypy["files"]
  for path in mypy["files"]:
    assert (REPO / path).exists(), f"[tool.mypy] files names {path}"


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None,
                    reason="no mypy here")
def test_the_type_check_fails_on_an_unannotated_function(tmp_path):
  module = tmp_path / "unannotated.py"
  module.write_text("def rate(step):\n  return 0.1 * step\n")
  result = subprocess.run(
      [sys.executable, "-m", "mypy", "--config-file",
       str(REPO / "pyproject.toml"), "--cache-dir", str(tmp_path / "cache"),
       str(module)], cwd=REPO, capture_output=True, text=True, timeout=300,
      check=False)
  assert result.returncode == 1, result.stdout + result.stderr
  assert "unannotated.py:1: error: Function is missing a type annotation" in (
      result.stdout)


def test_ci_runs_make_test():
  lines = (REPO / ".ci" / "run").read_text().splitlines()
  assert "make test" in lines


@needs_make
def test_the_peer_benchmark_has_its_own_venv_outside_make_test():
  venv = _make("-n", "venv-peers").stdout.splitlines()
  assert len(venv) == 2
  assert ("'PYTHON=' 3.11 '.venv-peers' "
          "'requirements=bench/peers/requirements.txt' "
          "'torch fbgemm_gpu numpy'") in venv[0]
  # torchrec without its CUDA fbgemm-gpu dependency, after the rest.
  assert venv[1] == (".venv-peers/bin/python -m pip install --quiet "
                     "--no-deps -r bench/peers/requirements-torchrec.txt")
  bench = _make("-n", "bench-peers").stdout.rstrip().splitlines()
  assert bench[-1] == ".venv/bin/python -m bench.peers.compare"
  assert any("'.venv' " in line for line in bench)
  assert "peers" not in _make("-n", "test").stdout
  assert ".venv-peers" in _make("-n", "clean").stdout
  assert ".venv-peers/" in (REPO / ".gitignore").read_text().splitlines()


def test_the_peer_requirements_pin_versions_that_go_together():
  def pins(name):
    lines = [line.split("#")[0].strip() for line in
             (REPO / "bench" / "peers" / name).read_text().splitlines()]
    return [line for line in lines if line]
  base = pins("requirements.txt")
  assert {"torch==2.13.0", "fbgemm-gpu-cpu==1.8.0"} <= set(base)
  assert not any(line.startswith(("torchrec", "fbgemm-gpu=", "tensorflow"))
                 for line in base)
  assert pins("requirements-torchrec.txt") == ["torchrec==1.8.0"]
