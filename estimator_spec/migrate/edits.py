"""Plan the edits of a file's uses of TF's names: each use the table knows
becomes ours (`estimator_spec.TPUEstimator`), moves to where TF keeps it
(`tf.compat.v1.tpu.rewrite`), or stays with a line in the report; a
whole-module alias becomes an alias of our module when every use allows
it; TF 1.x's `tf.flags` moves to `tf.compat.v1.flags`, other TF 1.x-only
names are counted. `Edits` holds what the plan decided; the imports'
edits follow from it (imports.py)."""
from typing import Dict, List, Set

from estimator_spec import tf1_names
from estimator_spec import tf_names
from estimator_spec.migrate import table
from estimator_spec.migrate.names import is_tf
from estimator_spec.migrate.report import Change
from estimator_spec.migrate.report import Note
from estimator_spec.migrate.report import one_line


class Edits:
  """One file's plan: the edits (made on `source`), the report's changes
  and notes, the modules the new names need, the TF 1.x names it uses;
  which uses are rewritten, and the module imports that become ours
  (binding name -> our module)."""

  def __init__(self, source):
    self.source = source
    self.changes: List[Change] = []
    self.notes: List[Note] = []
    self.needed: Set[str] = set()  # top-level modules the new names need
    self.tf1: Dict[str, int] = {}  # TF 1.x-only name -> its first line
    self.rewritten: Set[int] = set()  # ids of the uses rewritten
    self.module_targets: Dict[str, str] = {}
    self._noted = set()

  def note(self, line, name, why):
    """A name left alone, once per line."""
    if (line, name) not in self._noted:
      self._noted.add((line, name))
      self.notes.append(Note(line, one_line(name), why))

  def replace(self, node, new, use):
    """Rewrites the span of `node` as `new`; `use`, the outermost node of
    the use it lies in, is then rewritten."""
    written = self.source.text(node)
    self.source.replace(node, new)
    self.rewritten.add(id(use))
    self.changes.append(Change(node.lineno, one_line(written), new))

  def count_tf1(self, name, line):
    """A TF 1.x-only name used at `line` (its first line is kept)."""
    self.tf1[name] = min(self.tf1.get(name, line), line)

  def sort(self):
    """The report's lines in the order of the file's."""
    self.changes.sort(key=lambda c: c.line)
    self.notes.sort(key=lambda n: n.line)


def module_aliases(names, edits):
  """Imports binding a whole TF module that has our counterpart, every
  use of which names the same counterpart through ours (and which is
  passed as a value only when ours has all its names): the import alone
  changes."""
  for binding in names.bindings.values():
    if binding.name in names.ambiguous or not is_tf(binding.path):
      continue
    row = table.module_row(binding.path)
    if row is None:
      continue
    if binding.bare_uses and row.tf in tf_names.PARTIAL_MODULES:
      continue  # passed around as a value, ours lacking some names
    if all(table.same_in(row.ours, binding.path, parts)
           for _, parts in binding.uses):
      edits.module_targets[binding.name] = row.ours
      edits.rewritten.update(id(node) for node, _ in binding.uses)


def rewrite_uses(names, edits):
  """Each use of a TF name through a module binding, by the table."""
  for binding in names.bindings.values():
    if edits.module_targets.get(binding.name):
      continue
    if table.imported_row(binding.path) is not None:
      continue  # a name imported itself: its import is rewritten
    for node, parts in binding.uses:
      keep, row = table.resolve(binding.path, parts)
      if row is None:
        _unknown_use(names, edits, binding, node, parts)
        continue
      target = _up(node, len(parts) - keep)
      new = _known_use(names, edits, row, target,
                       ".".join([binding.path] + parts[1:keep]))
      if new is not None:
        edits.replace(target, new, node)


def _known_use(names, edits, row, target, dotted):
  """The new text of the node `target`, which names `dotted`, the table's
  `row`; None to keep it (with a line when the report wants one)."""
  written = edits.source.text(target)
  new = _new_text(names, edits, row)
  if row.kind in table.KEPT_AT and table.in_tf2_as_written(dotted, row):
    new = written
  if row.kind == tf_names.TPU_ONLY or new is None:
    edits.note(target.lineno, written, table.why(row))
  return None if new == written else new


def _up(node, steps):
  """The node `steps` attributes up a chain from `node` (`a.b` of
  `a.b.c.d`, two steps)."""
  for _ in range(steps):
    node = node.value
  return node


def _unknown_use(names, edits, binding, node, parts):
  """A use the table does not know: TF 1.x's `tf.flags` moves to
  `tf.compat.v1.flags`; another TF 1.x-only name is counted for the
  report; one in a namespace the table covers gets a line."""
  dotted = ".".join([binding.path] + parts[1:])
  relative = table.under_tf_root(dotted)
  if relative is None:
    relative = ""
  moved = tf1_names.moved(relative)
  # Steps from the use up to the moved name's node (none when the import
  # itself names it: the import moves, imports.py).
  up = moved and len(parts) - 1 - (len(moved[0].split(".")) -
                                   len(binding.path.split(".")) + 1)
  if moved and up < len(parts) - 1:
    target = _up(node, up)
    new = _tf_expression(names, edits, f"{table.COMPAT_V1}.{moved[1]}")
    edits.replace(target, new, node)
    return
  if tf_names.is_covered(dotted):
    edits.note(node.lineno, edits.source.text(node),
               "not in the table of names (docs/migration.md); "
               "no counterpart here")
  name = None if moved else table.tf1_name(relative)
  if name:  # (a moved module's import moves)
    edits.count_tf1(name, node.lineno)


def _new_text(names, edits, row):
  """The expression that replaces a use of `row`, or None to keep it."""
  if row.kind in tf_names.OUR_KINDS:
    edits.needed.add(table.module_of(row.ours))
    return row.ours
  if row.kind in table.KEPT_AT and row.ours:
    return _tf_expression(names, edits, row.ours)
  return None


def _tf_expression(names, edits, full):
  """`full` (tensorflow.compat.v1.X) written through the file's own
  alias of TF when it has one."""
  if full.startswith(table.COMPAT_V1 + "."):
    alias = names.alias_of(table.COMPAT_V1)
    if alias is not None:
      return alias + full[len(table.COMPAT_V1):]
  alias = names.alias_of("tensorflow")
  if alias is not None:
    return alias + full[len("tensorflow"):]
  edits.needed.add("tensorflow")
  return full


def note_ambiguous(names, edits):
  """A line for each TF name the file's imports bind more than once."""
  for name in sorted(names.ambiguous):
    binding = names.bindings.get(name)
    if binding is not None and is_tf(binding.path):
      edits.note(binding.statement.lineno, name,
                 "bound to more than one module by this file's imports; "
                 "its uses are left as they are")
