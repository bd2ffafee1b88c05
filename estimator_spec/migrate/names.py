"""Find the names: which module or object each name of a file's imports
binds (`Binding`), which of them are TF's, and every read of them in the
file (`tensorflow.compat.v1 as tf` ... `tf.estimator.tpu.RunConfig`),
less the reads a function's own variable of the same name hides. Facts
of the file only: what they become is the plan's (edits.py, imports.py).
"""
import ast
from typing import Dict, List, Set

TF_ROOTS = ("tensorflow", "tensorflow_estimator")


def is_tf(path):
  """Whether a full dotted name lies in TF's (or tensorflow-estimator's)
  package."""
  return path.split(".")[0] in TF_ROOTS


class Binding:
  """A name a file's imports bind to a module or object."""

  def __init__(self, name, path, statement, alias):
    self.name = name
    self.path = path
    self.statement = statement         # the first import binding it
    self.aliases = [(statement, alias)]  # every import binding it
    self.uses = []          # (chain node, its parts) rooted at this name
    self.bare_uses = 0      # uses of the name alone (not `name.attr`)


class Names:
  """The names one file's imports bind, each with its uses; `ambiguous`:
  the names its imports bind to more than one module (left alone)."""

  def __init__(self, tree):
    self.tree = tree
    self.bindings: Dict[str, Binding] = {}
    self.ambiguous: Set[str] = set()
    self._collect_bindings()
    self._collect_uses()

  def _collect_bindings(self):
    for _, statement in sorted(statements(self.tree),
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
      self.bindings[name] = Binding(name, path, statement, alias)
    elif known.path != path:
      self.ambiguous.add(name)
    else:
      known.aliases.append((statement, alias))

  def _collect_uses(self):
    for node, local in walk_loads(self.tree):
      parts = chain(node)
      binding = self.tf_binding(parts[0])
      if binding is None or parts[0] in local:
        continue  # not a TF name, or a function's own variable there
      if len(parts) == 1:
        binding.bare_uses += 1
      else:
        binding.uses.append((node, parts))

  def tf_binding(self, name):
    """The binding of `name` to a TF module or object, or None (none, not
    TF's, or ambiguous)."""
    binding = self.bindings.get(name)
    if binding is None or name in self.ambiguous or not is_tf(
        binding.path):
      return None
    return binding

  def binding_of(self, statement, alias):
    """The binding an alias of an import statement made, or None when a
    later import took its name (or made it ambiguous)."""
    name = (alias.asname or alias.name if isinstance(statement,
                                                     ast.ImportFrom) else
            alias.asname or alias.name.split(".")[0])
    binding = self.bindings.get(name)
    if binding is None or name in self.ambiguous or not any(
        known is alias for _, known in binding.aliases):
      return None
    return binding

  def import_statements(self):
    """Each import statement that binds a name, once, in binding order."""
    found = {}
    for binding in self.bindings.values():
      for statement, _ in binding.aliases:
        found.setdefault(id(statement), statement)
    return list(found.values())

  def alias_of(self, path):
    """The first name the file binds to the module `path` alone, or
    None."""
    for name, binding in self.bindings.items():
      if name not in self.ambiguous and binding.path == path:
        return name
    return None

  def imports(self, module):
    """Whether the file already imports `module` as itself."""
    top = module.split(".")[0]
    binding = self.bindings.get(top)
    if binding is None or binding.path != top or top in self.ambiguous:
      return False
    return module == top or module in plain_imports(self.tree)


def chain(node):
  """['tf', 'estimator', 'tpu', 'RunConfig'] of an attribute chain over a
  name, or None."""
  parts: List[str] = []
  while isinstance(node, ast.Attribute):
    parts.append(node.attr)
    node = node.value
  if isinstance(node, ast.Name):
    parts.append(node.id)
    return parts[::-1]
  return None


def statements(tree):
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


def walk_loads(tree):
  """(node, the names local there) of the outermost attribute chains and
  names read in `tree` (a chain's inner parts are not listed again). A
  function's own variables hide the file's imports of the same names in
  its body (`estimator` the module, `estimator` the TPUEstimator)."""
  stack = [(tree, frozenset())]
  while stack:
    node, local = stack.pop()
    if isinstance(node, (ast.Attribute, ast.Name)) and chain(node):
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


def plain_imports(tree):
  """The modules `tree` imports as `import a.b` (no `as`)."""
  return {alias.name for _, statement in statements(tree)
          if isinstance(statement, ast.Import)
          for alias in statement.names if not alias.asname}
