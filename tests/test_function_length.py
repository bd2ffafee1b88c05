"""Library functions stay under 60 lines (docs/architecture.md, 'The rules
the layers keep'): every function and method of `estimator_spec` and
`tpu_embedding_columns`, nested ones included, from its `def` (or first
decorator) to its last line, docstring included.

A function that grows past the limit is split by job, not listed here: the
test has no list of exceptions."""
import ast
import pathlib

REPO = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ("estimator_spec", "tpu_embedding_columns")
LIMIT = 60


def _functions(path):
  tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
  for node in ast.walk(tree):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      first = min([node.lineno] + [d.lineno for d in node.decorator_list])
      yield node.name, first, node.end_lineno - first + 1


def long_functions(root=REPO):
  """['path:line name (N lines)'] of every function of LIMIT lines or more."""
  found = []
  for package in PACKAGES:
    for path in sorted((root / package).rglob("*.py")):
      for name, line, length in _functions(path):
        if length >= LIMIT:
          found.append(f"{path.relative_to(root)}:{line} {name} "
                       f"({length} lines)")
  return found


def test_library_functions_are_under_60_lines():
  assert long_functions() == []


def test_the_count_sees_a_long_function(tmp_path):
  package = tmp_path / "estimator_spec"
  package.mkdir()
  body = "\n".join(f"  x{i} = {i}" for i in range(LIMIT - 2))
  (package / "short.py").write_text(f"def short():\n{body}\n")
  (package / "long.py").write_text(
      f"@staticmethod\ndef long():\n{body}\n  return 0\n")
  assert long_functions(tmp_path) == [
      f"estimator_spec/long.py:1 long ({LIMIT + 1} lines)"]
