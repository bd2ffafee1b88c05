"""Writes estimator_spec/tf1_names.py: the names of TF 1.x's `tensorflow`
namespace that TF 2 dropped from its own (keeping them under
`tf.compat.v1` or nowhere).

Run with TF 2.15 (`.venv/bin/python -m tools.tf1_names`): it walks
`tf.compat.v1`, the TF 1.x API as TF 2.15 keeps it, against TF 2.15's `tf`,
and lists each name of the first that the second lacks at that path (a
module the second lacks is listed once, for everything under it).
tests/test_tf1_names.py walks again and compares.
"""
import inspect
import os
import pathlib
import sys

OUTPUT = pathlib.Path(__file__).resolve().parent.parent / (
    "estimator_spec/tf1_names.py")

HEADER = '''"""The names of TF 1.x's `tensorflow` namespace that TF 2 lacks.

`migrate` reads it (docs/migration.md, 'TF 1.x code'): a program that
writes `import tensorflow as tf` and uses one of these (`tf.logging`,
`tf.gfile`, `tf.train.AdamOptimizer`, `tf.Session`, ...) is TF 1.x code;
TF's own `tf_upgrade_v2` rewrites it for TF 2 before `migrate`. Generated
from TF 2.15 by tools/tf1_names.py (every name of `tf.compat.v1` that TF
2.15's `tf` lacks at the same path; a module TF 2 lacks stands for all its
names), checked by tests/test_tf1_names.py. `contrib` is TF 1.x's
`tf.contrib`, which no TF 2 has.
"""

# By module ('' is the root): the names TF 2 lacks there.
MISSING = {
'''

FOOTER = '''}

# What `tf_upgrade_v2` leaves as errors although TF 2 keeps a counterpart:
# the TF 1.x spelling (under `tf.`) and the name under `tf.compat.v1`.
MOVED_TO_COMPAT_V1 = {"flags": "flags", "app.flags": "flags"}


def moved(dotted):
  """(the TF 1.x spelling, its name under tf.compat.v1) when `dotted` (a
  name under TF's `tensorflow` root) is or lies in one of
  MOVED_TO_COMPAT_V1, else None."""
  for old, new in MOVED_TO_COMPAT_V1.items():
    if dotted == old or dotted.startswith(old + "."):
      return old, new
  return None


def tf1_prefix(dotted):
  """The longest leading part of `dotted` (a name under TF's `tensorflow`
  root, e.g. 'train.AdamOptimizer.minimize') that only TF 1.x has, or
  None."""
  parts = dotted.split(".")
  for end in range(1, len(parts) + 1):
    module, name = ".".join(parts[:end - 1]), parts[end - 1]
    if name in MISSING.get(module, ()):
      return ".".join(parts[:end])
  return None
'''


def missing_names(v1, v2):
  """{module: sorted names} of `v1` (tf.compat.v1) that `v2` (tf) lacks."""
  missing = {}

  def walk(first, second, module, seen):
    for name in sorted(dir(first)):
      if name.startswith("_") or (not module and name == "compat"):
        continue
      try:
        value = getattr(first, name)
      except Exception:  # pylint: disable=broad-except
        continue
      if second is None or not hasattr(second, name):
        missing.setdefault(module, []).append(name)
        continue
      other = getattr(second, name)
      if inspect.ismodule(value) and id(value) not in seen:
        walk(value, other if inspect.ismodule(other) else None,
             f"{module}.{name}" if module else name, seen | {id(value)})

  walk(v1, v2, "", frozenset())
  missing.setdefault("", []).append("contrib")
  return {module: sorted(names) for module, names in sorted(missing.items())}


def source(missing):
  lines = [HEADER]
  for module, names in missing.items():
    lines.append(f"    {module!r}: frozenset((\n")
    row = "       "
    for name in names:
      item = f" {name!r},"
      if len(row) + len(item) > 79:
        lines.append(row + "\n")
        row = "       "
      row += item
    lines.append(row + "\n    )),\n")
  lines.append(FOOTER)
  return "".join(lines)


def main():
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  if not tf.__version__.startswith("2.15."):
    sys.exit(f"tools/tf1_names.py: needs TF 2.15, found {tf.__version__}")
  OUTPUT.write_text(source(missing_names(tf.compat.v1, tf)))
  print(f"wrote {OUTPUT}")


if __name__ == "__main__":
  main()
