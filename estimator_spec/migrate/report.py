"""Report: what migrating a file gave (`Result`: its `Change`s, the names
it left alone as `Note`s, its TF 1.x names), and the text `migrate`
prints: a line per change and per name left alone, a file's TF 1.x line,
the files refused or skipped, and the closing count."""
import dataclasses
from typing import Dict, List, Optional


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


@dataclasses.dataclass
class Counts:
  """The closing line's numbers, over the files of one call."""
  files: int = 0
  changed: int = 0
  lines: int = 0
  notes: int = 0
  refused: int = 0
  tf1: int = 0


def one_line(text):
  """`text` with its whitespace runs (newlines too) as single spaces."""
  return " ".join(text.split())


def reason(error):
  """The words of an OSError (or files.FileRejected) for a refusal."""
  return getattr(error, "strerror", None) or one_line(str(error))


def print_refused(path, why, out):
  """The line of a file left unread, unmigrated or unwritten."""
  print(f"{path}: refused: {why}", file=out)


def print_skipped(path, why, out):
  """The line of a file of a directory that is not read."""
  print(f"{path}: skipped: {why}", file=out)


def print_file(path, result, counts, out):
  """Prints one migrated file's changes, what it left alone and its TF 1.x
  line to `out`, and adds them to `counts`."""
  for change in result.changes:
    old = change.old or "(new line)"
    print(f"{path}:{change.line}: {old} → {change.new}", file=out)
  for note in result.notes:
    print(f"{path}:{note.line}: left alone: {note.name}: {note.why}",
          file=out)
  counts.notes += len(result.notes)
  if result.tf1:
    counts.tf1 += 1
    print(f"{path}: {tf1_words(result.tf1)}", file=out)
  if result.changes:
    counts.changed += 1
    counts.lines += len(result.changes)


TF1_SHOWN = 6  # TF 1.x names named in a file's line


def tf1_words(tf1):
  """The report's line for a file of TF 1.x code."""
  names = sorted(tf1, key=lambda name: (tf1[name], name))
  shown = ", ".join(f"{name} (line {tf1[name]})"
                    for name in names[:TF1_SHOWN])
  more = (f" and {len(names) - TF1_SHOWN} more"
          if len(names) > TF1_SHOWN else "")
  return (f"TF 1.x code ({shown}{more} exist only in TF 1.x): run TF's "
          "`tf_upgrade_v2 --intree DIR --outtree NEW_DIR` (`--infile`/"
          "`--outfile` for one file; TF installs it) first, then migrate "
          "its output (docs/migration.md, 'TF 1.x code').")


def print_summary(counts, output, in_place, out):
  """The closing line: the counts, and where the files went."""
  where = ("written under " + output if output else
           "rewritten in place" if in_place else
           "nothing written (give --output DIR or --in-place)")
  upgrade = (f", {counts.tf1} need TF's tf_upgrade_v2 first (TF 1.x "
             "code)" if counts.tf1 else "")
  print(f"migrate: {counts.files} Python files, {counts.changed} "
        f"changed ({counts.lines} changes), {counts.notes} names left "
        f"alone, {counts.refused} refused{upgrade}; {where}.", file=out)
