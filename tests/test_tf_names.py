"""Every public name of TF 2.15's TPU embedding and TPUEstimator namespaces,
and of `tf.estimator` (and `tf.compat.v1.estimator`), has its place in
`estimator_spec.tf_names`, and each place holds what the table says: our own
object taking TF's arguments, the Estimator framework's object (tensorflow-
estimator's here, and this library's own, taking the same arguments, for
current TF), or a documented reason (TF's own kept, or refused with what to
do). The other spellings (module paths, `tensorflow_estimator`, TF 1.x's
`tensorflow.python.estimator`) name the same objects.

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
from estimator_spec.estimator import stack

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tf_object(dotted, root=None):
  """TF's object at a table spelling: under tf.compat.v1 (or under TF2's
  `tf` for the names only it has), or at a full path."""
  if dotted.split(".")[0] in ("tensorflow", "tensorflow_estimator"):
    return _at(dotted)
  if root is None:
    root = tf.compat.v1 if _has(tf.compat.v1, dotted) else tf
  obj = root
  for part in dotted.split("."):
    obj = getattr(obj, part)
  return obj


def _at(path):
  """The object at a full dotted path: the longest module prefix that
  imports, then attributes (`tensorflow_estimator.estimator` is one)."""
  parts = path.split(".")
  for split in range(len(parts), 0, -1):
    try:
      obj = importlib.import_module(".".join(parts[:split]))
    except ImportError:
      continue
    for part in parts[split:]:
      obj = getattr(obj, part)
    return obj
  raise ImportError(path)


def _has(root, dotted):
  for part in dotted.split("."):
    if not hasattr(root, part):
      return False
    root = getattr(root, part)
  return True


def _our_object(dotted):
  module, _, name = dotted.rpartition(".")
  return getattr(importlib.import_module(module), name)


def _public_names():
  """(module, name) of every public name of the covered TF modules, under
  tf.compat.v1 and, for tf.estimator's, under TF2's `tf`."""
  names = set()
  for root, modules in ((tf.compat.v1, tf_names.COVERED_MODULES),
                        (tf, tf_names.TF2_COVERED_MODULES)):
    for module in modules:
      names.update((module, name) for name in dir(_tf_object(module, root))
                   if not name.startswith("_"))
  return sorted(names)


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
    assert tf_names.lookup("tensorflow." + dotted) is row
    counts[row.kind] += 1
  assert not unlisted, (
      f"TF names with no row in estimator_spec/tf_names.py: {unlisted}")
  # 110 names: 31 of the TPU namespaces (11 ours, 3 the framework's, 9 kept
  # as TF's own, 7 that need a TPU, 1 refused) and 79 of tf.estimator's (16
  # the framework's, 18 moved to TF's tf.compat.v1.train, 45 refused).
  assert counts == {tf_names.OURS: 11, tf_names.FRAMEWORK: 19,
                    tf_names.TF: 27, tf_names.REFUSED: 46,
                    tf_names.TPU_ONLY: 7}


# A spelling some programs use that TF 2.15's module lacks (the call fails
# there; migrated, it runs).
_NOT_IN_TF_215 = ("tensorflow_estimator.python.estimator.tpu.tpu_estimator."
                  "_load_global_step_from_checkpoint_dir",)


def test_no_row_names_something_tf_lacks():
  covered = {f"{m}.{n}" for m, n in _public_names()}
  stale = [row.tf for row in tf_names.NAMES if row.tf not in covered]
  assert not stale
  # TF 1.x's columns, tensorflow-estimator's private function: in TF 2.15.
  for row in tf_names.LEGACY + tf_names.PRIVATE:
    assert _tf_object(row.tf), row.tf
  full = {row.tf for row in tf_names.LEGACY + tf_names.PRIVATE}
  for alias, target in tf_names.ALIASES.items():
    if alias.startswith("tensorflow.contrib.") or alias in _NOT_IN_TF_215:
      continue
    if alias.endswith("."):
      assert inspect.ismodule(_at(alias[:-1])), alias
    else:
      assert _tf_object(alias), alias
      assert tf_names.lookup(alias) is not None, alias
    if target.startswith("tensorflow"):  # a spelling resolved again
      assert target.rstrip(".") in full or any(
          other.startswith(target) for other in tf_names.ALIASES), alias
    else:
      assert tf_names.canonical(alias.rstrip(".")) == target.rstrip(".")
      assert target.rstrip(".") in covered | set(tf_names.COVERED_MODULES)
  for name in tf_names.CONTRIB_TPU_IN_COMPAT_V1:
    assert hasattr(tf.compat.v1.tpu, name), name


def test_the_modules_behind_the_names_give_the_same_objects():
  """Each name a module alias resolves (`tensorflow_estimator.python.
  estimator.model_fn.ModeKeys`, TF 1.x's `tensorflow.python.estimator.
  estimator.Estimator`, `tensorflow_estimator.estimator.tpu.RunConfig`) is
  the very object its row names."""
  checked = 0
  for alias in list(tf_names.ALIASES) + ["tensorflow_estimator.estimator."]:
    if not alias.endswith(".") or alias.startswith("tensorflow.contrib."):
      continue
    module = _at(alias[:-1])
    for name in dir(module):
      row = tf_names.lookup(alias + name)
      if name.startswith("__") or row is None or row.tf in tf_names.MODULES:
        continue
      theirs = _tf_object(row.tf)
      if row.tf.endswith(".Estimator"):  # EstimatorV2 too
        assert issubclass(getattr(module, name), theirs), alias + name
      else:
        assert getattr(module, name) is theirs, alias + name
      checked += 1
  assert checked > 100


_FRAMEWORK_MODULES = ("estimator", "model_fn", "run_config", "training",
                      "warm_start")


def _own_framework_object(row):
  """This library's framework's counterpart of a `framework` row: what
  `ours` is on current TF."""
  name = row.ours.rpartition(".")[2]
  if row.tf.startswith("estimator.tpu."):
    modules = ("tpu_config",)
  elif row.tf.startswith("estimator.export."):
    modules = ("export",)
  else:
    modules = _FRAMEWORK_MODULES
  for module in modules:
    module = importlib.import_module(
        f"estimator_spec.estimator.framework.{module}")
    if hasattr(module, name):
      return getattr(module, name)
  raise AssertionError(f"estimator/framework/ has no {name} ({row.tf})")


@pytest.mark.parametrize("row", [r for r in tf_names.NAMES + tf_names.LEGACY
                                 + tf_names.PRIVATE
                                 if r.kind in tf_names.OUR_KINDS],
                         ids=lambda r: r.tf)
def test_our_counterpart_takes_what_tfs_takes(row):
  ours = _our_object(row.ours)
  theirs = _tf_object(row.tf)
  if row.kind == tf_names.FRAMEWORK:
    own = _own_framework_object(row)
    # tensorflow-estimator's object where the library stands on it.
    assert ours is (own if stack.OWN else theirs)
    ours = own
  assert ours is not theirs
  assert ours.__module__.split(".")[0] in ("estimator_spec",
                                           "tpu_embedding_columns")
  _assert_takes_the_arguments_of(ours, theirs, row.ours)


def _assert_takes_the_arguments_of(ours, theirs, label):
  """Every argument of TF's `theirs` is one of `ours`, in TF's order."""
  their_parameters = _parameters(theirs)
  our_parameters = _parameters(ours)
  assert their_parameters is not None and our_parameters is not None
  takes_any = any(p.kind == p.VAR_KEYWORD for p in our_parameters.values())
  missing = [name for name, p in their_parameters.items()
             if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and
             name not in our_parameters and not takes_any]
  assert not missing, f"{label} lacks TF's arguments {missing}"
  # TF's positional order holds for the arguments both take.
  positional = [n for n, p in their_parameters.items()
                if p.kind == p.POSITIONAL_OR_KEYWORD and n != "self"]
  ours_positional = [n for n, p in our_parameters.items()
                     if p.kind == p.POSITIONAL_OR_KEYWORD and n != "self"]
  assert ours_positional[:len(positional)] == positional or takes_any, (
      label, ours_positional, positional)


def test_rows_not_mirrored_say_why():
  for row in tf_names.NAMES + tf_names.LEGACY + tf_names.PRIVATE:
    assert row.kind in tf_names.KINDS
    if row.kind == tf_names.REFUSED:
      assert row.ours is None and len(row.note) > 40, row
    if row.kind == tf_names.TF:
      assert row.note, row


def test_modules_mapped_whole_have_every_name():
  """A module of ours stands for TF's: it holds every counterpart of the
  TF module's names under the same name (all of them, but in the modules
  listed as partial), as a module alias rewritten to ours needs."""
  for module, ours in tf_names.MODULES.items():
    our_module = importlib.import_module(ours)
    their_module = _tf_object(module)
    spelling = "tensorflow.compat.v1." + module
    if module.startswith("tensorflow"):
      spelling = module
    refused = []
    for name in dir(their_module):
      if name.startswith("_") or f"{module}.{name}" in tf_names.MODULES:
        continue
      row = tf_names.lookup(f"{spelling}.{name}")
      if row is None or row.kind not in tf_names.OUR_KINDS or (
          row.ours != f"{ours}.{name}"):
        refused.append(name)
        continue
      assert getattr(our_module, name) is _our_object(row.ours), name
    assert bool(refused) == (module in tf_names.PARTIAL_MODULES), (
        module, refused)


def test_spellings_resolve_to_the_same_row():
  row = tf_names.lookup("tensorflow.compat.v1.estimator.tpu.RunConfig")
  for spelling in ("tensorflow.estimator.tpu.RunConfig",
                   "tensorflow.contrib.tpu.RunConfig",
                   "tensorflow_estimator.python.estimator.tpu.tpu_config."
                   "RunConfig",
                   "tensorflow.compat.v1.compat.v1.estimator.tpu.RunConfig",
                   "tensorflow_estimator.estimator.tpu.RunConfig"):
    assert tf_names.lookup(spelling) is row
  row = tf_names.lookup("tensorflow.estimator.ModeKeys")
  assert row.ours == "estimator_spec.estimator.ModeKeys"
  for spelling in ("tensorflow.compat.v1.estimator.ModeKeys",
                   "tensorflow_estimator.estimator.ModeKeys",
                   "tensorflow_estimator.python.estimator.mode_keys.ModeKeys",
                   "tensorflow_estimator.python.estimator.model_fn.ModeKeys",
                   "tensorflow.python.estimator.model_fn.ModeKeys"):
    assert tf_names.lookup(spelling) is row
  row = tf_names.lookup("tensorflow.python.estimator.estimator."
                        "_load_global_step_from_checkpoint_dir")
  assert row.ours == (
      "estimator_spec.estimator.load_global_step_from_checkpoint_dir")
  assert tf_names.lookup("tensorflow_estimator.python.estimator.tpu."
                         "tpu_estimator._load_global_step_from_checkpoint_dir"
                         ) is row
  assert tf_names.lookup("tensorflow.estimator.LoggingTensorHook").ours == (
      "tensorflow.compat.v1.train.LoggingTensorHook")
  assert tf_names.lookup("tensorflow_estimator").ours == "estimator_spec"
  assert tf_names.lookup("tensorflow.estimator").kind == tf_names.REFUSED


def test_modules_some_tf_lacks_are_named_with_the_versions():
  for dotted in ("tensorflow.estimator", "tensorflow.compat.v1.estimator.tpu",
                 "tensorflow.compat.v1.estimator.ModeKeys",
                 "tensorflow_estimator",
                 "tensorflow.python.estimator.estimator",
                 "tensorflow_estimator.python.estimator.model_fn"):
    assert tf_names.missing_from(dotted).startswith(
        "TF 2.16 and later have no tf.estimator"), dotted
  assert tf_names.missing_from("tensorflow.contrib.tpu").startswith("TF 2.15")
  assert tf_names.missing_from(
      "tensorflow.python.tpu.tpu_embedding.AdagradParameters").startswith(
          "current TF")
  for dotted in ("tensorflow", "tensorflow.compat.v1", "tensorflow.python.ops",
                 "tensorflow.python.tpu.tpu_embedding_v2",
                 "tensorflow.compat.v1.train.LoggingTensorHook"):
    assert tf_names.missing_from(dotted) is None, dotted
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
