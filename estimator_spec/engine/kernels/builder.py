"""The build of the engine's compiled kernels, its cache and its loading.

The kernels' C++ files (this folder's .cc and .h files) are compiled with
the C++ compiler against the TensorFlow of the running process (its
headers and framework library, which the TensorFlow wheel ships) into one
shared library, once per source, TensorFlow version and compiler: the
library is cached in `$HOST_EMBEDDING_KERNEL_CACHE`, else
`$XDG_CACHE_HOME/tpu-embedding-estimator/kernels`, else
`~/.cache/tpu-embedding-estimator/kernels`. A build takes a few seconds;
processes building at once each write their own file and rename it into
place.

A cached library is loaded only if it is the one this library built
(docs/security.md): the cache directory must be owned by the user and
writable by nobody else (else the library is built in a private temporary
directory for this process, with a warning), and the library must be a
regular file whose SHA-256 equals the digest recorded beside it
(`<library>.sha256`) when it was built. A library that is missing its
digest, does not match it, or fails to load is rebuilt, with a warning.
The compiler is `$CXX`, else `c++`.
"""
import contextlib
import fcntl
import glob
import hashlib
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import warnings

import tensorflow as tf

from estimator_spec import files

CACHE_ENV = "HOST_EMBEDDING_KERNEL_CACHE"
FOLDER = os.path.dirname(os.path.abspath(__file__))
# The one file compiled: it includes the folder's other C++ files
# (library.cc says why).
SOURCE = os.path.join(FOLDER, "library.cc")
# No contraction into fused multiply-adds and no errno from sqrt (which
# would keep the loops scalar): every float operation stays the one IEEE
# operation the graph-op path computes.
FLAGS = ("-shared", "-fPIC", "-O3", "-fno-math-errno", "-ffp-contract=off",
         "-w")


class KernelBuildError(RuntimeError):
  """The engine's kernels could not be built or loaded."""


def cache_dir():
  """Where built libraries are kept."""
  if os.environ.get(CACHE_ENV):
    return os.environ[CACHE_ENV]
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(
      os.path.expanduser("~"), ".cache")
  return os.path.join(base, "tpu-embedding-estimator", "kernels")


def _compiler():
  compiler = os.environ.get("CXX") or "c++"
  path = shutil.which(compiler)
  if path is None:
    raise KernelBuildError(
        f"no C++ compiler: {compiler!r} is not on PATH (set $CXX)")
  return path


# The largest library read to check its digest.
MAX_LIBRARY_BYTES = 512 * 2**20
DIGEST_SUFFIX = ".sha256"


def load():
  """The loaded op module: the cached library if it checks out, else a
  fresh build; a cached one that fails to load is rebuilt once."""
  path, fresh = _build()
  try:
    return tf.load_op_library(path)
  except (OSError, tf.errors.OpError) as error:
    if fresh:
      raise
    warnings.warn(
        f"The cached kernel library {path} does not load "
        f"({getattr(error, 'message', None) or error}); it is rebuilt.",
        RuntimeWarning, stacklevel=3)
    path, _ = _build(rebuild=True)
    return tf.load_op_library(path)


def _private_cache(directory):
  """Why `directory` is no cache this user can trust (None if it is): it
  must be a directory owned by the user, writable by no one else."""
  info = os.stat(directory)
  if not stat.S_ISDIR(info.st_mode):
    return "it is not a directory"
  if hasattr(os, "getuid") and info.st_uid != os.getuid():
    return f"it is owned by uid {info.st_uid}, not by this user"
  if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
    return (f"others can write it (mode {stat.S_IMODE(info.st_mode):o}); "
            "chmod go-w it")
  return None


def _digest(path):
  return hashlib.sha256(files.read_bytes(path, MAX_LIBRARY_BYTES)).hexdigest()


def _verified(target):
  """Why the cached library `target` is not the one this library built
  (None if it is; FileNotFoundError if there is none)."""
  if not os.path.lexists(target):
    raise FileNotFoundError(target)
  try:
    recorded = files.read_bytes(target + DIGEST_SUFFIX, 1024).decode(
        "ascii", "replace").strip()
  except FileNotFoundError:
    return "no digest was recorded beside it"
  except (OSError, ValueError) as error:
    return f"its digest file is refused ({error})"
  try:
    actual = _digest(target)
  except (OSError, ValueError) as error:
    return f"it is refused ({error})"
  if actual != recorded:
    return "its SHA-256 differs from the digest recorded when it was built"
  return None


@contextlib.contextmanager
def _publishing(directory):
  """The cache's lock, held while a library and its digest are put in
  place or checked (a `.lock` file, never followed through a link)."""
  handle = files.open_lock(os.path.join(directory, ".lock"))
  try:
    fcntl.flock(handle, fcntl.LOCK_EX)
    yield
  finally:
    os.close(handle)


def build():
  """The path of the shared library for this process's TensorFlow, built
  now if the cache does not hold it (or holds one that is not the one this
  library built: see the module docstring)."""
  return _build()[0]


def _build(rebuild=False):
  """(path of the library, whether it was built now)."""
  compiler = _compiler()
  compile_flags = list(tf.sysconfig.get_compile_flags())
  link_flags = list(tf.sysconfig.get_link_flags())
  key = _library_key(compiler, compile_flags, link_flags)
  directory = _trusted_cache()
  target = os.path.join(directory, f"row_updates-{key}.so")
  if not rebuild and _cached(directory, target):
    return target, False
  command = [compiler] + list(FLAGS) + compile_flags + [SOURCE, "-o"]
  _compile(command, link_flags, directory, target)
  return target, True


def _library_key(compiler, compile_flags, link_flags):
  """The digest naming the library of these sources, TensorFlow, compiler
  and flags."""
  try:
    version = subprocess.run([compiler, "--version"], capture_output=True,
                             text=True, timeout=60, check=True).stdout
  except (OSError, subprocess.SubprocessError) as error:
    raise KernelBuildError(f"{compiler} --version failed: {error}") from error
  sources = []
  for path in _source_files():
    with open(path, "rb") as f:
      sources += [os.path.basename(path).encode(), f.read()]
  return hashlib.sha256(b"\0".join(sources + [
      tf.__version__.encode(), version.encode(),
      " ".join(FLAGS + tuple(compile_flags) + tuple(link_flags)).encode(),
      sys.platform.encode()
  ])).hexdigest()[:20]


def _source_files():
  """Every C++ file of the kernels folder, in name order: the library's key
  covers them all, so that a change to any of them builds another one."""
  return sorted(glob.glob(os.path.join(FOLDER, "*.cc")) +
                glob.glob(os.path.join(FOLDER, "*.h")))


def _trusted_cache():
  """The cache directory, made if missing; a private temporary directory
  for this process (with a warning) when the cache is not one to trust."""
  directory = cache_dir()
  try:
    os.makedirs(directory, mode=0o700, exist_ok=True)
    distrust = _private_cache(directory)
  except OSError as error:
    raise KernelBuildError(
        f"cannot write to the kernel cache {directory} ({error}); set "
        f"${CACHE_ENV} to a writable directory") from error
  if distrust is not None:
    private = tempfile.mkdtemp(prefix="tpu-embedding-kernels-")
    warnings.warn(
        f"The kernel cache {directory} is not used: {distrust}. The kernels "
        f"are built for this process in {private}; set ${CACHE_ENV} to a "
        "directory only you can write.", RuntimeWarning, stacklevel=4)
    directory = private
  return directory


def _cached(directory, target):
  """Whether `target` is a cached library this library built (a warning
  when one is there that is not)."""
  try:
    with _publishing(directory):
      problem = _verified(target)
    if problem is None:
      return True
    warnings.warn(
        f"The cached kernel library {target} is not loaded: {problem}. "
        "It is rebuilt.", RuntimeWarning, stacklevel=4)
  except FileNotFoundError:
    pass
  except (OSError, ValueError) as error:
    raise KernelBuildError(
        f"cannot use the kernel cache {directory} ({error}); set "
        f"${CACHE_ENV} to a directory only you can write") from error
  return False


def _compile(command, link_flags, directory, target):
  """Runs `command` + [a scratch file] + `link_flags`, then puts the
  library at `target` with its digest beside it."""
  try:
    handle, scratch = tempfile.mkstemp(prefix=".row_updates-", suffix=".so",
                                       dir=directory)
    os.close(handle)
  except OSError as error:
    raise KernelBuildError(
        f"cannot write to the kernel cache {directory} ({error}); set "
        f"${CACHE_ENV} to a writable directory") from error
  try:
    result = subprocess.run(command + [scratch] + link_flags,
                            capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
      lines = [line for line in result.stderr.splitlines() if line.strip()]
      raise KernelBuildError(
          f"{os.path.basename(command[0])} failed on {SOURCE}: " +
          " | ".join(lines[-5:]))
    digest = _digest(scratch)
    with _publishing(directory):
      files.write_atomic(target + DIGEST_SUFFIX, digest + "\n")
      os.replace(scratch, target)
  except subprocess.TimeoutExpired as error:
    raise KernelBuildError(f"building {SOURCE} timed out") from error
  except (OSError, ValueError) as error:
    raise KernelBuildError(
        f"cannot write to the kernel cache {directory} ({error}); set "
        f"${CACHE_ENV} to a writable directory") from error
  finally:
    if os.path.exists(scratch):
      os.remove(scratch)
