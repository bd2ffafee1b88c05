"""Write: which files one call reads and where each goes (`plan`: a file,
or a directory's tree, to `--output DIR`, in place, or nowhere), the
usage problems found before any write (`UsageError`), and the atomic
write of each file, never through a link, replacing a file only when
asked (`--force`)."""
import dataclasses
import os
import stat
from typing import List, Optional, Tuple

from estimator_spec import files as files_lib
from estimator_spec.migrate import report


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
  files, skipped = [], []
  for path in paths:
    if os.path.islink(path):
      raise UsageError(f"{path} is a symbolic link; give the file or "
                       "directory it points to.")
    if os.path.isdir(path):
      _check_output_outside(path, output)
      _plan_tree(path, output, files, skipped)
    elif os.path.isfile(path):
      destination = (None if output is None else
                     os.path.join(output, os.path.basename(path)))
      files.append((path, destination, True))
    else:
      raise UsageError(f"{path} does not exist (or is not a regular file "
                       "or directory).")
  _check_one_source_each(files)
  return Plan(files, skipped)


def _check_output_outside(path, output):
  """Refuses an --output inside the directory `path`."""
  if output is None:
    return
  root = os.path.abspath(path)
  out = os.path.abspath(output)
  if out == root or out.startswith(root + os.sep):
    raise UsageError(f"--output {output} lies inside {path}; choose "
                     "a directory outside the tree being migrated.")


def _plan_tree(path, output, files, skipped):
  """Adds the files of the directory `path` (its Python files, and with
  --output all the others, which are copied) to `files`; its links, not
  followed, to `skipped`. Hidden folders are left out."""
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


def _check_one_source_each(files):
  """Refuses two files written to the same output."""
  targets = {}
  for source, destination, _ in files:
    if destination is None:
      continue
    key = os.path.abspath(destination)
    if key in targets:
      raise UsageError(f"{source} and {targets[key]} would both be written "
                       f"to {destination}; migrate them in separate calls.")
    targets[key] = source


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


def write_output(source, destination, data, mode, force):
  """Writes the output of the file `source`: to `destination` below
  --output (over a file there only with `force`), or over `source` itself
  when `destination` is None (in place). Returns None, or the words of
  the refusal."""
  try:
    if destination is None:
      write_file(source, data, mode)
    else:
      write_file(destination, data, mode, replace=force)
  except OSError as error:
    where = "it" if destination is None else destination
    return f"cannot write {where} ({report.reason(error)})"
  return None
