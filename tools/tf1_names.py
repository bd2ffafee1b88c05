"""Rewrites the MISSING block of estimator_spec/tf1_names.py: the names of
TF 1.x's `tensorflow` namespace that TF 2 dropped from its own (keeping
them under `tf.compat.v1` or nowhere).

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

# The generated block of the module: from its first line to its last.
BEGIN = "MISSING = {\n"
END = "\n}\n"


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


def source(missing, module_text):
  """`module_text` (estimator_spec/tf1_names.py) with its MISSING block
  holding `missing`; the rest of the module (docstring, functions) is kept
  as written there."""
  lines = []
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
  start = module_text.index(BEGIN) + len(BEGIN)
  end = module_text.index(END, start)
  return module_text[:start] + "".join(lines).rstrip("\n") + module_text[end:]


def main():
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  if not tf.__version__.startswith("2.15."):
    sys.exit(f"tools/tf1_names.py: needs TF 2.15, found {tf.__version__}")
  OUTPUT.write_text(source(missing_names(tf.compat.v1, tf),
                           OUTPUT.read_text()))
  print(f"wrote {OUTPUT}")


if __name__ == "__main__":
  main()
