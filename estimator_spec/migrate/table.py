"""What each name becomes, by the table of names (`estimator_spec.tf_names`,
and `tf1_names` for TF 1.x's): the row a use names, whether TF 2 already
spells it that way, where a TF 1.x module moved, the module a new name
needs, and the report's words for a name left alone. Plain functions of
the table; the file's edits are planned from them (edits.py,
imports.py)."""
from estimator_spec import tf1_names
from estimator_spec import tf_names

COMPAT_V1 = "tensorflow.compat.v1"
KEPT_AT = (tf_names.TF, tf_names.TPU_ONLY)  # TF's own, maybe moved
ESTIMATOR_MODULE = "estimator_spec.estimator"


def resolve(path, parts):
  """(prefix node depth, row) of the longest prefix of a use (`parts`, its
  first the name an import binds to `path`) that the table knows, or
  (None, None). A module's row counts only for the module itself: an
  unknown name in it is no name of ours."""
  for keep in range(len(parts), 1, -1):
    dotted = ".".join([path] + parts[1:keep])
    row = tf_names.lookup(dotted)
    if row is not None and (keep == len(parts) or
                            row.tf not in tf_names.MODULES):
      return keep, row
  return None, None


def same_in(target, path, parts):
  """Whether a use of a name bound to the module `path` names, through our
  module `target`, the very counterpart the table gives it."""
  keep, row = resolve(path, parts)
  return (row is not None and row.kind in tf_names.OUR_KINDS and
          row.ours == ".".join([target] + parts[1:keep]))


def module_row(path):
  """The row of a TF module that has our counterpart module, or None."""
  row = tf_names.lookup(path)
  if row is None or row.tf not in tf_names.MODULES:
    return None
  return row


def imported_row(path):
  """The row of a name an import binds itself (not a module), or None."""
  row = tf_names.lookup(path)
  if row is None or row.tf in tf_names.MODULES:
    return None
  return row


def is_ours_or_moved(row):
  """Whether a row is rewritten: to ours, or to where TF keeps it."""
  return row.kind in tf_names.OUR_KINDS or (row.kind in KEPT_AT and
                                            bool(row.ours))


def why(row):
  """The report's words for a name of `row` left alone."""
  if row.kind == tf_names.REFUSED:
    return f"refused: {row.note}"
  if row.kind == tf_names.TPU_ONLY:
    return f"needs a TPU: {row.note}"
  return f"kept: {row.note}"


def in_tf2_as_written(dotted, row):
  """Whether `dotted`, a use of TF's own `row` under TF's root, already
  names it in TF 2 (`tf.distribute.cluster_resolver.TPUClusterResolver`
  stays; TF 1.x's `tf.tpu.rewrite` moves to `tf.compat.v1.tpu.rewrite`)."""
  relative = under_tf_root(dotted)
  return (relative is not None and row.ours is not None and
          relative == tf_names.canonical(row.ours) and
          tf1_names.tf1_prefix(relative) is None)


def moved_module(path):
  """The name under tf.compat.v1 of a TF 1.x module that an import binds
  itself (`from tensorflow import flags`), or None."""
  relative = under_tf_root(path)
  moved = relative and tf1_names.moved(relative)
  return moved[1] if moved and moved[0] == relative else None


def under_tf_root(dotted):
  """'train.AdamOptimizer' of 'tensorflow.train.AdamOptimizer': a name
  under TF's own root (not `tf.compat`, not TF's private modules), or
  None."""
  if not dotted.startswith("tensorflow."):
    return None
  relative = dotted[len("tensorflow."):]
  if relative.split(".")[0] in ("compat", "python"):
    return None
  return relative


def tf1_name(relative):
  """The report's name (`tf.train.AdamOptimizer`, `tf.contrib.layers`) of
  the TF 1.x-only part of a name under TF's root, or None."""
  prefix = tf1_names.tf1_prefix(relative) if relative else None
  if not prefix:
    return None
  if prefix == "contrib" and len(relative.split(".")) > 1:
    prefix = ".".join(relative.split(".")[:2])  # tf.contrib.layers
  return "tf." + prefix


def module_of(name):
  """The module to import for one of our names: `estimator_spec.
  estimator` for the names in it (it loads the Estimator framework), else
  the package."""
  if name.startswith(ESTIMATOR_MODULE + "."):
    return ESTIMATOR_MODULE
  return name.split(".")[0]
