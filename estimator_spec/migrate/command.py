"""The phases in order: `migrate_source` takes one file's bytes through
read, names, edits and imports to a `Result`; `run`, the command, takes
each file of the plan through it, prints the report and writes."""
import ast
import os
import sys

from estimator_spec import files as files_lib
from estimator_spec.migrate import edits as edits_lib
from estimator_spec.migrate import imports
from estimator_spec.migrate import read
from estimator_spec.migrate import report
from estimator_spec.migrate import write
from estimator_spec.migrate.names import Names
from estimator_spec.migrate.report import Result


def migrate_source(data: bytes) -> Result:
  """Migrates one file's bytes (any source encoding Python accepts)."""
  try:
    encoding, text, tree = read.parse(data)
  except read.NotPython as error:
    return Result(None, [], [], str(error))
  names = Names(tree)
  edits = edits_lib.Edits(read.Source(text))
  edits_lib.module_aliases(names, edits)
  edits_lib.rewrite_uses(names, edits)
  imports.rewrite_imports(names, edits)
  imports.add_imports(names, edits)
  edits_lib.note_ambiguous(names, edits)
  edits.sort()
  new = edits.source.result().decode("utf-8")
  try:
    ast.parse(new)
  except SyntaxError as error:  # a bug here: never write it
    return Result(None, [], [], f"the rewrite does not parse ({error}); "
                  "file left unchanged, please report it")
  return Result(new.encode(encoding), edits.changes, edits.notes,
                tf1=edits.tf1)


def run(paths, output=None, in_place=False, force=False, out=None):
  """The command: migrates, writes as asked, prints the report to `out`;
  returns the exit code (0, or 2 when a file was refused)."""
  out = out or sys.stdout
  work = write.plan(paths, output, in_place)
  counts = report.Counts()
  for path, why in work.skipped:
    report.print_skipped(path, why, out)
  for entry in work.files:
    if not _one_file(entry, in_place, force, counts, out):
      counts.refused += 1
  report.print_summary(counts, output, in_place, out)
  return 2 if counts.refused else 0


def _one_file(entry, in_place, force, counts, out):
  """Reads, migrates (a Python file), reports and writes one file of the
  plan, `entry`: (path, output path or None, whether it is Python); False
  when it was refused."""
  path, destination, is_python = entry
  try:
    data = read.read_source(path)
    mode = os.stat(path).st_mode
  except (OSError, files_lib.FileRejected) as error:
    report.print_refused(path, f"cannot read it ({report.reason(error)})", out)
    return False
  if is_python:  # (another file is only copied, to --output)
    counts.files += 1
    result = migrate_source(data)
    if result.error:
      report.print_refused(path, result.error, out)
      return False
    report.print_file(path, result, counts, out)
    data = result.source
    if destination is None and not (in_place and result.changes):
      return True  # the report alone, or nothing to rewrite in place
  refusal = write.write_output(path, destination, data, mode, force)
  if refusal is not None:
    report.print_refused(path, refusal, out)
  return refusal is None
