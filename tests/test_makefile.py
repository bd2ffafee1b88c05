"""`make demo` / `make test` and the check of .venv they run first.

tools/ensure_venv.sh is run against temporary directories holding fake
interpreters (small shell scripts) and fake, broken virtual environments.
No test creates a real virtual environment or installs anything: builds are
run with VENV_DRY_RUN=1, which prints the commands instead.
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
EXTRAS = "test,demo"

pytestmark = pytest.mark.skipif(shutil.which("sh") is None, reason="no sh")


def _executable(path, text):
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text("#!/bin/sh\n" + text + "\n")
  path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
  return path


def _fake_python(directory, version, name="python"):
  """An 'interpreter' that answers every question with its version."""
  return _executable(directory / name, f"echo {version}")


def _wrapper(path, *python_args, pythonpath=None):
  """A venv python that is this test's own interpreter, as configured."""
  env = f"PYTHONPATH={pythonpath} " if pythonpath else ""
  args = " ".join(python_args)
  return _executable(path, f'{env}exec "{sys.executable}" {args} "$@"')


def _stamp(version=None):
  version = version or ".".join(str(n) for n in sys.version_info[:3])
  checksum = subprocess.run(
      "cksum < pyproject.toml", shell=True, cwd=REPO, capture_output=True,
      text=True, check=True).stdout.split()[0]
  return f"python={version} extras={EXTRAS} pyproject.toml={checksum}\n"


def _run(python, venv, **env):
  full_env = dict(os.environ)
  full_env.update(env)
  return subprocess.run(
      ["sh", str(SCRIPT), str(python), str(venv), EXTRAS],
      capture_output=True, text=True, env=full_env, timeout=120)


def _usable_venv(tmp_path):
  venv = tmp_path / "venv"
  _wrapper(venv / "bin" / "python", pythonpath=REPO)
  (venv / ".installed").write_text(_stamp())
  return venv


def test_unsupported_python_is_named_with_the_way_to_point_make_at_311(
    tmp_path):
  python = _fake_python(tmp_path / "bin", "3.12.1", "python3")
  venv = tmp_path / "venv"
  result = _run(python, venv)
  assert result.returncode == 2
  message = result.stderr.strip()
  assert "\n" not in message, "one message"
  assert f"PYTHON={python}" in message and "Python 3.12.1" in message
  assert "Python 3.11 is needed" in message
  assert "make PYTHON=python3.11 demo" in message
  assert f"to create {venv}" in message
  assert not venv.exists(), "nothing is built with the wrong Python"


def test_missing_python_is_named(tmp_path):
  result = _run(tmp_path / "no-such-python", tmp_path / "venv")
  assert result.returncode == 2
  assert "was not found" in result.stderr
  assert "make PYTHON=python3.11 demo" in result.stderr


def test_a_venv_without_bin_python_is_rebuilt_with_python_311(tmp_path):
  python = _fake_python(tmp_path / "bin", "3.11.9")
  venv = tmp_path / "venv"
  (venv / "lib").mkdir(parents=True)
  result = _run(python, venv, VENV_DRY_RUN="1")
  assert result.returncode == 0, result.stderr
  assert f"rebuilding {venv}" in result.stdout
  assert f"{venv}/bin/python is missing" in result.stdout
  assert f"+ {python} -m venv --clear {venv}" in result.stdout
  assert f"-m pip install --quiet -e {REPO}[{EXTRAS}]" in result.stdout


def test_a_broken_venv_with_an_unsupported_python_says_both(tmp_path):
  python = _fake_python(tmp_path / "bin", "3.12.1")
  venv = tmp_path / "venv"
  _executable(venv / "bin" / "python", "exit 1")
  result = _run(python, venv)
  assert result.returncode == 2
  assert f"to rebuild {venv} ({venv}/bin/python does not run)" in (
      result.stderr)
  assert "Python 3.12.1" in result.stderr
  assert (venv / "bin" / "python").exists(), "nothing removed"


def test_a_venv_of_another_python_is_rebuilt(tmp_path):
  python = _fake_python(tmp_path / "bin", "3.11.9")
  venv = tmp_path / "venv"
  _fake_python(venv / "bin", "3.12.1")
  (venv / ".installed").write_text(_stamp("3.12.1"))
  check = _run(python, venv, VENV_CHECK_ONLY="1")
  assert check.returncode == 1
  assert "rebuild needed" in check.stdout
  assert "holds Python 3.12.1, not 3.11" in check.stdout
  result = _run(python, venv, VENV_DRY_RUN="1")
  assert f"+ {python} -m venv --clear {venv}" in result.stdout


def test_a_venv_whose_python_lacks_tensorflow_is_rebuilt(tmp_path):
  python = _fake_python(tmp_path / "bin", "3.11.9")
  venv = tmp_path / "venv"
  # -S: no site-packages, so no tensorflow; the checkout's packages are found.
  _wrapper(venv / "bin" / "python", "-S", pythonpath=REPO)
  (venv / ".installed").write_text(_stamp())
  check = _run(python, venv, VENV_CHECK_ONLY="1")
  assert check.returncode == 1
  assert "packages missing: tensorflow tensorflow_estimator" in check.stdout
  assert "estimator_spec" not in check.stdout
  result = _run(python, venv, VENV_DRY_RUN="1")
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
  check = _run(tmp_path / "unused", venv, VENV_CHECK_ONLY="1")
  assert check.returncode == 1
  assert f"estimator_spec (from {other.resolve()}/estimator_spec)" in (
      check.stdout)


def test_the_current_directory_does_not_count(tmp_path):
  venv = tmp_path / "venv"
  _wrapper(venv / "bin" / "python", "-S")
  (venv / ".installed").write_text(_stamp())
  result = subprocess.run(
      ["sh", str(SCRIPT), "unused", str(venv), EXTRAS],
      capture_output=True, text=True, cwd=REPO, timeout=120,
      env=dict(os.environ, VENV_CHECK_ONLY="1"))
  assert result.returncode == 1
  assert "estimator_spec" in result.stdout


def test_a_usable_venv_is_reused_silently_whatever_python_is(tmp_path):
  python = _fake_python(tmp_path / "bin", "3.12.1")
  venv = _usable_venv(tmp_path)
  result = _run(python, venv)
  assert result.returncode == 0, result.stderr
  assert result.stdout == "" and result.stderr == ""
  check = _run(python, venv, VENV_CHECK_ONLY="1")
  assert check.returncode == 0 and "usable" in check.stdout


@pytest.mark.parametrize("stamp", [None, "python=3.11.7 extras=test pyproject.toml=1\n"])
def test_a_missing_or_old_stamp_installs_again_into_the_same_venv(
    tmp_path, stamp):
  venv = _usable_venv(tmp_path)
  if stamp is None:
    (venv / ".installed").unlink()
  else:
    (venv / ".installed").write_text(stamp)
  result = _run(tmp_path / "unused", venv, VENV_DRY_RUN="1")
  assert result.returncode == 0, result.stderr
  assert f"installing this checkout into {venv}" in result.stdout
  assert f"-m pip install --quiet -e {REPO}[{EXTRAS}]" in result.stdout
  assert "venv --clear" not in result.stdout


# --- A venv installed from a requirements file (.venv-tf2) -----------------

REQUIREMENTS = "requirements-tf2.txt"
TF2_WHAT = f"requirements={REQUIREMENTS}"


def _requirements_stamp(version=None, requirements_checksum=None):
  version = version or ".".join(str(n) for n in sys.version_info[:3])

  def checksum(name):
    return subprocess.run(
        f"cksum < {name}", shell=True, cwd=REPO, capture_output=True,
        text=True, check=True).stdout.split()[0]

  requirements_checksum = requirements_checksum or checksum(REQUIREMENTS)
  return (f"python={version} requirements={REQUIREMENTS}:"
          f"{requirements_checksum} pyproject.toml={checksum('pyproject.toml')}\n")


def _run_tf2(python, venv, packages="tensorflow numpy", **env):
  full_env = dict(os.environ)
  full_env.update(env)
  return subprocess.run(
      ["sh", str(SCRIPT), str(python), str(venv), TF2_WHAT, packages],
      capture_output=True, text=True, env=full_env, timeout=120)


def test_a_requirements_venv_is_built_from_the_file_then_the_checkout_no_deps(
    tmp_path):
  python = _fake_python(tmp_path / "bin", "3.11.9")
  venv = tmp_path / "venv-tf2"
  result = _run_tf2(python, venv, VENV_DRY_RUN="1")
  assert result.returncode == 0, result.stderr
  assert f"creating {venv}" in result.stdout
  commands = [line for line in result.stdout.splitlines()
              if line.startswith("+ ")]
  assert commands == [
      f"+ {python} -m venv --clear {venv}",
      f"+ {venv}/bin/python -m pip install --quiet --upgrade pip",
      f"+ {venv}/bin/python -m pip install --quiet -r {REPO}/{REQUIREMENTS}",
      f"+ {venv}/bin/python -m pip install --quiet --no-deps -e {REPO}",
  ]


def test_a_usable_requirements_venv_is_reused_and_a_changed_file_reinstalls(
    tmp_path):
  venv = tmp_path / "venv-tf2"
  _wrapper(venv / "bin" / "python", pythonpath=REPO)
  (venv / ".installed").write_text(_requirements_stamp())
  result = _run_tf2(tmp_path / "unused", venv)
  assert result.returncode == 0, result.stderr
  assert result.stdout == "" and result.stderr == ""
  # The stamp of an .venv (extras) does not do for a requirements venv.
  (venv / ".installed").write_text(_stamp())
  check = _run_tf2(tmp_path / "unused", venv, VENV_CHECK_ONLY="1")
  assert check.returncode == 1
  assert f"install needed: pyproject.toml or {REQUIREMENTS} changed" in check.stdout
  # An older requirements file: installed again into the same venv.
  (venv / ".installed").write_text(
      _requirements_stamp(requirements_checksum="1"))
  result = _run_tf2(tmp_path / "unused", venv, VENV_DRY_RUN="1")
  assert result.returncode == 0, result.stderr
  assert f"installing this checkout into {venv}" in result.stdout
  assert f"-m pip install --quiet -r {REPO}/{REQUIREMENTS}" in result.stdout
  assert f"-m pip install --quiet --no-deps -e {REPO}" in result.stdout
  assert "venv --clear" not in result.stdout


def test_a_requirements_venv_checks_the_packages_it_is_given(tmp_path):
  python = _fake_python(tmp_path / "bin", "3.11.9")
  venv = tmp_path / "venv-tf2"
  _wrapper(venv / "bin" / "python", "-S", pythonpath=REPO)
  (venv / ".installed").write_text(_requirements_stamp())
  check = _run_tf2(python, venv, packages="tensorflow keras",
                   VENV_CHECK_ONLY="1")
  assert check.returncode == 1
  assert "packages missing: tensorflow keras" in check.stdout
  assert "tensorflow_estimator" not in check.stdout
  result = _run_tf2(python, venv, VENV_DRY_RUN="1")
  assert f"+ {python} -m venv --clear {venv}" in result.stdout


def test_a_requirements_venv_with_an_unsupported_python_names_the_file(
    tmp_path):
  python = _fake_python(tmp_path / "bin", "3.13.0")
  venv = tmp_path / "venv-tf2"
  result = _run_tf2(python, venv)
  assert result.returncode == 2
  assert "Python 3.13.0" in result.stderr
  assert (f"Python 3.11 is needed: the packages of {REQUIREMENTS} are "
          f"installed into {venv}") in result.stderr
  assert not venv.exists()


def test_a_missing_requirements_file_is_named(tmp_path):
  result = subprocess.run(
      ["sh", str(SCRIPT), "unused", str(tmp_path / "venv"),
       "requirements=no-such-file.txt"],
      capture_output=True, text=True, timeout=120)
  assert result.returncode == 1
  assert f"{REPO}/no-such-file.txt does not exist" in result.stderr
  assert not (tmp_path / "venv").exists()


# --- The Makefile -----------------------------------------------------------

def _make(*args, path=None):
  env = dict(os.environ)
  env.pop("PYTHON", None)
  env.pop("MAKEFLAGS", None)
  if path is not None:
    env["PATH"] = path
  return subprocess.run(["make", "--no-print-directory", *args], cwd=REPO,
                        capture_output=True, text=True, env=env, timeout=120)


needs_make = pytest.mark.skipif(shutil.which("make") is None, reason="no make")


@needs_make
def test_demo_and_test_check_the_venv_first():
  demo = _make("-n", "demo").stdout.splitlines()
  assert "tools/ensure_venv.sh" in demo[0] and f"'{EXTRAS}'" in demo[0]
  assert demo[-1] == ".venv/bin/python -m examples.train_ctr"
  test = _make("-n", "test").stdout
  assert test.index("tools/ensure_venv.sh") < test.index("chromium")
  lines = test.rstrip().splitlines()
  # The type check, the TF 2.15 suite, then the TF2 list in .venv-tf2.
  assert lines[-3:] == [".venv/bin/python -m mypy",
                        ".venv/bin/python -m pytest -q",
                        ".venv-tf2/bin/python -m pytest -q"]
  checks = [line for line in lines if "tools/ensure_venv.sh" in line]
  assert len(checks) == 2
  assert "'.venv' " in checks[0] and f"'{EXTRAS}'" in checks[0]
  assert "'.venv-tf2' 'requirements=requirements-tf2.txt'" in checks[1]
  assert "'tensorflow keras numpy pytest hypothesis'" in checks[1]


@needs_make
def test_venv_tf2_and_test_tf2_targets():
  venv = _make("-n", "venv-tf2").stdout.splitlines()
  assert len(venv) == 1 and "'.venv-tf2' 'requirements=" in venv[0]
  test = _make("-n", "test-tf2").stdout.rstrip().splitlines()
  assert test[-1] == ".venv-tf2/bin/python -m pytest -q"
  assert not any(line.startswith(".venv/bin/python") for line in test)


def test_the_tf2_requirements_are_current_tensorflow_without_the_estimator():
  lines = [line.split("#")[0].strip() for line in
           (REPO / "requirements-tf2.txt").read_text().splitlines()]
  lines = [line for line in lines if line]
  assert "tensorflow-cpu==2.21.*" in lines
  assert "numpy>=2,<3" in lines
  assert {"pytest>=7", "hypothesis>=6.80"} <= set(lines)
  assert not any("estimator" in line for line in lines)


@needs_make
def test_make_prefers_python311_and_else_python3(tmp_path):
  tools = tmp_path / "bin"
  for tool in ("make", "sh"):
    (tools / tool).parent.mkdir(parents=True, exist_ok=True)
    (tools / tool).symlink_to(shutil.which(tool))
  with_311 = _fake_python(tmp_path / "with311", "3.11.9", "python3.11")
  line = _make("-n", "venv", path=f"{with_311.parent}:{tools}").stdout
  assert f"sh tools/ensure_venv.sh '{with_311}'" in line
  line = _make("-n", "venv", path=str(tools)).stdout
  assert "sh tools/ensure_venv.sh 'python3'" in line


@needs_make
def test_make_with_an_unsupported_python_stops_with_the_message(tmp_path):
  python = _fake_python(tmp_path / "bin", "3.12.1")
  venv = tmp_path / "venv"
  result = _make("demo", f"PYTHON={python}", f"VENV={venv}")
  assert result.returncode != 0
  assert "Python 3.12.1" in result.stderr
  assert "make PYTHON=python3.11 demo" in result.stderr
  assert "examples.train_ctr" not in result.stdout
  assert not venv.exists()


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
  assert ("'.venv-peers' 'requirements=bench/peers/requirements.txt' "
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
