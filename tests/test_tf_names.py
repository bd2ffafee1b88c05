"""Every public name of TF 2.15's TPU embedding and TPUEstimator namespaces
has its place in `estimator_spec.tf_names`, and each place holds what the
table says: our own object taking TF's arguments, TF's object re-exported,
or a documented reason (TF's own kept, or refused with what to do).

Also: docs/migration.md's table is the one the table generates, and the
README's import change says what the table says.
"""
import importlib
import inspect
import os
import re

import pytest
import tensorflow as tf

from estimator_spec import tf_names

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tf_object(dotted):
  obj = tf.compat.v1
  for part in dotted.split("."):
    obj = getattr(obj, part)
  return obj


def _our_object(dotted):
  module, _, name = dotted.rpartition(".")
  return getattr(importlib.import_module(module), name)


def _public_names():
  """(module, name) of every public name of the covered TF modules."""
  names = []
  for module in tf_names.COVERED_MODULES:
    for name in dir(_tf_object(module)):
      if not name.startswith("_"):
        names.append((module, name))
  return names


def _parameters(obj):
  target = obj.__init__ if inspect.isclass(obj) else obj
  try:
    signature = inspect.signature(target)
  except (TypeError, ValueError):
    return None
  return signature.parameters


def test_every_public_tf_name_is_mirrored_or_listed_with_a_reason():
  unlisted = []
  counts = {kind: 0 for kind in tf_names.KINDS}
  for module, name in _public_names():
    dotted = f"{module}.{name}"
    if dotted in tf_names.COVERED_MODULES:
      continue  # a submodule: its names are walked themselves
    row = tf_names.lookup("tensorflow.compat.v1." + dotted)
    if row is None:
      unlisted.append(dotted)
      continue
    counts[row.kind] += 1
  assert not unlisted, (
      f"TF names with no row in estimator_spec/tf_names.py: {unlisted}")
  # 31 names: 11 ours, 3 re-exported, 9 kept as TF's own, 8 refused.
  assert counts == {tf_names.OURS: 11, tf_names.REEXPORT: 3, tf_names.TF: 9,
                    tf_names.REFUSED: 8}


def test_no_row_names_something_tf_lacks():
  covered = {f"{m}.{n}" for m, n in _public_names()}
  stale = [row.tf for row in tf_names.NAMES if row.tf not in covered]
  assert not stale
  for row in tf_names.LEGACY:  # TF 1.x's columns, still in TF 2.15
    module, _, name = row.tf.rpartition(".")
    assert hasattr(importlib.import_module(module), name), row.tf
  for alias, target in tf_names.ALIASES.items():
    if alias.startswith("tensorflow.contrib."):
      continue  # TF 1.x only
    if alias.endswith("."):
      importlib.import_module(alias[:-1])
    else:
      module, _, name = alias.rpartition(".")
      assert hasattr(importlib.import_module(module), name), alias
    assert tf_names.canonical(alias.rstrip(".")) is not None
    assert target.rstrip(".") in covered | set(tf_names.COVERED_MODULES)
  for name in tf_names.CONTRIB_TPU_IN_COMPAT_V1:
    assert hasattr(tf.compat.v1.tpu, name), name


@pytest.mark.parametrize("row", [r for r in tf_names.NAMES + tf_names.LEGACY
                                 if r.kind in (tf_names.OURS,
                                               tf_names.REEXPORT)],
                         ids=lambda r: r.tf)
def test_our_counterpart_takes_what_tfs_takes(row):
  ours = _our_object(row.ours)
  if row.tf.startswith("tensorflow."):
    module, _, name = row.tf.rpartition(".")
    theirs = getattr(importlib.import_module(module), name)
  else:
    theirs = _tf_object(row.tf)
  if row.kind == tf_names.REEXPORT:
    assert ours is theirs
    return
  assert ours is not theirs
  assert ours.__module__.split(".")[0] in ("estimator_spec",
                                           "tpu_embedding_columns")
  their_parameters = _parameters(theirs)
  our_parameters = _parameters(ours)
  assert their_parameters is not None and our_parameters is not None
  takes_any = any(p.kind == p.VAR_KEYWORD for p in our_parameters.values())
  missing = [name for name, p in their_parameters.items()
             if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and
             name not in our_parameters and not takes_any]
  assert not missing, f"{row.ours} lacks TF's arguments {missing}"
  # TF's positional order holds for the arguments both take.
  positional = [n for n, p in their_parameters.items()
                if p.kind == p.POSITIONAL_OR_KEYWORD and n != "self"]
  ours_positional = [n for n, p in our_parameters.items()
                     if p.kind == p.POSITIONAL_OR_KEYWORD and n != "self"]
  assert ours_positional[:len(positional)] == positional or takes_any, (
      row.ours, ours_positional, positional)


def test_rows_not_mirrored_say_why():
  for row in tf_names.NAMES + tf_names.LEGACY:
    assert row.kind in tf_names.KINDS
    if row.kind == tf_names.REFUSED:
      assert row.ours is None and len(row.note) > 40, row
    if row.kind == tf_names.TF:
      assert row.note, row


def test_modules_mapped_whole_have_every_name():
  for module, ours in tf_names.MODULES.items():
    our_module = importlib.import_module(ours)
    for name in dir(_tf_object(module)):
      if name.startswith("_") or f"{module}.{name}" in tf_names.MODULES:
        continue
      row = tf_names.lookup(f"tensorflow.compat.v1.{module}.{name}")
      assert row.kind in (tf_names.OURS, tf_names.REEXPORT), row
      assert getattr(our_module, name) is _our_object(row.ours), name


def test_spellings_resolve_to_the_same_row():
  row = tf_names.lookup("tensorflow.compat.v1.estimator.tpu.RunConfig")
  for spelling in ("tensorflow.estimator.tpu.RunConfig",
                   "tensorflow.contrib.tpu.RunConfig",
                   "tensorflow_estimator.python.estimator.tpu.tpu_config."
                   "RunConfig"):
    assert tf_names.lookup(spelling) is row
  assert tf_names.lookup("tensorflow.compat.v1.estimator.tpu").ours == (
      "estimator_spec")
  assert tf_names.lookup("tensorflow.contrib.tpu.CrossShardOptimizer").ours \
      == "tensorflow.compat.v1.tpu.CrossShardOptimizer"
  assert tf_names.lookup("tensorflow.compat.v1.train.AdamOptimizer") is None
  assert tf_names.lookup("numpy.array") is None


def _section(text, begin, end):
  match = re.search(re.escape(begin) + r"\n(.*?)" + re.escape(end), text,
                    re.S)
  assert match, f"markers {begin!r} ... {end!r} missing"
  return match.group(1)


def test_the_migration_page_holds_the_generated_table():
  with open(os.path.join(REPO, "docs", "migration.md"), encoding="utf-8") as f:
    page = f.read()
  table = _section(page, "<!-- tf_names table: begin -->",
                   "<!-- tf_names table: end -->")
  assert table == tf_names.markdown_table(), (
      "docs/migration.md's table differs from estimator_spec/tf_names.py; "
      "regenerate it with: python -c 'from estimator_spec import tf_names; "
      "print(tf_names.markdown_table(), end=\"\")'")
  # The page leads with `migrate`.
  first_section = page.split("\n## ", 2)[1]
  assert "python -m estimator_spec migrate" in first_section
