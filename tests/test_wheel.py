"""The built artifacts as users get them.

`python -m build` makes the sdist and, from it, the wheel (as `make dist`);
twine checks their metadata as PyPI would; the wheel is installed into a
fresh virtual environment with no source tree on the path (its
dependencies come from this environment's site-packages, read as a plain
path so that this checkout's editable install is not), and the README's
program runs there from an empty directory: it trains with the compiled
kernels built from the installed package's own source into an empty cache.
The fresh environment has the running Python, so the test holds on both
stacks: in .venv (Python 3.11, TensorFlow 2.15) and in .venv-tf2 (Python
3.12, TensorFlow 2.21), where the program runs with TF_USE_LEGACY_KERAS=1
(tf.keras is tf_keras, Keras 2), as TPUEstimator programs do there.
"""
import os
import pathlib
import re
import subprocess
import sys
import sysconfig
import zipfile

import pytest

import estimator_spec

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


def _readme_program():
  """The README's first ```python block: the import change's program."""
  text = (REPO / "README.md").read_text()
  return re.search(r"```python\n(.*?)```", text, re.S).group(1)


def _run(args, **kwargs):
  return subprocess.run(args, capture_output=True, text=True, check=False,
                        **kwargs)


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
  out = tmp_path_factory.mktemp("dist")
  build = _run([sys.executable, "-m", "build", "--outdir", str(out),
                str(REPO)], env=_ENV, timeout=600)
  assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
  wheels = list(out.glob("*.whl"))
  sdists = list(out.glob("*.tar.gz"))
  assert len(wheels) == 1 and len(sdists) == 1
  return wheels[0], sdists[0]


@pytest.mark.slow
def test_sdist_and_wheel_carry_version_licence_and_kernel_source(dist):
  wheel, sdist = dist
  version = estimator_spec.__version__
  assert wheel.name == f"tpu_embedding_estimator-{version}-py3-none-any.whl"
  check = _run([sys.executable, "-m", "twine", "check", "--strict",
                str(wheel), str(sdist)], env=_ENV, timeout=300)
  assert check.returncode == 0, check.stdout + check.stderr
  with zipfile.ZipFile(wheel) as archive:
    names = archive.namelist()
    metadata = archive.read(
        f"tpu_embedding_estimator-{version}.dist-info/METADATA").decode()
  assert "estimator_spec/engine/kernels/row_updates.cc" in names
  info = f"tpu_embedding_estimator-{version}.dist-info/licenses/"
  assert info + "LICENSE" in names and info + "NOTICE" in names
  assert not [n for n in names if n.split("/")[0] in ("tests", "bench",
                                                       "examples")]
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
          "protobuf<5,>=3.20.3", "numpy<2")] +
      [f'Requires-Dist: {r}; python_version >= "3.12"' for r in (
          "tensorflow==2.21.*", "tf_keras==2.21.*", "tensorboard==2.21.*",
          "protobuf<8,>=6.31.1", "numpy<3,>=2")]), requires
  for minor in ("3.11", "3.12", "3.13"):
    assert f"Classifier: Programming Language :: Python :: {minor}\n" in (
        metadata)
  assert "Classifier: Programming Language :: Python :: 3.14" not in metadata


@pytest.mark.slow
def test_the_installed_wheel_runs_the_readme_program(dist, tmp_path):
  wheel, _ = dist
  venv = tmp_path / "venv"
  made = _run([sys.executable, "-m", "venv", "--without-pip", str(venv)],
              timeout=120)
  assert made.returncode == 0, made.stderr
  python = venv / "bin" / "python"
  site = pathlib.Path(_run(
      [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()"
       "['purelib'])"], timeout=60).stdout.strip())
  install = _run([sys.executable, "-m", "pip", "install", "--no-deps",
                  "--no-index", "--target", str(site), str(wheel)],
                 env=_ENV, timeout=300)
  assert install.returncode == 0, install.stderr[-2000:]
  # The dependencies: this environment's site-packages as a plain path
  # (its .pth files, among them this checkout's editable install, are not
  # read from there).
  (site / "dependencies.pth").write_text(
      sysconfig.get_paths()["purelib"] + "\n")
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
  run = _run([str(python), "-c", program], cwd=work, env=env, timeout=900)
  assert run.returncode == 0, run.stderr[-4000:]
  lines = run.stdout.splitlines()
  origin = next(line for line in lines if line.startswith("FROM ")).split()
  assert all(path.startswith(str(site)) for path in origin[1:]), origin
  assert f"VERSION {estimator_spec.__version__}" in lines
  # The running Python, with Keras 2 as tf.keras: TF 2.15's own keras, or
  # tf_keras on TF 2.21 (Keras 3 would be keras._tf_keras.keras).
  keras = "tf_keras.api._v2.keras" if ON_TF221_STACK else "keras.api._v2.keras"
  assert (f"PYTHON {sys.version_info[0]} {sys.version_info[1]} "
          f"KERAS {keras}") in lines, [line for line in lines if "PYTHON" in line]
  assert any("'logits': array(" in line for line in lines), lines[-5:]
  # The kernels were built from the installed package's source, into the
  # empty cache (HOST_EMBEDDING_KERNELS=1 makes a failed build an error).
  assert list(cache.rglob("*.so")), sorted(cache.rglob("*"))
  assert not list(work.iterdir())  # the program wrote nothing in the cwd
