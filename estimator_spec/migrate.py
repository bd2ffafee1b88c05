"""`python -m estimator_spec migrate`: the import change, made by a program.

Rewrites the TF names of TPU embedding and TPUEstimator programs
(`tf.compat.v1.estimator.tpu.TPUEstimator`, `from tensorflow.compat.v1.
estimator import tpu as tpu_estimator`, `tf.contrib.tpu.RunConfig`,
`tf.compat.v1.tpu.experimental.embedding_column`, `tf.estimator.ModeKeys`,
`tf.estimator.export.ServingInputReceiver`, `import tensorflow_estimator`,
...) to this library's, by the one table of names (`estimator_spec.
tf_names`), so that the program no longer needs tensorflow-estimator. It
reads each file's syntax tree (Python's `ast`), finds the names through the
file's own import aliases, and edits only those spans of the source:
comments, formatting and everything else stay byte for byte. See
docs/migration.md.

This module itself uses no TensorFlow: it reads programs, never runs them.
"""
import ast
import dataclasses
import io
import os
import stat
import tokenize
from typing import Dict, List, Optional, Tuple

from estimator_spec import files as files_lib
from estimator_spec import tf1_names
from estimator_spec import tf_names

OUR_PACKAGES = ("estimator_spec", "tpu_embedding_columns")
_TF_ROOTS = ("tensorflow", "tensorflow_estimator")
_COMPAT_V1 = "tensorflow.compat.v1"
_KEPT_AT = (tf_names.TF, tf_names.TPU_ONLY)  # TF's own, maybe moved
_ESTIMATOR_MODULE = "estimator_spec.estimator"
MAX_FILE_BYTES = 16 << 20  # a larger .py file is refused, not read


@dataclasses.dataclass
class Change:
  line: int
  old: str
  new: str


@dataclasses.dataclass
class Note:
  line: int
  name: str
  why: str


@dataclasses.dataclass
class Result:
  """What migrating one file's source gave: the new source (None when it
  could not be parsed), its changes, what was left alone, or the error;
  `tf1`: the TF 1.x-only names it uses (docs/migration.md, 'TF 1.x code'),
  as written, with the first line of each."""
  source: Optional[bytes]
  changes: List[Change]
  notes: List[Note]
  error: Optional[str] = None
  tf1: Dict[str, int] = dataclasses.field(default_factory=dict)


class _Binding:
  """A name a file's imports bind to a TF module or object."""

  def __init__(self, name, path, statement, alias):
    self.name = name
    self.path = path
    self.statement = statement         # the first import binding it
    self.aliases = [(statement, alias)]  # every import binding it
    self.uses = []          # chain nodes rooted at this name
    self.rewritten = set()  # ids of the uses this migration rewrites
    self.bare_uses = 0      # uses of the name alone (not `name.attr`)


def _chain(node):
  """['tf', 'estimator', 'tpu', 'RunConfig'] of an attribute chain over a
  name, or None."""
  parts = []
  while isinstance(node, ast.Attribute):
    parts.append(node.attr)
    node = node.value
  if isinstance(node, ast.Name):
    parts.append(node.id)
    return parts[::-1]
  return None


def _is_tf(path):
  return path.split(".")[0] in _TF_ROOTS


class _Source:
  """A file's text as UTF-8 bytes (ast's offsets count UTF-8 bytes), with
  the spans of nodes and a list of edits applied at the end."""

  def __init__(self, text):
    self.data = text.encode("utf-8")
    self.starts = [0]
    for index, byte in enumerate(self.data):
      if byte == 10:
        self.starts.append(index + 1)
    self.newline = "\r\n" if b"\r\n" in self.data else "\n"
    self.edits = []  # (start, end, new bytes)

  def offset(self, line, col):
    return self.starts[line - 1] + col

  def span(self, node):
    return (self.offset(node.lineno, node.col_offset),
            self.offset(node.end_lineno, node.end_col_offset))

  def text(self, node):
    start, end = self.span(node)
    return self.data[start:end].decode("utf-8")

  def indent(self, node):
    start = self.starts[node.lineno - 1]
    return self.data[start:start + node.col_offset].decode("utf-8")

  def replace(self, node, new):
    start, end = self.span(node)
    self.edits.append((start, end, new.encode("utf-8")))

  def delete_statement(self, node, sole_in_block):
    """Removes a statement: its whole lines when it has them to itself,
    `pass` when it is the only statement of its block."""
    if sole_in_block:
      self.replace(node, "pass")
      return
    start, end = self.span(node)
    line_start = self.starts[node.lineno - 1]
    following = (self.starts[node.end_lineno] if node.end_lineno <
                 len(self.starts) else len(self.data))
    before = self.data[line_start:start]
    after = self.data[end:following]
    if not before.strip() and (not after.strip() or
                               after.strip().startswith(b"#")):
      self.edits.append((line_start, following, b""))
    else:
      self.edits.append((start, end, b"pass"))

  def insert_line(self, line, text):
    """Inserts `text` as a whole line before line `line` (1-based; one past
    the last line appends)."""
    if line - 1 < len(self.starts):
      at = self.starts[line - 1]
    else:
      at = len(self.data)
    prefix = b""
    if at == len(self.data) and self.data and not self.data.endswith(b"\n"):
      prefix = self.newline.encode()
    self.edits.append((at, at, prefix + (text + self.newline).encode()))

  def result(self):
    data = self.data
    last = None
    for start, end, new in sorted(self.edits, key=lambda e: (e[0], e[1]),
                                  reverse=True):
      if last is not None and end > last:
        raise AssertionError("overlapping edits")  # a bug here, not input
      data = data[:start] + new + data[end:]
      last = start
    return data


class _Migration:
  """One file's migration: bindings, then uses, then the edits."""

  def __init__(self, tree, source):
    self.tree = tree
    self.source = source
    self.bindings: Dict[str, _Binding] = {}
    self.ambiguous = set()
    self.changes: List[Change] = []
    self.notes: List[Note] = []
    self.needed = set()  # top-level modules the new names need
    self.tf1: Dict[str, int] = {}  # TF 1.x-only name -> its first line
    self._noted = set()

  # --- bindings ---------------------------------------------------------

  def collect_bindings(self):
    for _, statement in sorted(_statements(self.tree),
                               key=lambda item: item[1].lineno):
      if isinstance(statement, ast.Import):
        for alias in statement.names:
          if alias.asname:
            name, path = alias.asname, alias.name
          else:
            name = path = alias.name.split(".")[0]
          self._bind(name, path, statement, alias)
      elif isinstance(statement, ast.ImportFrom):
        if statement.level or not statement.module:
          continue
        for alias in statement.names:
          if alias.name == "*":
            continue
          self._bind(alias.asname or alias.name,
                     f"{statement.module}.{alias.name}", statement, alias)

  def _bind(self, name, path, statement, alias):
    known = self.bindings.get(name)
    if known is None:
      self.bindings[name] = _Binding(name, path, statement, alias)
    elif known.path != path:
      self.ambiguous.add(name)
    else:
      known.aliases.append((statement, alias))

  def _tf_binding(self, name):
    binding = self.bindings.get(name)
    if binding is None or name in self.ambiguous or not _is_tf(
        binding.path):
      return None
    return binding

  # --- uses ---------------------------------------------------------------

  def collect_uses(self):
    for node, local in _walk_loads(self.tree):
      parts = _chain(node)
      binding = self._tf_binding(parts[0])
      if binding is None or parts[0] in local:
        continue  # not a TF name, or a function's own variable there
      if len(parts) == 1:
        binding.bare_uses += 1
      else:
        binding.uses.append((node, parts))

  def _resolve(self, binding, parts):
    """(prefix node depth, row) of the longest prefix of a use that the
    table knows, or (None, None). A module's row counts only for the
    module itself: an unknown name in it is no name of ours."""
    for keep in range(len(parts), 1, -1):
      dotted = ".".join([binding.path] + parts[1:keep])
      row = tf_names.lookup(dotted)
      if row is not None and (keep == len(parts) or
                              row.tf not in tf_names.MODULES):
        return keep, row
    return None, None

  def _same_in(self, target, binding, parts):
    """Whether a use of a module binding names, through our module
    `target`, the very counterpart the table gives it."""
    keep, row = self._resolve(binding, parts)
    return (row is not None and row.kind in tf_names.OUR_KINDS and
            row.ours == ".".join([target] + parts[1:keep]))

  # --- rewriting ----------------------------------------------------------

  def module_aliases(self):
    """Imports binding a whole TF module that has our counterpart, every
    use of which names the same counterpart through ours (and which is
    passed as a value only when ours has all its names): the import alone
    changes."""
    for binding in list(self.bindings.values()):
      if binding.name in self.ambiguous or not _is_tf(binding.path):
        continue
      row = tf_names.lookup(binding.path)
      if row is None or row.tf not in tf_names.MODULES:
        continue
      if binding.bare_uses and row.tf in tf_names.PARTIAL_MODULES:
        continue  # passed around as a value, ours lacking some names
      if all(self._same_in(row.ours, binding, parts)
             for _, parts in binding.uses):
        binding.module_target = row.ours
        binding.rewritten.update(id(node) for node, _ in binding.uses)

  def rewrite_uses(self):
    for binding in self.bindings.values():
      if getattr(binding, "module_target", None):
        continue
      bound = tf_names.lookup(binding.path)
      if bound is not None and bound.tf not in tf_names.MODULES:
        continue  # a name imported itself: its import is rewritten
      for node, parts in binding.uses:
        keep, row = self._resolve(binding, parts)
        written = self.source.text(node)
        if row is None:
          self._unknown_use(binding, node, parts)
          continue
        target = node
        for _ in range(len(parts) - keep):
          target = target.value
        written = self.source.text(target)
        new = self._new_text(row, binding)
        if row.kind in _KEPT_AT and _in_tf2_as_written(
            ".".join([binding.path] + parts[1:keep]), row):
          new = written
        if row.kind == tf_names.TPU_ONLY or new is None:
          self._note(target.lineno, written, _why(row))
        if new is None or new == written:
          continue
        self.source.replace(target, new)
        binding.rewritten.add(id(node))
        self.changes.append(Change(target.lineno, _one_line(written), new))

  def _unknown_use(self, binding, node, parts):
    """A use the table does not know: TF 1.x's `tf.flags` moves to
    `tf.compat.v1.flags`; another TF 1.x-only name is counted for the
    report; one in a namespace the table covers gets a line."""
    dotted = ".".join([binding.path] + parts[1:])
    relative = _under_tf_root(dotted)
    if relative is None:
      relative = ""
    moved = tf1_names.moved(relative)
    # Steps from the use up to the moved name's node (none when the import
    # itself names it: the import moves, _rewrite_import_from).
    up = moved and len(parts) - 1 - (len(moved[0].split(".")) -
                                     len(binding.path.split(".")) + 1)
    if moved and up < len(parts) - 1:
      target = node
      for _ in range(up):
        target = target.value
      written = self.source.text(target)
      new = self._tf_expression(f"{_COMPAT_V1}.{moved[1]}", binding)
      self.source.replace(target, new)
      binding.rewritten.add(id(node))
      self.changes.append(Change(target.lineno, _one_line(written), new))
      return
    if tf_names.is_covered(dotted):
      self._note(node.lineno, self.source.text(node),
                 "not in the table of names (docs/migration.md); "
                 "no counterpart here")
    prefix = tf1_names.tf1_prefix(relative) if relative else None
    if prefix and not moved:  # (a moved module's import moves)
      if prefix == "contrib" and len(relative.split(".")) > 1:
        prefix = ".".join(relative.split(".")[:2])  # tf.contrib.layers
      name = "tf." + prefix
      self.tf1[name] = min(self.tf1.get(name, node.lineno), node.lineno)

  def _new_text(self, row, binding):
    """The expression that replaces a use of `row`, or None to keep it."""
    if row.kind in tf_names.OUR_KINDS:
      self.needed.add(_module_of(row.ours))
      return row.ours
    if row.kind in _KEPT_AT and row.ours:
      return self._tf_expression(row.ours, binding)
    return None

  def _tf_expression(self, full, binding):
    """`full` (tensorflow.compat.v1.X) written through the file's own
    alias of TF when it has one."""
    del binding
    for name, other in self.bindings.items():
      if name in self.ambiguous:
        continue
      if other.path == _COMPAT_V1 and full.startswith(_COMPAT_V1 + "."):
        return name + full[len(_COMPAT_V1):]
    for name, other in self.bindings.items():
      if name not in self.ambiguous and other.path == "tensorflow":
        return name + full[len("tensorflow"):]
    self.needed.add("tensorflow")
    return full

  def rewrite_imports(self):
    statements = {}
    for binding in self.bindings.values():
      for statement, _ in binding.aliases:
        statements.setdefault(id(statement), statement)
    for statement in statements.values():
      if isinstance(statement, ast.Import):
        self._rewrite_import(statement)
      else:
        self._rewrite_import_from(statement)

  def _binding_of(self, statement, alias):
    name = (alias.asname or alias.name if isinstance(statement,
                                                     ast.ImportFrom) else
            alias.asname or alias.name.split(".")[0])
    binding = self.bindings.get(name)
    if binding is None or name in self.ambiguous or not any(
        known is alias for _, known in binding.aliases):
      return None
    return binding

  def _unused_and_gone(self, binding):
    """A binding into a module some TF lacks (tf.contrib, tf.estimator)
    none of whose uses is left: its import goes."""
    return (tf_names.missing_from(binding.path) is not None and
            not binding.bare_uses and
            all(id(node) in binding.rewritten for node, _ in binding.uses))

  def _note_gone(self, statement, binding):
    """A line for a kept import of a module some TF lacks."""
    missing = tf_names.missing_from(binding.path)
    if missing and (binding.uses or binding.bare_uses):
      self._note(statement.lineno, binding.path,
                 f"{missing}, and this file still uses {binding.name} (names "
                 "with no counterpart here, or the module as a value)")

  def _rewrite_import(self, statement):
    kept, added, changed = [], [], False
    for alias in statement.names:
      binding = self._binding_of(statement, alias)
      target = binding and getattr(binding, "module_target", None)
      if target:
        added.append(f"import {target} as {binding.name}")
        changed = True
      elif binding is not None and self._unused_and_gone(binding):
        changed = True
      else:
        kept.append(_alias_text(alias))
        if binding is not None:
          self._note_gone(statement, binding)
    if changed:
      lines = ([f"import {', '.join(kept)}"] if kept else []) + added
      self._replace_statement(statement, lines)

  def _rewrite_import_from(self, statement):
    kept, added, changed = [], [], False
    for alias in statement.names:
      binding = self._binding_of(statement, alias)
      if binding is None or not _is_tf(binding.path):
        kept.append(_alias_text(alias))
        continue
      target = getattr(binding, "module_target", None)
      row = tf_names.lookup(binding.path)
      if target:
        added.append(f"import {target} as {binding.name}")
        changed = True
      elif row is not None and row.tf not in tf_names.MODULES and (
          row.kind in tf_names.OUR_KINDS or
          (row.kind in _KEPT_AT and row.ours)):
        module, _, name = row.ours.rpartition(".")
        if row.kind == tf_names.TPU_ONLY:
          self._note(statement.lineno, binding.path, _why(row))
        if module == statement.module and name == alias.name:
          kept.append(_alias_text(alias))  # already where TF keeps it
          continue
        added.append(f"from {module} import {name}" +
                     ("" if name == binding.name else f" as {binding.name}"))
        changed = True
      elif _moved_module(binding.path):
        new = _moved_module(binding.path)
        added.append(f"from {_COMPAT_V1} import {new}" +
                     ("" if new == binding.name else f" as {binding.name}"))
        changed = True
      elif self._unused_and_gone(binding):
        changed = True
      else:
        kept.append(_alias_text(alias))
        if row is not None and row.tf not in tf_names.MODULES:
          self._note(statement.lineno, binding.path, _why(row))
        else:
          self._note_gone(statement, binding)
    if changed:
      lines = ([f"from {statement.module} import {', '.join(kept)}"]
               if kept else []) + _merged(added)
      self._replace_statement(statement, lines)

  def _replace_statement(self, statement, lines):
    old = _one_line(self.source.text(statement))
    if not lines:
      sole = self._sole_in_block(statement)
      self.source.delete_statement(statement, sole)
      self.changes.append(Change(statement.lineno, old,
                                 "pass" if sole else "(removed)"))
      return
    indent = self.source.indent(statement)
    self.source.replace(statement,
                        (self.source.newline + indent).join(lines))
    self.changes.append(Change(statement.lineno, old, "; ".join(lines)))

  def _sole_in_block(self, statement):
    for body, node in _statements(self.tree):
      if node is statement:
        return len(body) == 1 and body is not self.tree.body
    return False

  def add_imports(self):
    """Imports the modules the new names need, unless the file does (one
    of a package and its module: `import estimator_spec.estimator` binds
    `estimator_spec` too)."""
    needed = {name for name in self.needed if not any(
        other.startswith(name + ".") for other in self.needed)}
    missing = sorted(name for name in needed if not self._imports(name))
    if not missing:
      return
    line = self._import_line()
    self.source.insert_line(
        line, self.source.newline.join(f"import {name}" for name in missing))
    for name in missing:
      self.changes.append(Change(line, "", f"import {name}"))

  def _imports(self, module):
    """Whether the file already imports `module` as itself."""
    top = module.split(".")[0]
    binding = self.bindings.get(top)
    if binding is None or binding.path != top or top in self.ambiguous:
      return False
    return module == top or module in _plain_imports(self.tree)

  def _import_line(self):
    """The line before which new imports go: after the last module-level
    import ahead of the first definition, else after the docstring and
    `__future__` imports."""
    body = self.tree.body
    after = 0
    for index, node in enumerate(body):
      if isinstance(node, (ast.Import, ast.ImportFrom)):
        after = node.end_lineno
      elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                             ast.ClassDef)):
        break
      elif index == 0 and isinstance(node, ast.Expr) and isinstance(
          node.value, ast.Constant) and isinstance(node.value.value, str):
        after = node.end_lineno
    return after + 1

  def _note(self, line, name, why):
    if (line, name) not in self._noted:
      self._noted.add((line, name))
      self.notes.append(Note(line, _one_line(name), why))

  def run(self):
    self.collect_bindings()
    self.collect_uses()
    self.module_aliases()
    self.rewrite_uses()
    self.rewrite_imports()
    self.add_imports()
    for name in sorted(self.ambiguous):
      binding = self.bindings.get(name)
      if binding is not None and _is_tf(binding.path):
        self._note(binding.statement.lineno, name,
                   "bound to more than one module by this file's imports; "
                   "its uses are left as they are")
    self.changes.sort(key=lambda c: c.line)
    self.notes.sort(key=lambda n: n.line)


def _merged(imports):
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


def _why(row):
  if row.kind == tf_names.REFUSED:
    return f"refused: {row.note}"
  if row.kind == tf_names.TPU_ONLY:
    return f"needs a TPU: {row.note}"
  return f"kept: {row.note}"


def _in_tf2_as_written(dotted, row):
  """Whether `dotted`, a use of TF's own `row` under TF's root, already
  names it in TF 2 (`tf.distribute.cluster_resolver.TPUClusterResolver`
  stays; TF 1.x's `tf.tpu.rewrite` moves to `tf.compat.v1.tpu.rewrite`)."""
  relative = _under_tf_root(dotted)
  return (relative is not None and row.ours is not None and
          relative == tf_names.canonical(row.ours) and
          tf1_names.tf1_prefix(relative) is None)


def _moved_module(path):
  """The name under tf.compat.v1 of a TF 1.x module that an import binds
  itself (`from tensorflow import flags`), or None."""
  relative = _under_tf_root(path)
  moved = relative and tf1_names.moved(relative)
  return moved[1] if moved and moved[0] == relative else None


def _under_tf_root(dotted):
  """'train.AdamOptimizer' of 'tensorflow.train.AdamOptimizer': a name
  under TF's own root (not `tf.compat`, not TF's private modules), or
  None."""
  if not dotted.startswith("tensorflow."):
    return None
  relative = dotted[len("tensorflow."):]
  if relative.split(".")[0] in ("compat", "python"):
    return None
  return relative


def _alias_text(alias):
  return alias.name + (f" as {alias.asname}" if alias.asname else "")


def _one_line(text):
  return " ".join(text.split())


def _statements(tree):
  """(the body holding it, statement) of every statement of `tree`."""
  stack = [tree]
  while stack:
    node = stack.pop()
    for field in ("body", "orelse", "finalbody", "handlers"):
      body = getattr(node, field, None)
      if isinstance(body, list):
        for child in body:
          if isinstance(child, ast.stmt):
            yield body, child
          stack.append(child)
    if isinstance(node, ast.Match):
      stack.extend(node.cases)


_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
_OWN_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
               ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp,
               ast.GeneratorExp)


def _walk_loads(tree):
  """(node, the names local there) of the outermost attribute chains and
  names read in `tree` (a chain's inner parts are not listed again). A
  function's own variables hide the file's imports of the same names in
  its body (`estimator` the module, `estimator` the TPUEstimator)."""
  stack = [(tree, frozenset())]
  while stack:
    node, local = stack.pop()
    if isinstance(node, (ast.Attribute, ast.Name)) and _chain(node):
      if isinstance(node.ctx, ast.Load) or isinstance(node, ast.Attribute):
        yield node, local
      continue
    body = []
    if isinstance(node, _FUNCTIONS):
      body = node.body if isinstance(node.body, list) else [node.body]
      inner = local | _local_names(node, body)
      stack.extend((child, inner) for child in body)
    stack.extend((child, local) for child in ast.iter_child_nodes(node)
                 if not any(child is statement for statement in body))


def _local_names(function, body):
  """The names a function binds itself: its arguments and what its `body`
  assigns, less those it declares global or nonlocal."""
  arguments = function.args
  names = {arg.arg for arg in arguments.posonlyargs + arguments.args +
           arguments.kwonlyargs + [arguments.vararg, arguments.kwarg] if arg}
  declared = set()
  stack = list(body)
  while stack:
    node = stack.pop()
    if isinstance(node, (ast.Global, ast.Nonlocal)):
      declared.update(node.names)
    elif isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
      names.add(node.id)
    elif isinstance(node, (ast.ExceptHandler, ast.FunctionDef,
                           ast.AsyncFunctionDef, ast.ClassDef)) and node.name:
      names.add(node.name)
    if not isinstance(node, _OWN_SCOPES):  # those bind names of their own
      stack.extend(ast.iter_child_nodes(node))
  return names - declared


def _plain_imports(tree):
  """The modules `tree` imports as `import a.b` (no `as`)."""
  return {alias.name for _, statement in _statements(tree)
          if isinstance(statement, ast.Import)
          for alias in statement.names if not alias.asname}


def _module_of(name):
  """The module to import for one of our names: `estimator_spec.
  estimator` for the names in it (it loads the Estimator framework), else
  the package."""
  if name.startswith(_ESTIMATOR_MODULE + "."):
    return _ESTIMATOR_MODULE
  return name.split(".")[0]


def migrate_source(data: bytes) -> Result:
  """Migrates one file's bytes (any source encoding Python accepts)."""
  try:
    encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    text = data.decode(encoding)
    tree = ast.parse(text)
  except (SyntaxError, ValueError, UnicodeDecodeError, LookupError,
          RecursionError, MemoryError) as error:
    return Result(None, [], [], _parse_error(error))
  source = _Source(text)
  migration = _Migration(tree, source)
  migration.run()
  new = source.result().decode("utf-8")
  try:
    ast.parse(new)
  except SyntaxError as error:  # a bug here: never write it
    return Result(None, [], [], f"the rewrite does not parse ({error}); "
                  "file left unchanged, please report it")
  return Result(new.encode(encoding), migration.changes, migration.notes,
                tf1=migration.tf1)


def _parse_error(error):
  if isinstance(error, SyntaxError):
    where = f" at line {error.lineno}" if error.lineno else ""
    return f"cannot parse it as Python ({error.msg}{where})"
  if isinstance(error, RecursionError):
    return "cannot parse it: nested too deeply"
  return f"cannot parse it ({type(error).__name__}: {_one_line(str(error))})"


# --- files ----------------------------------------------------------------


@dataclasses.dataclass
class Plan:
  """The files of one migrate call: (source path, output path or None,
  whether it is Python); and the usage problems found before any write."""
  files: List[Tuple[str, Optional[str], bool]]
  skipped: List[Tuple[str, str]]


class UsageError(Exception):
  """A bad command line: one line, exit 2, nothing written."""


def plan(paths, output=None, in_place=False):
  """Which files to read and where each goes. Raises UsageError."""
  if output is not None and in_place:
    raise UsageError("give --output DIR or --in-place, not both.")
  files, skipped, targets = [], [], {}
  for path in paths:
    if os.path.islink(path):
      raise UsageError(f"{path} is a symbolic link; give the file or "
                       "directory it points to.")
    if os.path.isdir(path):
      root = os.path.abspath(path)
      if output is not None:
        out = os.path.abspath(output)
        if out == root or out.startswith(root + os.sep):
          raise UsageError(f"--output {output} lies inside {path}; choose "
                           "a directory outside the tree being migrated.")
      for directory, subdirs, names in os.walk(path, followlinks=False):
        subdirs[:] = sorted(d for d in subdirs if not d.startswith("."))
        for name in sorted(names):
          full = os.path.join(directory, name)
          relative = os.path.relpath(full, path)
          is_python = name.endswith(".py")
          if os.path.islink(full):
            skipped.append((full, "a symbolic link: not followed"))
            continue
          if not is_python and output is None:
            continue
          destination = (None if output is None else
                         os.path.join(output, relative))
          files.append((full, destination, is_python))
    elif os.path.isfile(path):
      destination = (None if output is None else
                     os.path.join(output, os.path.basename(path)))
      files.append((path, destination, True))
    else:
      raise UsageError(f"{path} does not exist (or is not a regular file "
                       "or directory).")
  for source, destination, _ in files:
    if destination is None:
      continue
    key = os.path.abspath(destination)
    if key in targets:
      raise UsageError(f"{source} and {targets[key]} would both be written "
                       f"to {destination}; migrate them in separate calls.")
    targets[key] = source
  return Plan(files, skipped)


def read_source(path):
  """A regular file's bytes, at most MAX_FILE_BYTES, never through a link
  or from a FIFO (files.read_bytes); raises OSError or files.FileRejected
  saying why not."""
  return files_lib.read_bytes(path, MAX_FILE_BYTES)


def write_file(path, data, mode=None, replace=True):
  """Writes `data` to `path` atomically (a temporary file beside it, then
  a rename), never through a link; `mode`: the permission bits to keep."""
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  if os.path.islink(path):
    raise OSError(f"{path} is a symbolic link; not written through it")
  if not replace and os.path.lexists(path):
    raise OSError(f"{path} exists; give --force to replace it")
  if mode is None:
    files_lib.write_atomic(path, data)
  else:
    files_lib.write_atomic(path, data, stat.S_IMODE(mode),
                           exact_mode=True)


def run(paths, output=None, in_place=False, force=False, out=None):
  """The command: migrates, writes as asked, prints the report to `out`;
  returns the exit code (0, or 2 when a file was refused)."""
  import sys
  out = out or sys.stdout
  work = plan(paths, output, in_place)
  counts = {"files": 0, "changed": 0, "lines": 0, "notes": 0, "refused": 0,
            "tf1": 0}
  for path, reason in work.skipped:
    print(f"{path}: skipped: {reason}", file=out)
  for path, destination, is_python in work.files:
    try:
      data = read_source(path)
      mode = os.stat(path).st_mode
    except (OSError, files_lib.FileRejected) as error:
      counts["refused"] += 1
      print(f"{path}: refused: cannot read it ({_os_error(error)})",
            file=out)
      continue
    if not is_python:
      if not _write(destination, data, mode, force, out, path):
        counts["refused"] += 1
      continue
    counts["files"] += 1
    result = migrate_source(data)
    if result.error:
      counts["refused"] += 1
      print(f"{path}: refused: {result.error}", file=out)
      continue
    _report(path, result, counts, out)
    if destination is not None:
      if not _write(destination, result.source, mode, force, out, path):
        counts["refused"] += 1
    elif in_place and result.changes:
      try:
        write_file(path, result.source, mode)
      except OSError as error:
        counts["refused"] += 1
        print(f"{path}: refused: cannot write it ({_os_error(error)})",
              file=out)
  where = ("written under " + output if output else
           "rewritten in place" if in_place else
           "nothing written (give --output DIR or --in-place)")
  upgrade = (f", {counts['tf1']} need TF's tf_upgrade_v2 first (TF 1.x "
             "code)" if counts["tf1"] else "")
  print(f"migrate: {counts['files']} Python files, {counts['changed']} "
        f"changed ({counts['lines']} changes), {counts['notes']} names left "
        f"alone, {counts['refused']} refused{upgrade}; {where}.", file=out)
  return 2 if counts["refused"] else 0


def _report(path, result, counts, out):
  """Prints one migrated file's changes, what it left alone and its TF 1.x
  line to `out`, and adds them to `counts`."""
  for change in result.changes:
    old = change.old or "(new line)"
    print(f"{path}:{change.line}: {old} → {change.new}", file=out)
  for note in result.notes:
    print(f"{path}:{note.line}: left alone: {note.name}: {note.why}",
          file=out)
  counts["notes"] += len(result.notes)
  if result.tf1:
    counts["tf1"] += 1
    print(f"{path}: {_tf1_words(result.tf1)}", file=out)
  if result.changes:
    counts["changed"] += 1
    counts["lines"] += len(result.changes)


_TF1_SHOWN = 6  # TF 1.x names named in a file's line


def _tf1_words(tf1):
  """The report's line for a file of TF 1.x code."""
  names = sorted(tf1, key=lambda name: (tf1[name], name))
  shown = ", ".join(f"{name} (line {tf1[name]})"
                    for name in names[:_TF1_SHOWN])
  more = (f" and {len(names) - _TF1_SHOWN} more"
          if len(names) > _TF1_SHOWN else "")
  return (f"TF 1.x code ({shown}{more} exist only in TF 1.x): run TF's "
          "`tf_upgrade_v2 --intree DIR --outtree NEW_DIR` (`--infile`/"
          "`--outfile` for one file; TF installs it) first, then migrate "
          "its output (docs/migration.md, 'TF 1.x code').")


def _write(destination, data, mode, force, out, source):
  """Writes one output file; False (and a line) when it cannot."""
  try:
    write_file(destination, data, mode, replace=force)
  except OSError as error:
    print(f"{source}: refused: cannot write {destination} "
          f"({_os_error(error)})", file=out)
    return False
  return True


def _os_error(error):
  return (getattr(error, "strerror", None) or _one_line(str(error)))
