"""Read: a program's bytes (a regular file, bounded, never through a link),
its text in the encoding it declares, its syntax tree, and the `Source`
the edits are made on (the text as UTF-8 bytes, whose offsets `ast`
counts; only the edited spans change)."""
import ast
import io
import tokenize

from estimator_spec import files as files_lib
from estimator_spec.migrate import report

MAX_FILE_BYTES = 16 << 20  # a larger .py file is refused, not read


def read_source(path):
  """A regular file's bytes, at most MAX_FILE_BYTES, never through a link
  or from a FIFO (files.read_bytes); raises OSError or files.FileRejected
  saying why not."""
  return files_lib.read_bytes(path, MAX_FILE_BYTES)


class NotPython(Exception):
  """A file's bytes that are no Python `ast` reads; the message says why,
  in the report's words."""


def parse(data):
  """(encoding, text, syntax tree) of one file's bytes, in any source
  encoding Python accepts. Raises NotPython."""
  try:
    encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    text = data.decode(encoding)
    tree = ast.parse(text)
  except (SyntaxError, ValueError, UnicodeDecodeError, LookupError,
          RecursionError, MemoryError) as error:
    raise NotPython(_parse_error(error)) from error
  return encoding, text, tree


def _parse_error(error):
  if isinstance(error, SyntaxError):
    where = f" at line {error.lineno}" if error.lineno else ""
    return f"cannot parse it as Python ({error.msg}{where})"
  if isinstance(error, RecursionError):
    return "cannot parse it: nested too deeply"
  return (f"cannot parse it ({type(error).__name__}: "
          f"{report.one_line(str(error))})")


class Source:
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
    """The bytes with every edit made (from the end, so that the offsets
    of the others hold)."""
    data = self.data
    last = None
    for start, end, new in sorted(self.edits, key=lambda e: (e[0], e[1]),
                                  reverse=True):
      if last is not None and end > last:
        raise AssertionError("overlapping edits")  # a bug here, not input
      data = data[:start] + new + data[end:]
      last = start
    return data
