"""A small progress bar for the command-line tools (rows copied per table).

On a terminal the line is redrawn in place (at most ten times a second);
elsewhere (logs, pipes, tests) only the finished line is written, so a
captured stderr holds one line per table.
"""
import sys
import time
from types import TracebackType
from typing import (Callable, ContextManager, Literal, Optional, Protocol,
                    TextIO, Union)

from tpu_embedding_columns import errors


class Progress(Protocol):
  """What a progress context gives its block: `advance(n)` adds n copied
  rows."""

  def advance(self, rows: int) -> None:
    ...


# `factory`'s result: (label, total rows) -> a context giving a `Progress`.
ProgressFactory = Callable[[str, int], ContextManager[Progress]]


class RowProgress:
  """`label [#####.....] copied/total rows` on `stream` (default stderr).

  Use as a context manager; `advance(n)` adds n copied rows. Leaving the
  block writes the final line (also after an error, marked as stopped).
  """

  WIDTH = 30

  def __init__(self, label: str, total: int,
               stream: Optional[TextIO] = None) -> None:
    self.label = label
    self.total = max(int(total), 0)
    self.done = 0
    self.stream = sys.stderr if stream is None else stream
    isatty = getattr(self.stream, "isatty", None)
    self._live = bool(isatty and isatty())
    self._last_draw = 0.0

  def __enter__(self) -> "RowProgress":
    if self._live:
      self._draw("\r")
    return self

  def advance(self, rows: int) -> None:
    self.done = min(self.total, self.done + int(rows))
    now = time.monotonic()
    if self._live and now - self._last_draw >= 0.1:
      self._last_draw = now
      self._draw("\r")

  def __exit__(self, exc_type: Optional[type[BaseException]],
               exc: Optional[BaseException],
               tb: Optional[TracebackType]) -> Literal[False]:
    suffix = "" if exc_type is None else " (stopped)"
    self._draw("\r" if self._live else "", suffix + "\n")
    return False

  def _draw(self, prefix: str, suffix: str = "") -> None:
    fraction = self.done / self.total if self.total else 1.0
    filled = int(round(fraction * self.WIDTH))
    bar = "#" * filled + "." * (self.WIDTH - filled)
    self.stream.write(f"{prefix}{self.label} [{bar}] {self.done:,}/"
                      f"{self.total:,} rows{suffix}")
    self.stream.flush()


class NoProgress:
  """Stands in for `RowProgress` when no progress is shown."""

  def __init__(self, label: Optional[str] = None, total: int = 0,
               stream: Optional[TextIO] = None) -> None:
    del label, total, stream

  def __enter__(self) -> "NoProgress":
    return self

  def advance(self, rows: int) -> None:
    del rows

  def __exit__(self, exc_type: Optional[type[BaseException]],
               exc: Optional[BaseException],
               tb: Optional[TracebackType]) -> Literal[False]:
    return False


def factory(progress: Union[bool, None, TextIO]) -> ProgressFactory:
  """The progress class for a `progress` argument: False/None (silent),
  True (stderr) or a writable text stream."""
  if progress is None or progress is False:
    return NoProgress
  if progress is True:
    return RowProgress
  if callable(getattr(progress, "write", None)):
    return lambda label, total: RowProgress(label, total, stream=progress)
  raise errors.ArgumentTypeError(
      "`progress` must be True, False, None or a writable text stream; got "
      f"{progress!r}.")
