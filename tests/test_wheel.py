"""The built artifacts as users get them.

`python -m build` makes the sdist and the wheel from this checkout (as
`make dist`); twine checks their metadata as PyPI would. The sdist holds
what a clone holds (MANIFEST.in): every file the README and docs/ link to
or name, the Makefile and tools/ensure_venv.sh its `make demo` and `make
test` run, the tests with their data; unpacked, it builds with `pip wheel`
the same wheel as the checkout. The wheel is installed into a fresh
virtual environment with no source tree on the path (its dependencies come
from this environment's site-packages, read as a plain path so that this
checkout's editable install is not), once for the module: the README's
program runs there from an empty directory (it trains with the compiled
kernels built from the installed package's own source into an empty
cache), and the console command `estimator-spec` answers there. The fresh
environment has the running Python, so the test holds on both stacks: in
.venv (Python 3.11, TensorFlow 2.15) and in .venv-tf2 (Python 3.12,
TensorFlow 2.21), where the program runs with TF_USE_LEGACY_KERAS=1
(tf.keras is tf_keras, Keras 2), as TPUEstimator programs do there.
"""
import os
import pathlib
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile

import pytest

import estimator_spec
from tests import test_readme as readme_checks

REPO = pathlib.Path(__file__).resolve().parent.parent
_ENV = {k: v for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "PYTHONHOME")}
_ENV["TF_CPP_MIN_LOG_LEVEL"] = "2"
# Keras 2 for the README's program: on Python 3.12 and later (TensorFlow
# 2.21) only with TF_USE_LEGACY_KERAS=1; on 3.11 TensorFlow 2.15's own.
ON_TF221_STACK = sys.version_info >= (3, 12)
if ON_TF221_STACK:
  _ENV["TF_USE_LEGACY_KERAS"] = "1"
else:
  _ENV.pop("TF_USE_LEGACY_KERAS", None)
# The console command pyproject.toml's [project.scripts] installs.
COMMAND = "estimator-spec"
# What the sdist holds whole, beside the packages (MANIFEST.in).
SDIST_FOLDERS = ("bench", "docs", "examples", "tests", "tools")
PACKAGES = ("estimator_spec", "tpu_embedding_columns")
# A file name in a Markdown code span: `examples/dlrm.py`, `bench/...`.
NAMED_PATH = re.compile(r"`([\w.-]+(?:/[\w.-]+)+)`")


def _readme_program():
  """The README's first ```python block: the import change's program."""
  text = (REPO / "README.md").read_text()
  return re.search(r"```python\n(.*?)```", text, re.S).group(1)


def _run(args, **kwargs):
  return subprocess.run(args, capture_output=True, text=True, check=False,
                        **kwargs)


def _wheel_names(wheel):
  with zipfile.ZipFile(wheel) as archive:
    return sorted(archive.namelist())


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
  """(wheel, sdist) built from this checkout as `make dist` builds them:
  the sdist, then the wheel from the sdist (a wheel built straight from
  the checkout would also carry what a stale `build/` folder there holds,
  such as modules since removed)."""
  out = tmp_path_factory.mktemp("dist")
  build = _run([sys.executable, "-m", "build", "--outdir", str(out),
                str(REPO)], env=_ENV, timeout=600)
  assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
  wheels = list(out.glob("*.whl"))
  sdists = list(out.glob("*.tar.gz"))
  assert len(wheels) == 1 and len(sdists) == 1
  return wheels[0], sdists[0]


@pytest.fixture(scope="module")
def unpacked_sdist(dist, tmp_path_factory):
  """The sdist's top folder, unpacked."""
  _, sdist = dist
  where = tmp_path_factory.mktemp("sdist")
  with tarfile.open(sdist) as archive:
    archive.extractall(where, filter="data")
  top = where / f"tpu_embedding_estimator-{estimator_spec.__version__}"
  assert top.is_dir(), sorted(where.iterdir())
  return top


@pytest.fixture(scope="module")
def installed(dist, tmp_path_factory):
  """A fresh virtual environment with the wheel installed (its console
  command in its bin/): its folder and its site-packages."""
  wheel, _ = dist
  venv = tmp_path_factory.mktemp("installed") / "venv"
  made = _run([sys.executable, "-m", "venv", "--without-pip", str(venv)],
              timeout=120)
  assert made.returncode == 0, made.stderr
  python = venv / "bin" / "python"
  site = pathlib.Path(_run(
      [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()"
       "['purelib'])"], timeout=60).stdout.strip())
  # pip of this environment installs into the fresh one (--python), so the
  # console command's script starts the fresh environment's Python.
  install = _run([sys.executable, "-m", "pip", "--python", str(python),
                  "install", "--no-deps", "--no-index", str(wheel)],
                 env=_ENV, timeout=300)
  assert install.returncode == 0, install.stderr[-2000:]
  # The dependencies: this environment's site-packages as a plain path
  # (its .pth files, among them this checkout's editable install, are not
  # read from there).
  (site / "dependencies.pth").write_text(
      sysconfig.get_paths()["purelib"] + "\n")
  return venv, site


def _sdist_names(sdist):
  """The sdist's files, relative to its top folder."""
  with tarfile.open(sdist) as archive:
    return {name.split("/", 1)[1] for name in archive.getnames()
            if "/" in name}


def _named_by_the_documentation():
  """Files of this checkout the README and docs/*.md link to (relative
  links) or name in a code span (`examples/dlrm.py`), relative to it;
  files of the environments (`.venv/bin/python`) are not the checkout's."""
  named = set()
  for page in readme_checks.documents():
    text = page.read_text()
    for target in readme_checks.LINK.findall(text):
      file_part = target.split("#")[0]
      if file_part and "://" not in file_part:
        named.add(os.path.relpath(page.parent / file_part, REPO))
    for target in NAMED_PATH.findall(text):
      if target.split("/")[0] in SDIST_FOLDERS + PACKAGES:
        named.add(os.path.normpath(target))
    named.update(re.findall(r"<!-- setup: (\S+) -->", text))
  return {name for name in named if (REPO / name).is_file()}


def test_the_version_has_its_changelog_entry():
  """The newest CHANGELOG entry is this version: dated for a release
  (`## 0.2.0 — 2026-11-29`), `(unreleased)` for a .dev version of it."""
  version = estimator_spec.__version__
  release, dev = re.fullmatch(r"(\d+\.\d+\.\d+)(\.dev\d+)?",
                              version).groups()
  headings = re.findall(r"^## (.+)$", (REPO / "CHANGELOG.md").read_text(),
                        re.M)
  newest = headings[0]
  if dev:
    assert newest == f"{release} (unreleased)", (version, newest)
  else:
    assert re.fullmatch(rf"{re.escape(version)} — \d{{4}}-\d\d-\d\d",
                        newest), (version, newest)
  assert not [h for h in headings[1:] if "unreleased" in h], headings


@pytest.mark.slow
def test_sdist_and_wheel_carry_version_licence_and_kernel_source(dist):
  wheel, sdist = dist
  version = estimator_spec.__version__
  assert wheel.name == f"tpu_embedding_estimator-{version}-py3-none-any.whl"
  assert sdist.name == f"tpu_embedding_estimator-{version}.tar.gz"
  check = _run([sys.executable, "-m", "twine", "check", "--strict",
                str(wheel), str(sdist)], env=_ENV, timeout=300)
  assert check.returncode == 0, check.stdout + check.stderr
  with zipfile.ZipFile(wheel) as archive:
    names = archive.namelist()
    metadata = archive.read(
        f"tpu_embedding_estimator-{version}.dist-info/METADATA").decode()
    entry_points = archive.read(
        f"tpu_embedding_estimator-{version}.dist-info/entry_points.txt"
    ).decode()
  # Every C++ file of the kernels, from which they are built on first use.
  kernels = REPO / "estimator_spec" / "engine" / "kernels"
  sources = {path.relative_to(REPO).as_posix() for path in kernels.iterdir()
             if path.suffix in (".cc", ".h")}
  assert "estimator_spec/engine/kernels/library.cc" in sources
  assert sources <= set(names), sorted(sources - set(names))
  info = f"tpu_embedding_estimator-{version}.dist-info/licenses/"
  assert info + "LICENSE" in names and info + "NOTICE" in names
  # Only the two packages (and the distribution's metadata).
  assert {n.split("/")[0] for n in names} == {
      "estimator_spec", "tpu_embedding_columns",
      f"tpu_embedding_estimator-{version}.dist-info"}
  assert f"{COMMAND} = estimator_spec.__main__:main" in (
      entry_points.splitlines())
  assert "License-Expression: Apache-2.0" in metadata
  assert "Requires-Python: <3.14,>=3.11" in metadata
  # The stack by Python version: TF 2.15 on 3.11, TF 2.21 and tf_keras on
  # 3.12 and 3.13, and nothing without a marker.
  requires = sorted(line for line in metadata.splitlines()
                    if line.startswith("Requires-Dist: ")
                    and "extra ==" not in line)
  assert requires == sorted(
      [f'Requires-Dist: {r}; python_version < "3.12"' for r in (
          "tensorflow-cpu==2.15.*", "tensorflow-estimator==2.15.*",
          "protobuf<5,>=3.20.3", "numpy<2", "google-crc32c<2,>=1.5")] +
      [f'Requires-Dist: {r}; python_version >= "3.12"' for r in (
          "tensorflow==2.21.*", "tf_keras==2.21.*", "tensorboard==2.21.*",
          "protobuf<8,>=6.31.1", "numpy<3,>=2", "google-crc32c<2,>=1.5")]
  ), requires
  for minor in ("3.11", "3.12", "3.13"):
    assert f"Classifier: Programming Language :: Python :: {minor}\n" in (
        metadata)
  assert "Classifier: Programming Language :: Python :: 3.14" not in metadata


@pytest.mark.slow
def test_the_sdist_holds_what_the_docs_name_and_make_runs(dist):
  _, sdist = dist
  names = _sdist_names(sdist)
  named = _named_by_the_documentation()
  # The documentation names files of every part of the checkout.
  assert {"LICENSE", "NOTICE", "CHANGELOG.md", "docs/migration.md",
          "examples/dlrm.py"} <= named, sorted(named)
  assert not named - names, sorted(named - names)
  # What `make demo` and `make test` read, and CI's entry point.
  assert {"Makefile", "tools/ensure_venv.sh", "pytest.ini", "pyproject.toml",
          "README.md", "tests/tf2_tests.txt", "tests/conftest.py",
          "examples/train_ctr.py", ".ci/run"} <= names
  # Each folder whole (the tests' data included), without compiled files.
  for folder in SDIST_FOLDERS:
    here = {str(path.relative_to(REPO)) for path in (REPO / folder).rglob("*")
            if path.is_file() and "__pycache__" not in path.parts}
    assert here and not here - names, (folder, sorted(here - names))
  assert [n for n in names if n.startswith("tests/data/")]
  assert not [n for n in names if n.endswith(".pyc") or n.split("/")[0] in (
      ".venv", ".venv-tf2", "build", "dist", "runs")]


@pytest.mark.slow
def test_the_unpacked_sdist_builds_the_same_wheel_and_has_makes_targets(
    dist, unpacked_sdist, tmp_path):
  wheel, _ = dist
  built = _run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                "--wheel-dir", str(tmp_path), str(unpacked_sdist)],
               env=_ENV, timeout=600)
  assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
  again = list(tmp_path.glob("*.whl"))
  assert [w.name for w in again] == [wheel.name]
  assert _wheel_names(again[0]) == _wheel_names(wheel)
  if shutil.which("make") is None:
    return  # what make would run is checked where make is installed
  for target, runs in (("demo", ".venv/bin/python -m examples.train_ctr"),
                       ("test", ".venv/bin/python -m pytest")):
    dry = _run(["make", "--no-print-directory", "-n", target],
               cwd=unpacked_sdist, env=_ENV, timeout=120)
    assert dry.returncode == 0, dry.stderr
    assert "sh tools/ensure_venv.sh 'PYTHON=' 3.11 '.venv'" in dry.stdout
    assert runs in dry.stdout, dry.stdout


@pytest.mark.slow
def test_the_installed_wheel_runs_the_readme_program(installed, tmp_path):
  venv, site = installed
  work = tmp_path / "work"
  work.mkdir()
  cache = tmp_path / "kernel-cache"
  program = (
      "import estimator_spec, tpu_embedding_columns\n"
      "print('FROM', estimator_spec.__file__, tpu_embedding_columns.__file__)"
      "\nprint('VERSION', estimator_spec.__version__)\n"
      "import sys, tensorflow as tf\n"
      "print('PYTHON', *sys.version_info[:2], 'KERAS', tf.keras.__name__)\n"
      + _readme_program())
  env = dict(_ENV, HOST_EMBEDDING_KERNEL_CACHE=str(cache),
             HOST_EMBEDDING_KERNELS="1")
  run = _run([str(venv / "bin" / "python"), "-c", program], cwd=work,
             env=env, timeout=900)
  assert run.returncode == 0, run.stderr[-4000:]
  lines = run.stdout.splitlines()
  origin = next(line for line in lines if line.startswith("FROM ")).split()
  assert all(path.startswith(str(site)) for path in origin[1:]), origin
  assert f"VERSION {estimator_spec.__version__}" in lines
  # The running Python, with Keras 2 as tf.keras: TF 2.15's own keras, or
  # tf_keras on TF 2.21 (Keras 3 would be keras._tf_keras.keras).
  keras = "tf_keras.api._v2.keras" if ON_TF221_STACK else "keras.api._v2.keras"
  assert (f"PYTHON {sys.version_info[0]} {sys.version_info[1]} "
          f"KERAS {keras}") in lines, [l for l in lines if "PYTHON" in l]
  assert any("'logits': array(" in line for line in lines), lines[-5:]
  # The kernels were built from the installed package's source, into the
  # empty cache (HOST_EMBEDDING_KERNELS=1 makes a failed build an error).
  assert list(cache.rglob("*.so")), sorted(cache.rglob("*"))
  assert not list(work.iterdir())  # the program wrote nothing in the cwd


@pytest.mark.slow
def test_the_installed_console_command_answers(installed, tmp_path):
  venv, _ = installed
  command = venv / "bin" / COMMAND
  # The script starts the fresh environment's Python, not this one's.
  assert f"{venv}/bin/python" in command.read_text().splitlines()[0]
  version = _run([str(command), "--version"], cwd=tmp_path, env=_ENV,
                 timeout=300)
  assert version.returncode == 0, version.stderr[-2000:]
  assert version.stdout.strip() == (
      f"tpu-embedding-estimator {estimator_spec.__version__}")
  helped = _run([str(command), "--help"], cwd=tmp_path, env=_ENV,
                timeout=300)
  assert helped.returncode == 0, helped.stderr[-2000:]
  assert helped.stdout.startswith(f"usage: {COMMAND} "), helped.stdout
  for name in ("describe", "convert", "export-mid-level", "rows", "profile",
               "migrate"):
    assert name in helped.stdout, helped.stdout
  # A usage error is exit 2 through the command too, as with python -m,
  # its line naming the command as it was called.
  wrong = _run([str(command), "no-such-command"], cwd=tmp_path, env=_ENV,
               timeout=300)
  assert wrong.returncode == 2, wrong.stderr[-2000:]
  assert wrong.stderr.startswith(f"{COMMAND}: error: "), wrong.stderr
