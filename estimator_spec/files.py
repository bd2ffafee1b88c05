"""Careful reading and writing of the files the library keeps on disk.

Every file the library reads back (lookup statistics, the ps assignment,
the compiled-kernel cache) may have been broken or planted by someone
else. The rules, the same for each (docs/security.md):

* `read_bytes`: a regular file only. A symbolic link, FIFO, device,
  socket or directory is refused (`O_NOFOLLOW`, then `fstat`), and the
  open never blocks (`O_NONBLOCK`: a FIFO is refused, not waited on).
  A file larger than the caller's cap is refused before it is read.
* `read_json`: `read_bytes`, then UTF-8 text, nesting at most
  `MAX_JSON_DEPTH` deep (checked before the parser runs), no `NaN` or
  `Infinity`, no non-finite number, no key twice in one object.
* `write_atomic`: the bytes go to a new file (`O_EXCL | O_NOFOLLOW`, mode
  0666 less the user's umask) in the target's directory, then
  `os.replace` puts it in place: readers see the old file or the new one,
  and a symbolic link at the target is replaced, never written through.
* `open_lock`: a lock file opened without following a link, refused
  unless it is a regular file.

Each refusal raises `FileRejected` (a ValueError) whose message is the
reason; callers name the file and say what they do instead.
"""
import json
import math
import os
import re
import secrets
import stat

import numpy as np

MAX_JSON_DEPTH = 32
# Strings of a JSON text (escapes included), dropped before the nesting
# is counted.
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)


class FileRejected(ValueError):
  """A file the library will not use; the message says why."""


def _kind(mode):
  if stat.S_ISLNK(mode):
    return "a symbolic link"
  if stat.S_ISFIFO(mode):
    return "a FIFO"
  if stat.S_ISDIR(mode):
    return "a directory"
  if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
    return "a device"
  if stat.S_ISSOCK(mode):
    return "a socket"
  return "not a regular file"


def _open_flags():
  return (os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) |
          getattr(os, "O_NOCTTY", 0))


def read_bytes(path, max_bytes):
  """The bytes of the regular file `path`, at most `max_bytes` of them.

  Raises FileNotFoundError when there is no file, FileRejected for
  anything else that is not a regular file of at most `max_bytes` bytes,
  OSError when it cannot be read."""
  info = os.lstat(path)
  if not stat.S_ISREG(info.st_mode):
    raise FileRejected(f"it is {_kind(info.st_mode)}, not a regular file")
  try:
    handle = os.open(path, os.O_RDONLY | _open_flags())
  except OSError as error:
    if os.path.islink(path):  # replaced by a link since the lstat
      raise FileRejected("it is a symbolic link, not a regular file") from None
    raise error
  try:
    info = os.fstat(handle)
    if not stat.S_ISREG(info.st_mode):
      raise FileRejected(f"it is {_kind(info.st_mode)}, not a regular file")
    if info.st_size > max_bytes:
      raise FileRejected(f"it holds {info.st_size:,} bytes, more than the "
                         f"{max_bytes:,} allowed")
    chunks, size = [], 0
    while size <= max_bytes:
      chunk = os.read(handle, max_bytes + 1 - size)
      if not chunk:
        break
      chunks.append(chunk)
      size += len(chunk)
    if size > max_bytes:
      raise FileRejected(f"it grew past the {max_bytes:,} bytes allowed")
    return b"".join(chunks)
  finally:
    os.close(handle)


def json_depth(data):
  """The deepest nesting of arrays and objects in the JSON text `data`
  (bytes), counted without parsing it (strings are skipped)."""
  skeleton = _JSON_STRING.sub(b"", data)
  codes = np.frombuffer(skeleton, np.uint8)
  steps = (np.isin(codes, (ord("["), ord("{"))).astype(np.int64) -
           np.isin(codes, (ord("]"), ord("}"))).astype(np.int64))
  return int(np.cumsum(steps).max()) if steps.size else 0


def _refuse_constant(name):
  raise FileRejected(f"it holds {name}, which is not a JSON number")


def _finite_float(text):
  value = float(text)
  if not math.isfinite(value):
    raise FileRejected(f"it holds the number {text[:40]}, out of range")
  return value


def _bounded_int(text):
  if len(text) > 40:
    raise FileRejected(f"it holds an integer of {len(text)} digits")
  return int(text)


def _unique_keys(pairs):
  result = {}
  for key, value in pairs:
    if key in result:
      raise FileRejected(f"it names the key {key[:80]!r} twice in one object")
    result[key] = value
  return result


def parse_json(data, max_depth=MAX_JSON_DEPTH):
  """The value of the JSON text `data` (bytes or str) under the rules of
  `read_json`; raises FileRejected with the reason."""
  if isinstance(data, str):
    try:
      data = data.encode("utf-8")
    except UnicodeEncodeError:
      raise FileRejected("it is not UTF-8 text") from None
  try:
    text = data.decode("utf-8")
  except UnicodeDecodeError as error:
    raise FileRejected(f"it is not UTF-8 text (byte {error.start})") from None
  depth = json_depth(data)
  if depth > max_depth:
    raise FileRejected(f"its JSON nests {depth} levels deep, more than the "
                       f"{max_depth} allowed")
  try:
    return json.loads(text, parse_constant=_refuse_constant,
                      parse_float=_finite_float, parse_int=_bounded_int,
                      object_pairs_hook=_unique_keys)
  except FileRejected:
    raise
  except (ValueError, RecursionError) as error:
    raise FileRejected(f"it is not valid JSON ({error})") from None


def read_json(path, max_bytes, max_depth=MAX_JSON_DEPTH):
  """The JSON value in the regular file `path` (`read_bytes`,
  `parse_json`)."""
  return parse_json(read_bytes(path, max_bytes), max_depth)


def umask():
  """The process's umask (read without changing it for long)."""
  current = os.umask(0o022)
  os.umask(current)
  return current


def write_atomic(path, data, mode=0o666, exact_mode=False):
  """Writes `data` (bytes or str, UTF-8) to `path` atomically: a new file
  beside it (created exclusively, never through a link, with `mode` less
  the umask, or exactly `mode` with `exact_mode`), synced, then renamed
  over `path`. A symbolic link, FIFO or other non-directory at `path` is
  replaced, not written through; a directory there raises
  IsADirectoryError. Returns `path`.

  The one atomic writer of the library. The other renames into place are
  of files this process did not write byte by byte: a compiled library
  (`engine/kernels`), a checkpoint TF's writer staged
  (`checkpoints/tables.py`) and files on a TF file system
  (`cluster/assignment_file.py`)."""
  if isinstance(data, str):
    data = data.encode("utf-8")
  directory = os.path.dirname(os.path.abspath(path))
  base = os.path.basename(path)
  if os.path.isdir(path) and not os.path.islink(path):
    raise IsADirectoryError(21, "Is a directory", path)
  temporary = os.path.join(
      directory, f".{base[:80]}.{secrets.token_hex(6)}.tmp")
  handle = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL |
                   os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), mode)
  try:
    try:
      if exact_mode:
        os.fchmod(handle, mode)
      view = memoryview(data)
      while view:
        written = os.write(handle, view)
        view = view[written:]
      os.fsync(handle)
    finally:
      os.close(handle)
    os.replace(temporary, path)
  except BaseException:
    try:
      os.remove(temporary)
    except OSError:
      pass
    raise
  return path


def open_lock(path):
  """A file descriptor of the lock file `path` (created, mode 0666 less the
  umask, if missing), opened without following a link; FileRejected if
  `path` is a link or not a regular file. The caller closes it."""
  try:
    handle = os.open(path, os.O_RDWR | os.O_CREAT | _open_flags(), 0o666)
  except OSError as error:
    if os.path.islink(path):
      raise FileRejected("it is a symbolic link, not a regular file") from None
    if os.path.exists(path) and not os.path.isfile(path):
      raise FileRejected(
          f"it is {_kind(os.lstat(path).st_mode)}, not a regular file"
      ) from None
    raise error
  info = os.fstat(handle)
  if not stat.S_ISREG(info.st_mode):
    os.close(handle)
    raise FileRejected(f"it is {_kind(info.st_mode)}, not a regular file")
  return handle
