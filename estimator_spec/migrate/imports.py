"""Plan the edits of a file's import statements, after its uses' (edits.py):
an import of a name the table knows becomes the import of its counterpart
(`from estimator_spec import TPUEstimator`), a whole-module alias an alias
of our module, TF 1.x's `from tensorflow import flags` an import from
`tf.compat.v1`; an import of a module some TF lacks goes when no use of it
is left (a line in the report when one is). Then the modules the new
names need are imported, unless the file does."""
import ast

from estimator_spec import tf_names
from estimator_spec.migrate import table
from estimator_spec.migrate.names import is_tf
from estimator_spec.migrate.names import statements
from estimator_spec.migrate.report import Change
from estimator_spec.migrate.report import one_line


def rewrite_imports(names, edits):
  """Each import statement binding a name, as the plan of its uses asks."""
  for statement in names.import_statements():
    if isinstance(statement, ast.Import):
      _rewrite_import(names, edits, statement)
    else:
      _rewrite_import_from(names, edits, statement)


def _rewrite_import(names, edits, statement):
  kept, added, changed = [], [], False
  for alias in statement.names:
    binding = names.binding_of(statement, alias)
    target = binding and edits.module_targets.get(binding.name)
    if target:
      added.append(f"import {target} as {binding.name}")
      changed = True
    elif binding is not None and _unused_and_gone(edits, binding):
      changed = True
    else:
      kept.append(alias_text(alias))
      if binding is not None:
        _note_gone(edits, statement, binding)
  if changed:
    lines = ([f"import {', '.join(kept)}"] if kept else []) + added
    _replace_statement(names, edits, statement, lines)


def _rewrite_import_from(names, edits, statement):
  kept, added, changed = [], [], False
  for alias in statement.names:
    binding = names.binding_of(statement, alias)
    new = (None if binding is None or not is_tf(binding.path) else
           _new_from_import(edits, statement, alias, binding))
    if new is None:
      kept.append(alias_text(alias))
    else:
      added.extend(new)
      changed = True
  if changed:
    lines = ([f"from {statement.module} import {', '.join(kept)}"]
             if kept else []) + merged(added)
    _replace_statement(names, edits, statement, lines)


def _new_from_import(edits, statement, alias, binding):
  """The import lines that replace one alias of a `from M import ...` of
  TF's (none: it goes), or None to keep it (with a line when the report
  wants one)."""
  target = edits.module_targets.get(binding.name)
  row = table.imported_row(binding.path)
  moved = table.moved_module(binding.path)
  if target:
    return [f"import {target} as {binding.name}"]
  if row is not None and table.is_ours_or_moved(row):
    module, _, name = row.ours.rpartition(".")
    if row.kind == tf_names.TPU_ONLY:
      edits.note(statement.lineno, binding.path, table.why(row))
    if module == statement.module and name == alias.name:
      return None  # already where TF keeps it
    return [f"from {module} import {name}" +
            ("" if name == binding.name else f" as {binding.name}")]
  if moved:
    return [f"from {table.COMPAT_V1} import {moved}" +
            ("" if moved == binding.name else f" as {binding.name}")]
  if _unused_and_gone(edits, binding):
    return []
  if row is not None:
    edits.note(statement.lineno, binding.path, table.why(row))
  else:
    _note_gone(edits, statement, binding)
  return None


def _unused_and_gone(edits, binding):
  """A binding into a module some TF lacks (tf.contrib, tf.estimator)
  none of whose uses is left: its import goes."""
  return (tf_names.missing_from(binding.path) is not None and
          not binding.bare_uses and
          all(id(node) in edits.rewritten for node, _ in binding.uses))


def _note_gone(edits, statement, binding):
  """A line for a kept import of a module some TF lacks."""
  missing = tf_names.missing_from(binding.path)
  if missing and (binding.uses or binding.bare_uses):
    edits.note(statement.lineno, binding.path,
               f"{missing}, and this file still uses {binding.name} (names "
               "with no counterpart here, or the module as a value)")


def _replace_statement(names, edits, statement, lines):
  """Puts `lines` where `statement` was (removes it when there are none),
  each at its indentation."""
  source = edits.source
  old = one_line(source.text(statement))
  if not lines:
    sole = _sole_in_block(names.tree, statement)
    source.delete_statement(statement, sole)
    edits.changes.append(Change(statement.lineno, old,
                                "pass" if sole else "(removed)"))
    return
  indent = source.indent(statement)
  source.replace(statement, (source.newline + indent).join(lines))
  edits.changes.append(Change(statement.lineno, old, "; ".join(lines)))


def _sole_in_block(tree, statement):
  for body, node in statements(tree):
    if node is statement:
      return len(body) == 1 and body is not tree.body
  return False


def add_imports(names, edits):
  """Imports the modules the new names need, unless the file does (one
  of a package and its module: `import estimator_spec.estimator` binds
  `estimator_spec` too)."""
  needed = {name for name in edits.needed if not any(
      other.startswith(name + ".") for other in edits.needed)}
  missing = sorted(name for name in needed if not names.imports(name))
  if not missing:
    return
  line = _import_line(names.tree)
  source = edits.source
  source.insert_line(
      line, source.newline.join(f"import {name}" for name in missing))
  for name in missing:
    edits.changes.append(Change(line, "", f"import {name}"))


def _import_line(tree):
  """The line before which new imports go: after the last module-level
  import ahead of the first definition, else after the docstring and
  `__future__` imports."""
  after = 0
  for index, node in enumerate(tree.body):
    if isinstance(node, (ast.Import, ast.ImportFrom)):
      after = node.end_lineno
    elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                           ast.ClassDef)):
      break
    elif index == 0 and isinstance(node, ast.Expr) and isinstance(
        node.value, ast.Constant) and isinstance(node.value.value, str):
      after = node.end_lineno
  return after + 1


def merged(imports):
  """`from M import a` lines of one module joined into one, in order."""
  lines, names = [], {}
  for line in imports:
    if line.startswith("from "):
      module, _, name = line[len("from "):].partition(" import ")
      if module in names:
        names[module].append(name)
        continue
      names[module] = [name]
      lines.append(module)
    else:
      lines.append(line)
  return [f"from {line} import {', '.join(names[line])}" if line in names
          else line for line in lines]


def alias_text(alias):
  """`name as asname` of an import's alias, as written in a new one."""
  return alias.name + (f" as {alias.asname}" if alias.asname else "")
