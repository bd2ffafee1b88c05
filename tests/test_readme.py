"""Every ```python block of README.md and docs/*.md runs.

Each block is a complete program (its imports included) and runs in a fresh
Python process, from an empty temporary directory, with this checkout on
the path. A block preceded by the line

    <!-- continues -->

(blank lines between are allowed) continues the previous ```python block of
the same file: the two run together, as one program. A block preceded by

    <!-- setup: tests/doc_setups/NAME.py -->

is a fragment of the reader's program: it uses names the page says the
reader has (their `model_fn`, `spec`, a trained `estimator`, ...) or reads
directories they have (a checkpoint in "runs/cpu_model"). It runs after
that setup file, in the same process, directory and globals: the setup
defines those names with a small model and writes those directories. A
block that continues one with a setup runs after the same setup (one
program); it cannot name another. No block is skipped: a block (or its
setup) that raises fails its test, named by file and line.

The README's `describe` shell commands run too (with this interpreter for
`.venv/bin/python`). Documentation links stay inside the repository.

Which pages run where. With TF 2.15 (.venv/) every page's blocks run. On
current TensorFlow (.venv-tf2/, where tests/tf2_tests.txt lists this file
in both of its sessions) only the blocks of the pages marked, on a line of
their own before their first ```python block, run: in the Keras 3 session
the pages marked

    <!-- runs on current TensorFlow too -->

(programs that need only current TensorFlow: no estimator, no TF
2.15-only module), in the Keras 2 session (`TF_USE_LEGACY_KERAS=1`) the
pages marked

    <!-- runs on current TensorFlow with Keras 2 too -->

(TPUEstimator programs that take every estimator name from
`estimator_spec`, docs/estimator.md 'Two stacks'). The other pages' blocks
are not collected there at all (they run with TF 2.15), so none is
counted as passed without running. The link checks, the collection checks
and the `describe` commands (which need no TF 2.15) run in every session.
"""
import os
import pathlib
import re
import subprocess
import sys

import pytest
import tensorflow as tf

REPO = pathlib.Path(__file__).resolve().parent.parent
CONTINUES = "<!-- continues -->"
SETUP = re.compile(r"<!-- setup: (\S+) -->$")
CURRENT_TF = "<!-- runs on current TensorFlow too -->"
CURRENT_TF_KERAS_2 = "<!-- runs on current TensorFlow with Keras 2 too -->"
# As tests/conftest.py decides it: TF 2.15 runs everything.
ON_TF215 = tf.__version__.startswith("2.15.")
KERAS_2 = os.environ.get("TF_USE_LEGACY_KERAS", "").lower() in ("1", "true")


def documents():
  return [REPO / "README.md"] + sorted((REPO / "docs").glob("*.md"))


def runs_on_current_tf(path, marker=CURRENT_TF):
  """Whether a page is marked as running on current TensorFlow (with Keras 2
  when `marker` is CURRENT_TF_KERAS_2): the marker on a line of its own,
  before the page's first ```python block."""
  for line in path.read_text().splitlines():
    if line.strip() == "```python":
      return False
    if line.strip() == marker:
      return True
  return False


def documents_run_here():
  """The pages whose blocks this environment runs."""
  marker = CURRENT_TF_KERAS_2 if KERAS_2 else CURRENT_TF
  return [path for path in documents()
          if ON_TF215 or runs_on_current_tf(path, marker)]


def python_programs(path):
  """[(first line, [block lines], setup or None, source)] of a Markdown
  file's programs; `setup` is a path relative to the repository."""
  programs = []
  lines = path.read_text().splitlines()
  i = 0
  while i < len(lines):
    if lines[i].strip() == "```python":
      start = i + 1
      end = start
      while lines[end].strip() != "```":
        end += 1
      source = "\n".join(lines[start:end]) + "\n"
      before = [l.strip() for l in lines[:i] if l.strip()]
      marker = before[-1] if before else ""
      setup = SETUP.match(marker)
      if marker == CONTINUES:
        assert programs, f"{path.name}:{i + 1}: {CONTINUES} with no block before"
        first, numbers, setup, previous = programs[-1]
        programs[-1] = (first, numbers + [start], setup, previous + source)
      else:
        programs.append((start, [start], setup and setup.group(1), source))
      i = end
    i += 1
  return programs


def with_setup(setup, source):
  """The program that runs `setup` (a repository path), then `source`."""
  if setup is None:
    return source
  path = str(REPO / setup)
  return (f"exec(compile(open({path!r}).read(), {path!r}, 'exec'))\n" +
          source)


def all_programs(paths):
  found = []
  for path in paths:
    for first, numbers, setup, source in python_programs(path):
      name = f"{path.relative_to(REPO)}:{first}"
      found.append(pytest.param(path, numbers, setup, source, id=name))
  return found


PROGRAMS = all_programs(documents_run_here())


def test_the_documentation_has_python_blocks_and_every_one_is_collected():
  assert len(PROGRAMS) > 0
  here = documents_run_here()
  in_files = sum(path.read_text().count("```python") for path in here)
  collected = sum(len(p.values[1]) for p in PROGRAMS)
  assert collected == in_files
  assert {p.values[0] for p in PROGRAMS} == {
      path for path in here if "```python" in path.read_text()}
  for path in here:  # every setup marker is read as one
    markers = path.read_text().count("<!-- setup:")
    assert markers == len([p for p in PROGRAMS if p.values[0] == path
                           and p.values[2] is not None]), path.name
  for p in PROGRAMS:
    if p.values[2] is not None:
      assert (REPO / p.values[2]).is_file(), f"{p.id}: no {p.values[2]}"
  everywhere = all_programs(documents())
  readme = [p for p in everywhere if p.values[0].name == "README.md"]
  assert readme, "README.md has a python block"


def test_pages_marked_for_current_tensorflow():
  marked = [path for path in documents() if runs_on_current_tf(path)]
  assert marked, f"no page is marked {CURRENT_TF}"
  for path in documents():
    text = path.read_text()
    # A marker after the first block would be ignored: refuse it.
    assert text.count(CURRENT_TF) == int(path in marked), path.name
  for path in marked:
    programs = python_programs(path)
    assert programs, f"{path.name} is marked but has no python block"
    for first, _, setup, source in programs:
      # What needs TF 2.15 (tensorflow-estimator) has no place there.
      assert setup is None, f"{path.name}:{first}: a setup on a marked page"
      for needs_tf215 in ("tensorflow_estimator", "tf.estimator",
                          "compat.v1.estimator", "TPUEstimator"):
        assert needs_tf215 not in source, f"{path.name}:{first}: {needs_tf215}"
  keras_2 = [path for path in documents()
             if runs_on_current_tf(path, CURRENT_TF_KERAS_2)]
  assert (REPO / "README.md") in keras_2
  for path in keras_2:
    text = path.read_text()
    assert text.count(CURRENT_TF_KERAS_2) == 1, path.name
    assert python_programs(path), f"{path.name} is marked but has no block"
  if not ON_TF215:
    assert sorted(documents_run_here()) == sorted(
        keras_2 if KERAS_2 else marked)
  else:
    assert documents_run_here() == documents()


def test_the_current_tensorflow_marker_counts_only_before_the_first_block(
    tmp_path):
  page = tmp_path / "page.md"
  page.write_text(f"# Title\n\n{CURRENT_TF}\n\n```python\na = 1\n```\n")
  assert runs_on_current_tf(page)
  page.write_text(f"# Title\n\n```python\na = 1\n```\n{CURRENT_TF}\n")
  assert not runs_on_current_tf(page)
  page.write_text("# Title\n\n```python\na = 1\n```\n")
  assert not runs_on_current_tf(page)


def test_setup_markers_name_the_setup_of_a_block_and_its_continuations(
    tmp_path):
  page = tmp_path / "page.md"
  page.write_text("\n".join([
      "Plain:", "```python", "a = 1", "```",
      "<!-- setup: tests/doc_setups/x.py -->", "", "```python", "b = 2",
      "```", "<!-- continues -->", "```python", "c = 3", "```",
  ]) + "\n")
  assert python_programs(page) == [
      (2, [2], None, "a = 1\n"),
      (7, [7, 11], "tests/doc_setups/x.py", "b = 2\nc = 3\n"),
  ]
  setup = tmp_path / "setup.py"
  setup.write_text("reader_name = 41\n")
  namespace = {}
  exec(with_setup(setup, "result = reader_name + 1\n"), namespace)
  assert namespace["result"] == 42


@pytest.mark.slow
@pytest.mark.parametrize("path,lines,setup,source", PROGRAMS)
def test_block_runs(path, lines, setup, source, tmp_path):
  env = dict(os.environ)
  env["PYTHONPATH"] = os.pathsep.join(
      [str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                     if p])
  env["TF_CPP_MIN_LOG_LEVEL"] = "2"
  result = subprocess.run([sys.executable, "-c", with_setup(setup, source)],
                          cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=900)
  where = ", ".join(f"{path.relative_to(REPO)}:{n}" for n in lines)
  if setup is not None:
    where += f" (after {setup})"
  assert result.returncode == 0, (
      f"the block at {where} failed:\n{result.stderr[-4000:]}")


LINK = re.compile(r"\]\(([^)\s]+)\)")
# The team's own folder beside the repository, which users do not have:
# no document may point there.
PRIVATE_FOLDER = "/".join(["..", "shared"])


@pytest.mark.parametrize("path", documents(), ids=lambda p: p.name)
def test_links_stay_inside_the_repository(path):
  text = path.read_text()
  assert PRIVATE_FOLDER not in text
  for target in LINK.findall(text):
    assert "://" not in target, f"{path.name}: link outside: {target}"
    file_part = target.split("#")[0]
    if not file_part:
      continue
    resolved = (path.parent / file_part).resolve()
    assert REPO in resolved.parents or resolved == REPO, (
        f"{path.name}: {target} leaves the repository")
    assert resolved.exists(), (
        f"{path.name}: {target} does not exist")


def describe_commands():
  """The `describe` commands of README.md's shell blocks (cheap to run)."""
  commands, block, inside = [], [], None
  for line in (REPO / "README.md").read_text().splitlines():
    if line.startswith("```"):
      if inside is None:
        inside, block = line[3:].strip(), []
        continue
      command = " ".join(l.rstrip("\\") for l in block)
      if inside == "" and command.startswith(
          ".venv/bin/python -m estimator_spec describe"):
        commands.append(command.split()[1:])
      inside = None
    elif inside is not None:
      block.append(line)
  return commands


@pytest.mark.parametrize("arguments", describe_commands())
def test_readme_describe_command_runs(arguments):
  env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2")
  result = subprocess.run([sys.executable, *arguments], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-4000:]
  assert "tbl_" in result.stdout


def test_readme_has_a_describe_command():
  assert describe_commands()
