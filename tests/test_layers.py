"""The layer contract of docs/architecture.md ('The rules the layers keep'),
checked on the source: every import of every module of `estimator_spec` and
`tpu_embedding_columns`, at the top of a module or inside a function
(`importlib.import_module` with a literal name included), goes down the
layer order or to a utility; and no module reaches a private name (leading
underscore) of another package.

Each violation is printed as
`file:line imports X (layer A may not import layer B)`.
"""
import ast
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ("tpu_embedding_columns", "estimator_spec")

# Lowest first; a module may import its own layer and the layers before it.
# `interop` and `mid_level` are peers at the top of the library: mid_level
# may import interop (TF2's configuration objects are converted by
# `interop.from_mid_level`), interop never imports mid_level.
LAYERS = (
    ("columns", ("tpu_embedding_columns",)),
    ("config", ("estimator_spec.config",)),
    ("engine", ("estimator_spec.engine",)),
    ("profiling", ("estimator_spec.profiling",)),
    ("tpu", ("estimator_spec.tpu",)),
    ("checkpoints", ("estimator_spec.checkpoints",)),
    ("cluster", ("estimator_spec.cluster",)),
    ("estimator", ("estimator_spec.estimator",)),
    ("interop", ("estimator_spec.interop",)),
    ("mid_level", ("estimator_spec.mid_level",)),
    ("top", ("estimator_spec.__main__", "estimator_spec.__init__",
             "estimator_spec.experimental", "estimator_spec.migrate")),
)
# Modules every layer of estimator_spec may import; they import no layer of
# estimator_spec (only each other, the columns and third-party code).
# `tf215` says whether TF 2.15's Estimator stack is there; `tf_import`
# imports TensorFlow without its GPU build's import notices;
# `tensor_types` names the TF values in signatures; `tpu_runner`
# holds what the package connects for a TPU run; `tf_names` and
# `tf1_names` are plain data; `_version` is private by packaging custom only.
UTILITIES = ("estimator_spec.files", "estimator_spec.quiet",
             "estimator_spec.errors", "estimator_spec._version",
             "estimator_spec.tf_names", "estimator_spec.tf1_names",
             "estimator_spec.tf_patches",
             "estimator_spec.tf215", "estimator_spec.tpu_runner",
             "estimator_spec.tf_import", "estimator_spec.tensor_types")
# The imports up the order the library keeps on purpose, with the reason;
# each must still exist (a stale entry fails the test).
ALLOWED = {
    # TF keeps the optimization-parameter classes beside its TPU columns
    # (`tf.compat.v1.tpu.experimental.AdagradParameters`); the columns
    # package offers them the same way, loaded on first attribute use
    # (docs/migration.md), never while the package loads.
    ("tpu_embedding_columns/__init__.py", "estimator_spec.config.optimizers"),
}


def _is_private(name):
  return name.startswith("_") and not name.startswith("__")


def _module_of(path):
  """The dotted name of the module at `path` (relative to REPO)."""
  parts = list(path.with_suffix("").parts)
  return ".".join(parts)


def _source_files():
  for package in PACKAGES:
    for path in sorted((REPO / package).rglob("*.py")):
      yield path.relative_to(REPO)


def _layer_of(module):
  """(index, name) of the layer holding `module`, "utility", or None for a
  module outside both packages."""
  if module.split(".")[0] not in PACKAGES:
    return None
  if module == "estimator_spec":
    return len(LAYERS) - 1, "top"
  for utility in UTILITIES:
    if module == utility or module.startswith(utility + "."):
      return "utility"
  for index, (name, prefixes) in enumerate(LAYERS):
    for prefix in prefixes:
      if module == prefix or module.startswith(prefix + "."):
        return index, name
  raise AssertionError(
      f"module {module} is in no layer of tests/test_layers.py; give it one "
      "(and docs/architecture.md a row)")


def _package_of(module):
  """The package whose private names a module may use: a layer's folder
  (`estimator_spec.engine`), or `estimator_spec` for its top-level modules."""
  parts = module.split(".")
  if parts[0] == "tpu_embedding_columns":
    return "tpu_embedding_columns"
  if len(parts) > 2 or (len(parts) == 2 and
                        (REPO / "estimator_spec" / parts[1]).is_dir()):
    return ".".join(parts[:2])
  return "estimator_spec"


def _resolve(module, level, name):
  """The absolute module of a relative import in `module`."""
  if not level:
    return name
  base = module.split(".")[:-1]  # the package of a module or __init__
  base = base[:len(base) - (level - 1)]
  return ".".join(base + ([name] if name else []))


def _imports(path):
  """The imports of the file at `path`, `(line, module, name taken from it
  or None)`, and its reaches of private attributes of modules of both
  packages through the names it binds to them, `(line, module, attribute)`
  (`interop._mid_level._build`; an attribute of a class is not followed)."""
  module = _module_of(path)
  tree = ast.parse((REPO / path).read_text(), str(path))
  found = []
  bound = {}  # local name -> module it is bound to
  computed = False
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      for alias in node.names:
        found.append((node.lineno, alias.name, None))
        if alias.asname:
          bound[alias.asname] = alias.name
        else:
          bound[alias.name.split(".")[0]] = alias.name.split(".")[0]
    elif isinstance(node, ast.ImportFrom):
      source = _resolve(module, node.level, node.module or "")
      for alias in node.names:
        found.append((node.lineno, source, alias.name))
        # `from package import module` binds a module; `from module import
        # name` a name, whose attributes are its own business.
        candidate = f"{source}.{alias.name}"
        if _is_module(candidate):
          bound[alias.asname or alias.name] = candidate
    elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
          and node.func.attr == "import_module" and node.args):
      if (isinstance(node.args[0], ast.Constant) and
          isinstance(node.args[0].value, str)):
        found.append((node.lineno, node.args[0].value, None))
      else:
        computed = True
  if computed:
    # A module that imports by a computed name (a table of lazily loaded
    # names): each module name it spells out counts as imported.
    found.extend(
        (node.lineno, node.value, None) for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        and _is_module(node.value))
  reaches = set()
  for node in ast.walk(tree):
    chain = _chain(node)
    if chain is None or chain[0] not in bound:
      continue
    target = bound[chain[0]]
    for attribute in chain[1:]:
      if _is_private(attribute):
        reaches.add((node.lineno, target, attribute))
        break
      if not _is_module(f"{target}.{attribute}"):
        break
      target = f"{target}.{attribute}"
  return found, sorted(reaches)


def _chain(node):
  """[name, attribute, ...] of `name.attribute...`, or None."""
  parts = []
  while isinstance(node, ast.Attribute):
    parts.append(node.attr)
    node = node.value
  if not isinstance(node, ast.Name) or not parts:
    return None
  return [node.id] + parts[::-1]


def _is_module(name):
  parts = name.split(".")
  if parts[0] not in PACKAGES or not all(p.isidentifier() for p in parts):
    return False
  base = REPO.joinpath(*parts)
  return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _layer_label(layer):
  return "utility" if layer == "utility" else layer[1]


def _violations():
  layer_violations = []
  private_violations = []
  for path in _source_files():
    module = _module_of(path)
    own = _layer_of(module)
    package = _package_of(module)
    found, reaches = _imports(path)
    for line, imported, name in found:
      target = imported
      if name is not None and _is_module(f"{imported}.{name}"):
        target = f"{imported}.{name}"
      layer = _layer_of(target)
      if layer is not None and not _allowed(path, own, layer, target):
        layer_violations.append(
            f"{path}:{line} imports {target} (layer {_layer_label(own)} may "
            f"not import layer {_layer_label(layer)})")
      if target.split(".")[0] in PACKAGES and _package_of(target) != package:
        private = [part for part in target.split(".") if _is_private(part)]
        if name is not None and _is_private(name):
          private.append(name)
        if private and target != "estimator_spec._version":
          private_violations.append(
              f"{path}:{line} imports {target}"
              f"{'' if name is None or target.endswith(name) else '.' + name}"
              f" (private name {private[-1]} of package "
              f"{_package_of(target)})")
    for line, target, attribute in reaches:
      if target.split(".")[0] in PACKAGES and _package_of(target) != package:
        private_violations.append(
            f"{path}:{line} reaches {target}.{attribute} (private name "
            f"{attribute} of package {_package_of(target)})")
  return layer_violations, private_violations


def _allowed(path, own, layer, target):
  if (str(path), target) in ALLOWED:
    return True
  if own == "utility":
    # Utilities import each other and the columns (below every layer of
    # estimator_spec), never a layer of estimator_spec.
    return layer == "utility" or layer[1] == "columns"
  if layer == "utility":
    return own[1] != "columns"
  return layer[0] <= own[0]


def test_every_layer_names_a_module_that_exists():
  for name, prefixes in LAYERS:
    for prefix in prefixes:
      assert _is_module(prefix), (
          f"layer {name} names {prefix}, which does not exist; "
          "tests/test_layers.py must follow the folders")
  for utility in UTILITIES:
    assert _is_module(utility), f"utility {utility} does not exist"


def test_every_module_is_in_a_layer():
  for path in _source_files():
    assert _layer_of(_module_of(path)) is not None


def test_each_allowed_exception_still_exists():
  found = set()
  for path in _source_files():
    for _, imported, name in _imports(path)[0]:
      found.add((str(path), imported))
      if name is not None:
        found.add((str(path), f"{imported}.{name}"))
  assert ALLOWED <= found, ALLOWED - found


def test_a_lower_layer_never_imports_a_higher_one():
  violations, _ = _violations()
  print("\n".join(violations))
  assert not violations, (
      f"{len(violations)} imports against the layer order "
      "(docs/architecture.md, 'The rules the layers keep'):\n" +
      "\n".join(violations))


def test_no_module_reaches_a_private_name_of_another_package():
  _, violations = _violations()
  print("\n".join(violations))
  assert not violations, (
      f"{len(violations)} reaches of private names across packages "
      "(promote what is shared):\n" + "\n".join(violations))


def test_the_config_model_imports_no_tensorflow():
  # Plain data (docs/architecture.md, 'Who owns what'): TF reaches the
  # config model only through the columns it describes.
  found = [
      f"{path}:{line} imports {module}" for path in _source_files()
      if _module_of(path).startswith("estimator_spec.config.")
      for line, module, _ in _imports(path)[0]
      if module.split(".")[0] in ("tensorflow", "tensorflow_estimator", "keras")
  ]
  assert not found, found


# --- The checker itself -----------------------------------------------------

@pytest.fixture
def scratch(tmp_path, monkeypatch):
  """A copy of the layer folders' names under tmp_path, with the files a
  case writes, checked as the repository would be."""
  for package in PACKAGES:
    (tmp_path / package).mkdir()
    (tmp_path / package / "__init__.py").write_text("")
  for _, prefixes in LAYERS:
    for prefix in prefixes:
      parts = prefix.split(".")
      if len(parts) == 2 and not parts[1].startswith("__"):
        folder = tmp_path.joinpath(*parts)
        if (REPO.joinpath(*parts)).is_dir():
          folder.mkdir(exist_ok=True)
          (folder / "__init__.py").write_text("")
        else:
          folder.with_suffix(".py").write_text("")
  monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)

  def write(relative, text):
    path = tmp_path / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
  return write


def test_the_checker_finds_an_upward_import_inside_a_function(scratch):
  scratch("estimator_spec/engine/low.py",
          "def f():\n  from estimator_spec.estimator import x\n")
  violations, _ = _violations()
  assert violations == [
      "estimator_spec/engine/low.py:2 imports "
      "estimator_spec.estimator (layer engine may not import layer "
      "estimator)"
  ]


def test_the_checker_finds_private_reaches(scratch):
  scratch("estimator_spec/engine/_hidden.py", "")
  scratch("estimator_spec/estimator/user.py",
          "from estimator_spec import engine\n"
          "from estimator_spec.engine import _hidden\n"
          "engine._secret()\n")
  scratch("estimator_spec/estimator/_own.py", "")
  scratch("estimator_spec/estimator/same.py",
          "from estimator_spec.estimator import _own\n")
  _, private = _violations()
  user = "estimator_spec/estimator/user.py"
  assert private == [
      f"{user}:2 imports estimator_spec.engine._hidden (private name "
      "_hidden of package estimator_spec.engine)",
      f"{user}:3 reaches estimator_spec.engine._secret (private name "
      "_secret of package estimator_spec.engine)",
  ]


def test_the_checker_reads_the_tables_of_lazy_imports(scratch):
  scratch("estimator_spec/engine/lazy.py",
          "import importlib\n"
          "_MODULES = {'a': 'estimator_spec.config',\n"
          "            'b': 'estimator_spec.estimator'}\n"
          "def load(name):\n"
          "  return importlib.import_module(_MODULES[name])\n")
  violations, _ = _violations()
  assert violations == [
      "estimator_spec/engine/lazy.py:3 imports estimator_spec.estimator "
      "(layer engine may not import layer estimator)"
  ]


def test_a_layer_naming_a_missing_folder_fails(monkeypatch):
  monkeypatch.setattr(sys.modules[__name__], "LAYERS",
                      LAYERS + (("gone", ("estimator_spec.gone",)),))
  with pytest.raises(AssertionError, match="layer gone names "
                     "estimator_spec.gone, which does not exist"):
    test_every_layer_names_a_module_that_exists()


def test_utilities_import_no_layer(scratch):
  scratch("estimator_spec/files.py", "from estimator_spec.config import x\n")
  scratch("tpu_embedding_columns/api.py", "import estimator_spec.files\n")
  violations, _ = _violations()
  assert violations == [
      "tpu_embedding_columns/api.py:1 imports estimator_spec.files (layer "
      "columns may not import layer utility)",
      "estimator_spec/files.py:1 imports estimator_spec.config (layer "
      "utility may not import layer config)",
  ]
