#!/bin/sh
# Makes one of the virtual environments `make` uses ready, or says in one
# message why it cannot. Run by the Makefile on every make, so the check is
# cheap: two short Python starts when the environment is usable, nothing
# installed, nothing printed.
#
#   tools/ensure_venv.sh [NAME=]PYTHON VERSION VENV WHAT PACKAGES
#
# VERSION: the Python VENV holds, major.minor ("3.11" for .venv, "3.12" for
# .venv-tf2).
# PYTHON builds VENV when it has to be built; it must be Python VERSION.
# NAME is the make variable that gives it (PYTHON, PYTHON_TF2; default
# PYTHON), named in the messages. When PYTHON is empty (the variable was not
# given), a build uses the first of these that runs and is Python VERSION:
#   * python$VERSION on the PATH (a pyenv shim runs only when pyenv has
#     that version selected, so it may be there and fail);
#   * pyenv's own, the newest $(pyenv root)/versions/$VERSION*/bin/python$VERSION,
#     when pyenv is on the PATH ($PYENV_ROOT when only that is set);
#   * python3 on the PATH.
# WHAT says what is installed into VENV:
#   * EXTRAS ("test,demo" for .venv, "test" for .venv-tf2): this checkout
#     with pyproject.toml's dependencies and those extras,
#     `pip install -e REPO[EXTRAS]`; pyproject.toml's markers choose the
#     stack by the Python version (TensorFlow 2.15 on 3.11, 2.21 with
#     tf_keras on 3.12);
#   * requirements=FILE (a path inside this checkout): the packages FILE
#     lists, then this checkout without pyproject.toml's dependencies,
#     `pip install -r FILE` and `pip install --no-deps -e REPO`
#     (.venv-peers, TorchRec's environment).
# PACKAGES: the third-party modules VENV must hold, space-separated
# ("tensorflow tensorflow_estimator" for .venv, "tensorflow tf_keras" for
# .venv-tf2).
# VENV is usable when its bin/python runs, is Python VERSION, the install
# stamp VENV/.installed matches this checkout (Python version, WHAT,
# checksums of pyproject.toml and of FILE), and PACKAGES, estimator_spec and
# tpu_embedding_columns are found (the last two in this checkout).
# Otherwise:
#   * bin/python missing, not running or another Python, or packages
#     missing: VENV is emptied and built again with PYTHON;
#   * no stamp, or a stamp of another pyproject.toml: the package is installed
#     again into VENV.
#
# Environment: VENV_CHECK_ONLY=1 prints the verdict and exits (0 usable,
# 1 not) without building anything; VENV_DRY_RUN=1 prints the commands a
# build would run instead of running them. Exit status 2: no Python VERSION
# to build with; 1: anything else that failed.
set -u

if [ $# -ne 5 ]; then
  echo "usage: tools/ensure_venv.sh [NAME=]PYTHON VERSION VENV WHAT PACKAGES" >&2
  exit 1
fi
# NAME=PYTHON, or a bare PYTHON (named PYTHON).
case $1 in
  *=*)
    name=${1%%=*}
    python=${1#*=}
    ;;
  *)
    name=PYTHON
    python=$1
    ;;
esac
case $name in
  '' | [0-9]* | *[!A-Za-z0-9_]*)
    # Not a variable name: a path with an "=" in it.
    name=PYTHON
    python=$1
    ;;
esac
wanted=$2
case $wanted in
  [0-9].[0-9] | [0-9].[0-9][0-9]) ;;
  *)
    echo "tools/ensure_venv.sh: VERSION must be major.minor (3.12), not '$wanted'" >&2
    exit 1
    ;;
esac
venv=$3
what=$4
packages=$5
repo=$(cd "$(dirname "$0")/.." && pwd)
case $what in
  requirements=*)
    requirements=${what#requirements=}
    extras=
    ;;
  *)
    requirements=
    extras=$what
    ;;
esac
venv_python=$venv/bin/python
stamp=$venv/.installed

# The Python version of an interpreter ("3.11.7"); fails when it does not run.
version_of() {
  env -u PYTHONPATH -u PYTHONHOME "$1" -c \
    'import sys; print(".".join(str(n) for n in sys.version_info[:3]))' \
    2>/dev/null
}

# The packages the venv lacks, space-separated, found without importing them
# (the current directory is not searched). A checkout's own packages count
# only when they come from this checkout.
missing_packages() {
  env -u PYTHONPATH -u PYTHONHOME "$venv_python" - "$repo" $packages <<'PY' 2>/dev/null
import importlib.util, os, sys
repo = os.path.realpath(sys.argv[1])
if sys.path and sys.path[0] == "":  # the current directory, for stdin
  del sys.path[0]
missing = []
for name in sys.argv[2:] + ["estimator_spec", "tpu_embedding_columns"]:
  spec = importlib.util.find_spec(name)
  if spec is None:
    missing.append(name)
  elif name in ("estimator_spec", "tpu_embedding_columns"):
    origin = os.path.realpath(spec.origin or "")
    if not origin.startswith(repo + os.sep):
      missing.append(name + " (from " + os.path.dirname(origin) + ")")
print(" ".join(missing))
PY
}

checksum() {
  cksum < "$1" | cut -d' ' -f1
}

stamp_line() {
  if [ -n "$requirements" ]; then
    echo "python=$1 requirements=$requirements:$(checksum "$repo/$requirements" 2>/dev/null) pyproject.toml=$(checksum "$repo/pyproject.toml")"
  else
    echo "python=$1 extras=$extras pyproject.toml=$(checksum "$repo/pyproject.toml")"
  fi
}

# Installs this checkout (and, with a requirements file, what it lists).
install_checkout() {
  if [ -n "$requirements" ]; then
    run "$venv_python" -m pip install --quiet -r "$repo/$requirements"
    run "$venv_python" -m pip install --quiet --no-deps -e "$repo"
  else
    run "$venv_python" -m pip install --quiet -e "$repo[$extras]"
  fi
}

run() {
  if [ -n "${VENV_DRY_RUN:-}" ]; then
    echo "+ $*"
  else
    "$@" || exit 1
  fi
}

# Looks for a Python $wanted to build with (PYTHON was not given): sets
# found and found_version, or leaves found empty and says in tried what each
# place held.
find_python() {
  found=
  found_version=
  tried=
  if candidate=$(command -v "python$wanted" 2>/dev/null); then
    if ! version=$(version_of "$candidate") || [ -z "$version" ]; then
      tried="python$wanted on the PATH ($candidate) does not run"
    elif [ "${version%.*}" != "$wanted" ]; then
      tried="python$wanted on the PATH ($candidate) is Python $version"
    else
      found=$candidate
      found_version=$version
      return 0
    fi
  else
    tried="no python$wanted on the PATH"
  fi
  root=
  if command -v pyenv >/dev/null 2>&1; then
    root=$(pyenv root 2>/dev/null)
  elif [ -n "${PYENV_ROOT:-}" ]; then
    root=$PYENV_ROOT
  fi
  if [ -z "$root" ]; then
    tried="$tried; no pyenv"
  else
    # The newest: the highest micro version of those that run.
    for candidate in "$root"/versions/"$wanted"*/bin/python"$wanted"; do
      [ -x "$candidate" ] || continue
      version=$(version_of "$candidate") || continue
      [ "${version%.*}" = "$wanted" ] || continue
      if [ -z "$found" ] || [ "${version##*.}" -gt "${found_version##*.}" ]; then
        found=$candidate
        found_version=$version
      fi
    done
    [ -n "$found" ] && return 0
    tried="$tried; pyenv has no $wanted ($root/versions/$wanted*/bin/python$wanted)"
  fi
  if candidate=$(command -v python3 2>/dev/null); then
    if ! version=$(version_of "$candidate") || [ -z "$version" ]; then
      tried="$tried; python3 ($candidate) does not run"
    elif [ "${version%.*}" != "$wanted" ]; then
      tried="$tried; python3 ($candidate) is Python $version"
    else
      found=$candidate
      found_version=$version
      return 0
    fi
  fi
  return 1
}

if [ -n "$requirements" ] && [ ! -f "$repo/$requirements" ]; then
  echo "make: cannot make $venv ready: $repo/$requirements does not exist" >&2
  exit 1
fi

# --- Is VENV usable? ---------------------------------------------------------
action=none      # none | install (into the venv as it is) | rebuild
reason=
if [ ! -e "$venv" ]; then
  action=rebuild
  reason="$venv does not exist"
elif [ ! -x "$venv_python" ]; then
  action=rebuild
  reason="$venv_python is missing"
elif ! venv_version=$(version_of "$venv_python") || [ -z "$venv_version" ]; then
  action=rebuild
  reason="$venv_python does not run"
elif [ "${venv_version%.*}" != "$wanted" ]; then
  action=rebuild
  reason="$venv holds Python $venv_version, not $wanted"
elif [ ! -f "$stamp" ]; then
  action=install
  reason="its install never finished (no $stamp)"
elif [ "$(cat "$stamp")" != "$(stamp_line "$venv_version")" ]; then
  action=install
  if [ -n "$requirements" ]; then
    reason="pyproject.toml or $requirements changed since it was installed"
  else
    reason="pyproject.toml or the extras changed since it was installed"
  fi
else
  missing=$(missing_packages)
  if [ $? -ne 0 ]; then
    action=rebuild
    reason="$venv_python cannot look up its packages"
  elif [ -n "$missing" ]; then
    action=rebuild
    reason="packages missing: $missing"
  fi
fi

if [ -n "${VENV_CHECK_ONLY:-}" ]; then
  if [ "$action" = none ]; then
    echo "$venv: usable (Python $venv_version)"
    exit 0
  fi
  echo "$venv: $action needed: $reason"
  exit 1
fi
[ "$action" = none ] && exit 0

# --- Install into the venv as it is (its Python is fine) --------------------
if [ "$action" = install ]; then
  echo "make: installing this checkout into $venv ($reason)"
  run rm -f "$stamp"
  install_checkout
  [ -n "${VENV_DRY_RUN:-}" ] || stamp_line "$venv_version" > "$stamp"
  exit 0
fi

# --- Rebuild: needs a Python $wanted ----------------------------------------
hint="Install Python $wanted, or point make at one: make $name=/path/to/python$wanted test."
if [ -n "$requirements" ]; then
  why="Python $wanted is needed: the packages of $requirements are installed into $venv for Python $wanted."
else
  why="Python $wanted is needed: $venv holds what pyproject.toml installs on Python $wanted (with the extras $extras)."
fi
if [ "$reason" = "$venv does not exist" ]; then
  context="to create $venv"
else
  context="to rebuild $venv ($reason)"
fi
if [ -z "$python" ]; then
  if ! find_python; then
    echo "make: found no Python $wanted $context: $name not given; $tried. $why $hint" >&2
    exit 2
  fi
  python=$found
  python_version=$found_version
else
  if ! command -v "$python" >/dev/null 2>&1; then
    echo "make: cannot use $name=$python $context: it was not found. $why $hint" >&2
    exit 2
  fi
  if ! python_version=$(version_of "$python") || [ -z "$python_version" ]; then
    echo "make: cannot use $name=$python $context: it does not run. $why $hint" >&2
    exit 2
  fi
  if [ "${python_version%.*}" != "$wanted" ]; then
    echo "make: cannot use $name=$python $context: it is Python $python_version. $why $hint" >&2
    exit 2
  fi
fi

if [ "$reason" = "$venv does not exist" ]; then
  echo "make: creating $venv with $python (Python $python_version)"
else
  echo "make: rebuilding $venv with $python (Python $python_version): $reason"
fi
run "$python" -m venv --clear "$venv"
run "$venv_python" -m pip install --quiet --upgrade pip
install_checkout
[ -n "${VENV_DRY_RUN:-}" ] || stamp_line "$python_version" > "$stamp"
exit 0
