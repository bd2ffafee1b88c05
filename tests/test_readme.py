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
"""
import os
import pathlib
import re
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
CONTINUES = "<!-- continues -->"
SETUP = re.compile(r"<!-- setup: (\S+) -->$")


def documents():
  return [REPO / "README.md"] + sorted((REPO / "docs").glob("*.md"))


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


def all_programs():
  found = []
  for path in documents():
    for first, numbers, setup, source in python_programs(path):
      name = f"{path.relative_to(REPO)}:{first}"
      found.append(pytest.param(path, numbers, setup, source, id=name))
  return found


PROGRAMS = all_programs()


def test_the_documentation_has_python_blocks_and_every_one_is_collected():
  assert len(PROGRAMS) > 0
  in_files = sum(path.read_text().count("```python") for path in documents())
  collected = sum(len(p.values[1]) for p in PROGRAMS)
  assert collected == in_files
  for path in documents():  # every setup marker is read as one
    markers = path.read_text().count("<!-- setup:")
    assert markers == len([p for p in PROGRAMS if p.values[0] == path
                           and p.values[2] is not None]), path.name
  for p in PROGRAMS:
    if p.values[2] is not None:
      assert (REPO / p.values[2]).is_file(), f"{p.id}: no {p.values[2]}"
  readme = [p for p in PROGRAMS if p.values[0].name == "README.md"]
  assert readme, "README.md has a python block"


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


@pytest.mark.parametrize("path", documents(), ids=lambda p: p.name)
def test_links_stay_inside_the_repository(path):
  text = path.read_text()
  assert "../shared" not in text
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
