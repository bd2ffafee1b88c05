"""`python -m estimator_spec migrate`: the import change made by a program.

* programs written with public TPU code's import habits
  (tests/data/migrate), migrated, then run: train, evaluate, predict,
  export; migrating the result again changes nothing;
* the rewriting: each alias form, names imported one by one, whole-module
  aliases, tf.contrib, what is left alone and why, comments and formatting
  kept byte for byte, source encodings and line endings;
* the files: --output, --in-place, links, unparseable files, exit codes.
"""
import os
import stat
import subprocess
import sys
import textwrap

import hypothesis
from hypothesis import strategies as st
import pytest

from estimator_spec import migrate

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAMS = os.path.join(REPO, "tests", "data", "migrate")
_ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")


def _migrated(source):
  result = migrate.migrate_source(textwrap.dedent(source).encode())
  assert result.error is None, result.error
  return result.source.decode(), result


def _cli(*args):
  return subprocess.run([sys.executable, "-m", "estimator_spec", "migrate",
                         *map(str, args)], cwd=REPO, env=_ENV,
                        capture_output=True, text=True, timeout=300,
                        check=False)


# --- programs as TPU users write them --------------------------------------

_RUNNER = r"""
import runpy, sys
for program, model_dir in zip(sys.argv[1::2], sys.argv[2::2]):
  sys.argv = [program, model_dir]
  runpy.run_path(program, run_name="__main__")
"""


@pytest.mark.slow
def test_programs_migrated_mechanically_train_evaluate_predict_export(
    tmp_path):
  output = tmp_path / "migrated"
  process = _cli(PROGRAMS, "--output", output)
  assert process.returncode == 0, process.stderr
  report = process.stdout.splitlines()
  assert report[-1] == (
      "migrate: 3 Python files, 3 changed (30 changes), 0 names left alone, "
      f"0 refused; written under {output}.")
  assert (output / "README.md").read_text() == open(
      os.path.join(PROGRAMS, "README.md")).read()  # other files copied
  for name in ("docs_style.py", "contrib_style.py", "module_style.py"):
    text = (output / name).read_text()
    assert "tensorflow.contrib" not in text and "contrib_tpu." not in text
    assert "estimator.tpu." not in text
  # Migrating the migrated tree again changes nothing.
  again = migrate.run([str(output)], out=open(os.devnull, "w"))
  assert again == 0
  for name in ("docs_style.py", "contrib_style.py", "module_style.py"):
    result = migrate.migrate_source((output / name).read_bytes())
    assert not result.changes, (name, result.changes)
  args = []
  for name in ("docs_style.py", "contrib_style.py", "module_style.py"):
    args += [str(output / name), str(tmp_path / name[:-3])]
  run = subprocess.run([sys.executable, "-c", _RUNNER, *args], cwd=tmp_path,
                       env=dict(_ENV, PYTHONPATH=REPO), capture_output=True,
                       text=True, timeout=600, check=False)
  assert run.returncode == 0, run.stderr[-3000:]
  results = [line.split() for line in run.stdout.splitlines()
             if line.startswith("RESULT ")]
  assert [r[1] for r in results] == ["step=4", "step=6", "step=4"]
  for result, name in zip(results, ("docs_style", "contrib_style",
                                    "module_style")):
    export = result[-1].split("=", 1)[1]
    assert export.startswith(str(tmp_path / name / "export"))
    assert os.path.isfile(os.path.join(export, "saved_model.pb"))


# --- the rewriting ----------------------------------------------------------


def test_compat_v1_alias_names_are_rewritten_and_the_rest_kept_byte_for_byte():
  source = """\
  # A model.  tf.estimator.tpu.TPUEstimator in a comment stays.
  import tensorflow.compat.v1 as tf   # keep this comment

  def build(model_fn):
    config = tf.estimator.tpu.RunConfig(  # the run
        model_dir="tf.estimator.tpu.RunConfig",
        tpu_config=tf.estimator.tpu.TPUConfig(
            per_host_input_for_training=tf.estimator.tpu.InputPipelineConfig
            .PER_HOST_V2))
    return tf.estimator.tpu.TPUEstimator(model_fn=model_fn, config=config)
  """
  new, result = _migrated(source)
  assert new == textwrap.dedent("""\
  # A model.  tf.estimator.tpu.TPUEstimator in a comment stays.
  import tensorflow.compat.v1 as tf   # keep this comment
  import estimator_spec

  def build(model_fn):
    config = estimator_spec.RunConfig(  # the run
        model_dir="tf.estimator.tpu.RunConfig",
        tpu_config=estimator_spec.TPUConfig(
            per_host_input_for_training=estimator_spec.InputPipelineConfig
            .PER_HOST_V2))
    return estimator_spec.TPUEstimator(model_fn=model_fn, config=config)
  """)
  assert [(c.line, c.old, c.new) for c in result.changes] == [
      (3, "", "import estimator_spec"),
      (5, "tf.estimator.tpu.RunConfig", "estimator_spec.RunConfig"),
      (7, "tf.estimator.tpu.TPUConfig", "estimator_spec.TPUConfig"),
      (8, "tf.estimator.tpu.InputPipelineConfig",
       "estimator_spec.InputPipelineConfig"),
      (10, "tf.estimator.tpu.TPUEstimator", "estimator_spec.TPUEstimator")]
  assert not result.notes


@pytest.mark.parametrize("imports, prefix", [
    ("import tensorflow as tf", "tf.compat.v1."),
    ("import tensorflow as tf", "tf."),  # TF 1.x's API
    ("from tensorflow.compat import v1 as tf", "tf."),
    ("import tensorflow.compat.v1", "tensorflow.compat.v1."),
    ("from tensorflow import compat", "compat.v1."),
])
def test_each_alias_of_tensorflow_is_followed(imports, prefix):
  new, _ = _migrated(f"""\
  {imports}
  column = {prefix}tpu.experimental.embedding_column(None, 2)
  spec = {prefix}estimator.tpu.experimental.EmbeddingConfigSpec(
      feature_columns=[column],
      optimization_parameters={prefix}tpu.experimental.AdamParameters(0.1))
  """)
  assert new == textwrap.dedent(f"""\
  {imports}
  import estimator_spec
  import tpu_embedding_columns
  column = tpu_embedding_columns.embedding_column(None, 2)
  spec = estimator_spec.experimental.EmbeddingConfigSpec(
      feature_columns=[column],
      optimization_parameters=tpu_embedding_columns.AdamParameters(0.1))
  """)


def test_names_imported_one_by_one_keep_their_local_names():
  new, _ = _migrated("""\
  from tensorflow.compat.v1.estimator.tpu import RunConfig, TPUEstimator as E
  from tensorflow.python.tpu.feature_column_v2 import embedding_column_v2
  from tensorflow.python.tpu.tpu_embedding import AdagradParameters, \\
      _OptimizationParameters
  from tensorflow.contrib.tpu import CrossShardOptimizer
  E(config=RunConfig()), embedding_column_v2, AdagradParameters
  """)
  assert new == textwrap.dedent("""\
  from estimator_spec import RunConfig, TPUEstimator as E
  from tpu_embedding_columns import embedding_column as embedding_column_v2
  from tensorflow.python.tpu.tpu_embedding import _OptimizationParameters
  from tpu_embedding_columns import AdagradParameters
  from tensorflow.compat.v1.tpu import CrossShardOptimizer
  E(config=RunConfig()), embedding_column_v2, AdagradParameters
  """)


def test_a_whole_module_alias_becomes_an_alias_of_ours_when_every_use_is():
  new, result = _migrated("""\
  from tensorflow.compat.v1.estimator import tpu as tpu_estimator
  estimator = tpu_estimator.TPUEstimator(
      config=tpu_estimator.RunConfig(),
      embedding_config_spec=tpu_estimator.experimental.EmbeddingConfigSpec())
  """)
  assert new.splitlines()[0] == "import estimator_spec as tpu_estimator"
  assert new.splitlines()[1:] == textwrap.dedent("""\
  estimator = tpu_estimator.TPUEstimator(
      config=tpu_estimator.RunConfig(),
      embedding_config_spec=tpu_estimator.experimental.EmbeddingConfigSpec())
  """).splitlines()
  assert len(result.changes) == 1
  # A use the table does not know keeps TF's module; the others move.
  new, result = _migrated("""\
  from tensorflow.compat.v1.estimator import tpu as tpu_estimator
  tpu_estimator.TPUEstimator, tpu_estimator.SOMETHING_ELSE
  """)
  assert new == textwrap.dedent("""\
  from tensorflow.compat.v1.estimator import tpu as tpu_estimator
  import estimator_spec
  estimator_spec.TPUEstimator, tpu_estimator.SOMETHING_ELSE
  """)
  assert [n.name for n in result.notes] == ["tpu_estimator.SOMETHING_ELSE"]


def test_contrib_tpu_moves_and_its_import_goes_when_nothing_is_left():
  new, _ = _migrated("""\
  import tensorflow as tf
  from tensorflow.contrib import tpu as contrib_tpu
  contrib_tpu.CrossShardOptimizer(None)
  contrib_tpu.TPUEstimatorSpec(mode=None)
  tf.contrib.tpu.RunConfig()
  """)
  assert new == textwrap.dedent("""\
  import tensorflow as tf
  import estimator_spec
  tf.compat.v1.tpu.CrossShardOptimizer(None)
  estimator_spec.TPUEstimatorSpec(mode=None)
  estimator_spec.RunConfig()
  """)
  new, result = _migrated("""\
  from tensorflow.contrib import tpu as contrib_tpu
  contrib_tpu.TPUEstimator, contrib_tpu.profiler
  """)
  assert new.splitlines()[0] == (
      "from tensorflow.contrib import tpu as contrib_tpu")
  assert "estimator_spec.TPUEstimator, contrib_tpu.profiler" in new
  reasons = {n.name: n.why for n in result.notes}
  assert "no counterpart" in reasons["contrib_tpu.profiler"]
  assert "TF 2.15 has no tensorflow.contrib" in reasons[
      "tensorflow.contrib.tpu"]


def test_names_without_a_counterpart_are_left_alone_with_the_reason():
  new, result = _migrated("""\
  import tensorflow as tf
  tf.tpu.experimental.initialize_tpu_system(resolver)
  table = tf.tpu.experimental.embedding.TableConfig(10, 2)
  embedding = tf.tpu.experimental.embedding.TPUEmbedding({}, None)
  tf.compat.v1.tpu.experimental.NotAName
  """)
  assert "tf.tpu.experimental.initialize_tpu_system(resolver)" in new
  assert "tf.tpu.experimental.embedding.TableConfig(10, 2)" in new
  assert "estimator_spec.HostTPUEmbedding({}, None)" in new
  notes = {n.name: n.why for n in result.notes}
  assert notes["tf.tpu.experimental.initialize_tpu_system"].startswith(
      "refused: a TPU system call")
  assert notes["tf.tpu.experimental.embedding.TableConfig"].startswith(
      "kept: TF's own configuration object")
  assert "not in the table" in notes["tf.compat.v1.tpu.experimental.NotAName"]


def test_a_module_passed_as_a_value_and_other_names_stay():
  new, result = _migrated("""\
  import tensorflow.compat.v1 as tf
  from tensorflow.compat.v1.estimator import tpu as tpu_estimator
  use(tpu_estimator)
  tpu_estimator.TPUEstimator
  tf.train.AdamOptimizer(0.1)
  numpy.tpu.experimental.embedding_column
  """)
  assert "from tensorflow.compat.v1.estimator import tpu as tpu_estimator" in new
  assert "use(tpu_estimator)\nestimator_spec.TPUEstimator" in new
  assert "tf.train.AdamOptimizer(0.1)" in new
  assert "numpy.tpu.experimental.embedding_column" in new
  assert not result.notes


def test_a_name_bound_to_two_modules_is_left_with_a_note():
  new, result = _migrated("""\
  import tensorflow as tf
  if old:
    import tensorflow.compat.v1 as tf
  tf.estimator.tpu.RunConfig()
  """)
  assert "tf.estimator.tpu.RunConfig()" in new
  assert "more than one module" in result.notes[0].why


def test_the_sole_import_of_a_block_becomes_pass():
  new, _ = _migrated("""\
  try:
    from tensorflow.contrib import tpu as contrib_tpu
  except ImportError:
    contrib_tpu = None
  x = contrib_tpu.RunConfig()
  """)
  assert new == textwrap.dedent("""\
  import estimator_spec
  try:
    pass
  except ImportError:
    contrib_tpu = None
  x = estimator_spec.RunConfig()
  """)
  new, _ = _migrated("""\
  def f():
    from tensorflow.contrib import tpu as contrib_tpu  # TF 1.15
    return contrib_tpu.RunConfig()
  if True:
    from tensorflow.contrib import tpu as contrib_tpu
  """)
  assert new == textwrap.dedent("""\
  import estimator_spec
  def f():
    return estimator_spec.RunConfig()
  if True:
    pass
  """)


@pytest.mark.parametrize("encoding, newline, bom", [
    ("utf-8", "\r\n", False), ("latin-1", "\n", False),
    ("utf-8", "\n", True)])
def test_encodings_and_line_endings_are_kept(encoding, newline, bom):
  lines = ([f"# -*- coding: {encoding} -*-"] if encoding != "utf-8" else
           []) + ["import tensorflow as tf", "# Größe: naïve café",
                  "s = 'é'; tf.estimator.tpu.RunConfig()"]
  data = newline.join(lines + [""]).encode(encoding)
  if bom:
    data = b"\xef\xbb\xbf" + data
  result = migrate.migrate_source(data)
  expected = lines[:-1] + ["import estimator_spec",
                           "s = 'é'; estimator_spec.RunConfig()"]
  # The new import goes after the last import, before the comment.
  expected = (lines[:-2] + ["import estimator_spec", lines[-2],
                            "s = 'é'; estimator_spec.RunConfig()"])
  want = newline.join(expected + [""]).encode(encoding)
  assert result.source == (b"\xef\xbb\xbf" + want if bom else want)


@hypothesis.settings(max_examples=60, deadline=None)
@hypothesis.given(st.binary(max_size=300))
def test_random_bytes_give_a_result_or_a_refusal_never_an_exception(data):
  result = migrate.migrate_source(data)
  assert (result.error is None) != (result.source is None)


@hypothesis.settings(max_examples=40, deadline=None)
@hypothesis.given(st.lists(st.sampled_from([
    "import tensorflow as tf", "import tensorflow.compat.v1 as tf",
    "from tensorflow.contrib import tpu as contrib_tpu",
    "from tensorflow.compat.v1.estimator import tpu as tpu_estimator",
    "x = tf.estimator.tpu.RunConfig()", "y = contrib_tpu.TPUEstimator",
    "z = tpu_estimator.TPUEstimatorSpec", "def f():\n  return tf.tpu",
    "w = tf.compat.v1.tpu.experimental.embedding_column  # note",
    "if a:\n  import tensorflow as tf"]), max_size=8))
def test_random_programs_migrate_to_python_and_again_to_themselves(lines):
  data = "\n".join(lines).encode() + b"\n"
  result = migrate.migrate_source(data)
  assert result.error is None
  again = migrate.migrate_source(result.source)
  assert again.error is None and again.source == result.source


# --- files and the command line ------------------------------------------


def test_in_place_rewrites_changed_files_only_keeping_their_mode(tmp_path):
  changed = tmp_path / "model.py"
  changed.write_text("import tensorflow as tf\ntf.estimator.tpu.RunConfig\n")
  os.chmod(changed, 0o750)
  untouched = tmp_path / "other.py"
  untouched.write_text("import os\n")
  before = os.stat(untouched).st_mtime_ns
  (tmp_path / "link.py").symlink_to(changed)
  lines = []
  code = migrate.run([str(tmp_path)], in_place=True,
                     out=_Lines(lines))
  assert code == 0
  assert changed.read_text() == (
      "import tensorflow as tf\nimport estimator_spec\n"
      "estimator_spec.RunConfig\n")
  assert stat.S_IMODE(os.stat(changed).st_mode) == 0o750
  assert os.stat(untouched).st_mtime_ns == before
  assert (tmp_path / "link.py").is_symlink()
  assert f"{tmp_path / 'link.py'}: skipped: a symbolic link: not followed" \
      in lines
  assert not [p for p in os.listdir(tmp_path) if p.startswith(".migrate")]


class _Lines:
  def __init__(self, lines):
    self.lines = lines

  def write(self, text):
    self.lines.extend(line for line in text.splitlines() if line)


def test_unparseable_files_are_refused_one_line_each_the_rest_migrated(
    tmp_path):
  source = tmp_path / "src"
  source.mkdir()
  (source / "good.py").write_text("import tensorflow as tf\n"
                                  "tf.estimator.tpu.RunConfig\n")
  (source / "bad.py").write_text("def f(:\n  pass\n")
  (source / "nul.py").write_bytes(b"x = 1\x00\n")
  output = tmp_path / "out"
  process = _cli(source, "--output", output)
  assert process.returncode == 2
  lines = process.stdout.splitlines()
  assert (f"{source / 'bad.py'}: refused: cannot parse it as Python "
          "(invalid syntax at line 1)") in lines
  assert any(line.startswith(f"{source / 'nul.py'}: refused: cannot parse")
             for line in lines)
  assert "estimator_spec.RunConfig" in (output / "good.py").read_text()
  assert not (output / "bad.py").exists()
  assert lines[-1].startswith("migrate: 3 Python files, 1 changed (2 changes)")


def test_usage_errors_exit_2_in_one_line_and_write_nothing(tmp_path):
  (tmp_path / "a.py").write_text("import tensorflow as tf\n")
  for args, message in [
      ([tmp_path / "missing"], "does not exist"),
      ([tmp_path, "--output", tmp_path / "inside"], "lies inside"),
  ]:
    process = _cli(*args)
    assert process.returncode == 2
    assert process.stderr.count("\n") == 1 and message in process.stderr
  assert sorted(os.listdir(tmp_path)) == ["a.py"]
  process = _cli(tmp_path / "a.py", "--output", tmp_path / "o", "--in-place")
  assert process.returncode == 2 and "not allowed with" in process.stderr
  # An existing output file is replaced only with --force.
  (tmp_path / "o").mkdir()
  (tmp_path / "o" / "a.py").write_text("mine\n")
  process = _cli(tmp_path / "a.py", "--output", tmp_path / "o")
  assert process.returncode == 2 and "--force" in process.stdout
  assert (tmp_path / "o" / "a.py").read_text() == "mine\n"
  process = _cli(tmp_path / "a.py", "--output", tmp_path / "o", "--force")
  assert process.returncode == 0
  assert (tmp_path / "o" / "a.py").read_text() == "import tensorflow as tf\n"
