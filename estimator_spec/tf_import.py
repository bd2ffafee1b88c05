"""TensorFlow imported without the lines its GPU build prints at import on
a machine without CUDA (docs/install.md, 'Current TensorFlow').

On Python 3.12 and later this library installs the full `tensorflow` wheel
(`tf_keras` needs it), whose import writes, before TensorFlow's own logging
is set up and so whatever `TF_CPP_MIN_LOG_LEVEL` says:

    WARNING: All log messages before absl::InitializeLog() is called are written to STDERR
    I0000 00:00:... cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU will not be used.

(twice). When `estimator_spec` is imported before TensorFlow (the command
line, the examples), TensorFlow's import (`import_tensorflow`, or the
package's hook on the first `import tensorflow` of the process, whoever
makes it) runs with the process's standard error going to a temporary
file (`notices_dropped`), then writes back every line but those: any other
line TensorFlow or Python writes during the import is kept, in its order.
`ESTIMATOR_SPEC_KEEP_TF_IMPORT_LINES=1` keeps them all. A program that
imports TensorFlow itself before `estimator_spec` gets TensorFlow's output
as TensorFlow writes it.
"""
import contextlib
import os
import re
import sys
import tempfile

KEEP_VARIABLE = "ESTIMATOR_SPEC_KEEP_TF_IMPORT_LINES"
_DROPPED = (
    re.compile(rb"^WARNING: All log messages before absl::InitializeLog\(\) "
               rb"is called are written to STDERR$"),
    re.compile(rb"^I\d{4} [\d:.]+ +\d+ cudart_stub\.cc:\d+\] Could not find "
               rb"cuda drivers on your machine, GPU will not be used\.$"),
)


def kept(output):
  """The lines of `output` (bytes) that are not the GPU build's import
  notices, as bytes."""
  lines = output.splitlines(keepends=True)
  return b"".join(line for line in lines
                  if not any(p.match(line.rstrip(b"\r\n")) for p in _DROPPED))


@contextlib.contextmanager
def notices_dropped():
  """The block with the process's standard error going to a temporary file;
  then every line written there but the GPU build's import notices is
  written back, in its order."""
  with tempfile.TemporaryFile() as captured:
    sys.stderr.flush()
    saved = os.dup(2)
    os.dup2(captured.fileno(), 2)
    try:
      yield
    finally:
      sys.stderr.flush()
      os.dup2(saved, 2)
      os.close(saved)
      captured.seek(0)
      rest = kept(captured.read())
      while rest:
        rest = rest[os.write(2, rest):]


def import_tensorflow():
  """Imports TensorFlow (once) without its GPU build's import notices."""
  if "tensorflow" in sys.modules or os.environ.get(KEEP_VARIABLE) == "1":
    import tensorflow  # pylint: disable=import-outside-toplevel,unused-import
    return
  with notices_dropped():
    import tensorflow  # pylint: disable=import-outside-toplevel,unused-import
