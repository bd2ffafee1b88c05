"""Files the library reads or writes, broken or planted by someone else
(docs/security.md): the careful reader and writer (`estimator_spec/files.py`),
lookup statistics files, the `profile` command, the ps-assignment file and
table names. Each hostile file gives a warning naming the file and the
reason (or a clear error) and never a crash, a hang, or a write outside.
"""
import base64
import json
import os
import stat
import subprocess
import sys
import warnings

import hypothesis
from hypothesis import strategies as hs
import numpy as np
import pytest

import estimator_spec as es
import tpu_embedding_columns as tec
from estimator_spec import files
from estimator_spec.cluster import assignment_file
from estimator_spec.cluster import placement
from estimator_spec.cluster import tasks as cluster_lib
from estimator_spec.profiling import file_format
from estimator_spec.profiling import statistics as st
from estimator_spec.profiling import store

FAST = hypothesis.settings(max_examples=60, deadline=None,
                           suppress_health_check=list(
                               hypothesis.HealthCheck))


# --- the careful reader and writer ------------------------------------------


def test_read_bytes_takes_a_regular_file_within_its_cap(tmp_path):
  path = tmp_path / "f"
  path.write_bytes(b"abc")
  assert files.read_bytes(str(path), 3) == b"abc"
  with pytest.raises(files.FileRejected, match="3 bytes, more than the 2"):
    files.read_bytes(str(path), 2)
  with pytest.raises(FileNotFoundError):
    files.read_bytes(str(tmp_path / "missing"), 10)


@pytest.mark.parametrize("kind", ["symlink", "fifo", "directory", "device"])
def test_read_bytes_refuses_what_is_not_a_regular_file(tmp_path, kind):
  target = tmp_path / "target"
  target.write_bytes(b"{}")
  path = tmp_path / "f"
  if kind == "symlink":
    path.symlink_to(target)
  elif kind == "fifo":
    os.mkfifo(path)  # nobody writes it: opening it must not block
  elif kind == "directory":
    path.mkdir()
  else:
    path = "/dev/zero"
  words = {"symlink": "a symbolic link", "fifo": "a FIFO",
           "directory": "a directory", "device": "a device"}[kind]
  with pytest.raises(files.FileRejected, match=words):
    files.read_bytes(str(path), 100)


@pytest.mark.parametrize("text, words", [
    ("[" * 200_000 + "]" * 200_000, "nests 200000 levels"),
    ('{"a": NaN}', "NaN"),
    ('{"a": Infinity}', "Infinity"),
    ('{"a": 1e400}', "out of range"),
    ('{"a": ' + "9" * 5000 + "}", "integer of 5000 digits"),
    (b'{"a": "\xff"}', "not UTF-8"),
    ('{"a": 1, "a": 2}', "key 'a' twice"),
    ("{not json", "not valid JSON"),
], ids=["deep", "nan", "infinity", "huge-float", "huge-int", "utf8",
        "duplicate-key", "invalid"])
def test_parse_json_refuses_with_the_reason(text, words):
  with pytest.raises(files.FileRejected, match=words):
    files.parse_json(text)


def test_json_depth_skips_brackets_inside_strings():
  assert files.json_depth(b'{"a": "[[[[\\"[[", "b": [[1]]}') == 3
  assert files.parse_json('["[[[[[[", {"]": [1]}]', max_depth=3) == [
      "[[[[[[", {"]": [1]}]


@FAST
@hypothesis.given(hs.binary(max_size=300))
def test_parse_json_of_random_bytes_returns_or_refuses(data):
  try:
    files.parse_json(data)
  except files.FileRejected:
    pass


@pytest.mark.parametrize("mask, mode", [(0o077, 0o600), (0o022, 0o644),
                                        (0o002, 0o664)])
def test_write_atomic_respects_the_umask(tmp_path, mask, mode):
  old = os.umask(mask)
  try:
    path = files.write_atomic(str(tmp_path / "f"), "text")
  finally:
    os.umask(old)
  assert stat.S_IMODE(os.stat(path).st_mode) == mode
  assert open(path).read() == "text"
  assert os.listdir(tmp_path) == ["f"]  # no temporary file left


def test_write_atomic_keeps_an_exact_mode_whatever_the_umask(tmp_path):
  old = os.umask(0o077)
  try:
    path = files.write_atomic(str(tmp_path / "script.py"), b"x = 1\n",
                              0o750, exact_mode=True)
  finally:
    os.umask(old)
  assert stat.S_IMODE(os.stat(path).st_mode) == 0o750
  assert os.listdir(tmp_path) == ["script.py"]


def test_write_atomic_replaces_a_link_never_writes_through_it(tmp_path):
  outside = tmp_path / "outside"
  outside.write_text("precious")
  inside = tmp_path / "dir"
  inside.mkdir()
  link = inside / "report.html"
  link.symlink_to(outside)
  files.write_atomic(str(link), "page")
  assert outside.read_text() == "precious"
  assert not link.is_symlink() and link.read_text() == "page"
  dangling = inside / "dangling"
  dangling.symlink_to(tmp_path / "created-outside")
  files.write_atomic(str(dangling), "x")
  assert not (tmp_path / "created-outside").exists()


def test_open_lock_refuses_links_and_creates_nothing_outside(tmp_path):
  link = tmp_path / ".lock"
  link.symlink_to(tmp_path / "outside")
  with pytest.raises(files.FileRejected, match="symbolic link"):
    files.open_lock(str(link))
  assert not (tmp_path / "outside").exists()
  fifo = tmp_path / "fifo"
  os.mkfifo(fifo)
  with pytest.raises(files.FileRejected, match="FIFO"):
    files.open_lock(str(fifo))
  handle = files.open_lock(str(tmp_path / "lock"))
  os.close(handle)
  assert (tmp_path / "lock").is_file()


# --- statistics files -------------------------------------------------------


def _settings(shards=3, table="tbl_items"):
  return {"table": table, "vocabulary_size": 1000,
          "features": [["items", 0]], "partition_strategy": "div",
          "num_shards": shards}


def _stats(settings=None):
  stats = st.TableStatistics(settings or _settings(), 1.0)
  rng = np.random.RandomState(0)
  for _ in range(3):
    lengths = rng.randint(0, 4, 32)
    stats.observe(rng.randint(0, 1000, lengths.sum()), lengths)
  return stats


def _mutated(**changes):
  data = file_format.to_json(_stats())
  for dotted, value in changes.items():
    where = data
    *parents, last = dotted.split(".")
    for key in parents:
      where = where[key]
    where[last] = value
  return data


def _hostile_texts():
  """{case: file content} of the statistics cases of issue 35 (each kept
  under the name of `_settings()`'s file)."""
  good = file_format.to_json(_stats())
  heavy = _mutated()
  heavy["heavy_hitters"]["ids"][0][1] = 10**30
  many_shards = dict(good, settings=_settings(shards=3_000_000))
  many_shards["key"] = st.settings_key(many_shards["settings"])
  return {
      "huge-count": json.dumps(heavy),
      "infinite-lookups": json.dumps(good).replace(
          f'"lookups": {good["lookups"]}', '"lookups": Infinity'),
      "nested": "[" * 200_000 + "]" * 200_000,
      "negative": json.dumps(_mutated(lookups=-5, examples=-100, runs=-1)),
      "nan-rate": json.dumps(good).replace(
          f'"sampling_rate": {good["sampling_rate"]}', '"sampling_rate": NaN'),
      "bool-count": json.dumps(_mutated(runs=True)),
      "float-count": json.dumps(_mutated(lookups=float(good["lookups"]))),
      "shards": json.dumps(many_shards),
      "registers": json.dumps(_mutated(hll_registers=base64.b64encode(
          bytes([200]) * 4096).decode())),
      "unbalanced-load": json.dumps(_mutated(**{
          "shard_load.div": [good["lookups"] + 1, 0, 0]})),
      "utf8": b'\xff\xfe' + json.dumps(good).encode(),
      "duplicate-heavy": json.dumps(_mutated(**{
          "heavy_hitters.ids": [[1, 1], [1, 1]]})),
  }


@pytest.mark.parametrize("case", sorted(_hostile_texts()))
def test_a_hostile_statistics_file_is_a_warning_then_ignored(tmp_path, case):
  content = _hostile_texts()[case]
  path = tmp_path / store.file_name(_settings())
  (path.write_bytes if isinstance(content, bytes) else path.write_text)(
      content)
  with pytest.warns(RuntimeWarning, match=f"{path} is ignored: .+"):
    assert store.load(str(tmp_path), _settings()) is None
  # Adding to it replaces it with the new counts alone (valid JSON).
  with pytest.warns(RuntimeWarning, match="is ignored"):
    store.add_to_file(str(tmp_path), _stats())
  assert file_format.to_json(store.load(str(tmp_path), _settings())) == (
      file_format.to_json(_stats()))


def test_a_statistics_file_with_too_many_shards_is_refused_before_any_work(
    tmp_path):
  data = file_format.to_json(_stats())
  data["settings"] = _settings(shards=10**7)
  data["key"] = st.settings_key(data["settings"])
  with pytest.raises(ValueError, match="num_shards is 10000000, not in"):
    file_format.from_json(data)


@pytest.mark.parametrize("kind", ["fifo", "big", "symlink", "directory"])
def test_a_statistics_file_that_is_no_regular_small_file_is_ignored(
    tmp_path, kind):
  path = tmp_path / store.file_name(_settings())
  if kind == "fifo":
    os.mkfifo(path)
  elif kind == "big":
    with open(path, "wb") as f:
      f.truncate(200 * 2**20)  # sparse: refused by its size, not read
  elif kind == "symlink":
    target = tmp_path / "elsewhere"
    target.write_text(json.dumps(file_format.to_json(_stats())))
    path.symlink_to(target)
  else:
    path.mkdir()
  words = {"fifo": "a FIFO", "big": "more than the 16,777,216 allowed",
           "symlink": "a symbolic link", "directory": "a directory"}[kind]
  with pytest.warns(RuntimeWarning, match=f"is ignored: it .*{words}"):
    assert store.load(str(tmp_path), _settings()) is None
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    assert store.load_all(str(tmp_path)) == []
  assert [words in str(w.message) for w in caught] == [True]


def test_a_lock_link_is_refused_and_nothing_is_created_outside(tmp_path):
  (tmp_path / ".lock").symlink_to(tmp_path / "outside")
  with pytest.raises(files.FileRejected, match=r"lock file .*\.lock is "
                     "refused: it is a symbolic link"):
    store.add_to_file(str(tmp_path), _stats())
  assert not (tmp_path / "outside").exists()
  assert not os.path.exists(tmp_path / store.file_name(_settings()))


@pytest.mark.parametrize("mask, mode", [(0o077, 0o600), (0o022, 0o644)])
def test_statistics_files_follow_the_umask(tmp_path, mask, mode):
  old = os.umask(mask)
  try:
    path = store.add_to_file(str(tmp_path), _stats())
  finally:
    os.umask(old)
  assert stat.S_IMODE(os.stat(path).st_mode) == mode


@FAST
@hypothesis.given(hs.binary(max_size=400))
def test_random_bytes_in_a_statistics_file_are_ignored(tmp_path_factory,
                                                       data):
  directory = tmp_path_factory.mktemp("stats")
  (directory / store.file_name(_settings())).write_bytes(data)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", RuntimeWarning)
    assert store.load(str(directory), _settings()) is None


_JSON = hs.recursive(
    hs.none() | hs.booleans() | hs.integers(-2**70, 2**70) |
    hs.floats(allow_nan=True, allow_infinity=True) | hs.text(max_size=8),
    lambda inner: hs.lists(inner, max_size=4) | hs.dictionaries(
        hs.text(max_size=8), inner, max_size=4), max_leaves=12)
_FIELDS = ["settings", "key", "sampling_rate", "runs", "lookups", "examples",
           "hll_precision", "hll_registers", "heavy_hitters",
           "heavy_hitters.capacity", "heavy_hitters.ids", "ids_per_example",
           "shard_load", "shard_load.div", "settings.num_shards",
           "settings.vocabulary_size", "settings.features", "settings.table"]


@FAST
@hypothesis.given(hs.sampled_from(_FIELDS), _JSON)
def test_any_field_replaced_by_random_json_is_refused_or_valid(field, value):
  data = _mutated(**{field: value})
  try:
    stats = file_format.from_json(data)
  except ValueError:
    return
  # Accepted only as a valid file: it writes and reads back unchanged.
  again = json.loads(json.dumps(file_format.to_json(stats), allow_nan=False))
  assert file_format.to_json(file_format.from_json(again)) == (
      file_format.to_json(stats))


@FAST
@hypothesis.given(_JSON)
def test_random_json_is_no_statistics(value):
  with pytest.raises(ValueError):
    file_format.from_json(value)


# --- the profile command ----------------------------------------------------


def test_profile_survives_hostile_files_and_a_report_link(tmp_path, capsys):
  from estimator_spec import __main__ as cli
  directory = tmp_path / "profile"
  directory.mkdir()
  store.save(str(directory), _stats())
  for i, (case, content) in enumerate(sorted(_hostile_texts().items())):
    path = directory / f"tbl_x{i}-{case}.json"
    (path.write_bytes if isinstance(content, bytes) else path.write_text)(
        content)
  os.mkfifo(directory / "tbl_fifo-0000000000000000.json")
  outside = tmp_path / "outside.txt"
  outside.write_text("precious")
  (directory / "report.html").symlink_to(outside)
  code = cli.main(["profile", str(directory)])
  out, err = capsys.readouterr()
  assert code == 0, err
  assert outside.read_text() == "precious"
  assert "<html" in (directory / "report.html").read_text()
  assert "Traceback" not in err
  warned = [line for line in err.splitlines() if "warning:" in line]
  assert len(warned) == len(_hostile_texts()) + 1
  assert "tbl_items" in out


# --- the ps assignment file -------------------------------------------------

NUM_PS = 3


def _model():
  tables = {f"t{i}": es.TableConfig(v, 4) for i, v in enumerate((30, 2))}
  features = {f"f{i}": es.FeatureConfig(f"t{i}") for i in range(2)}
  return es.EmbeddingConfigSpec(
      table_to_config_dict=tables, feature_to_config_dict=features,
      optimization_parameters=es.AdagradParameters(0.1)).model


def _cluster(task_type="chief"):
  return cluster_lib.Cluster(task_type, 0, NUM_PS,
                             (("chief", 0), ("worker", 0)))


_ASSIGNMENTS = {
    "invalid-utf8": (b'{"t0": [0, 1, 2], "t1": [0, 1]}\xff', "not UTF-8"),
    "nested": ("[" * 200_000 + "]" * 200_000, "nests 200000 levels"),
    "booleans": ('{"t0": [0, 1, 2], "t1": [true, false]}',
                 "'t1': it is not a list of ps task indices"),
    "wrong-ps-count": ('{"t0": [0, 1], "t1": [0, 1]}',
                       "'t0': 2 partitions, not 3"),
    "out-of-range": ('{"t0": [0, 1, 3], "t1": [0, 1]}', r"not in \[0, 3\)"),
    "negative": ('{"t0": [0, 1, -1], "t1": [0, 1]}', r"not in \[0, 3\)"),
    "duplicates": ('{"t0": [0, 1, 1], "t1": [0, 1]}', "holds two partitions"),
    "floats": ('{"t0": [0, 1.0, 2], "t1": [0, 1]}', "not a list of ps task"),
    "strings": ('{"t0": "012", "t1": [0, 1]}', "not a list of ps task"),
    "other-tables": ('{"t0": [0, 1, 2], "x": [0, 1]}', "names the tables"),
    "not-an-object": ("[0, 1, 2]", "not a JSON object"),
    "invalid-json": ('{"t0": [0, 1, 2', "not valid JSON"),
    "empty": ("", "not valid JSON"),
}


@pytest.mark.parametrize("case", sorted(_ASSIGNMENTS))
def test_a_bad_ps_assignment_is_a_warning_and_the_chief_replaces_it(
    tmp_path, case):
  content, words = _ASSIGNMENTS[case]
  path = tmp_path / assignment_file.ASSIGNMENT_FILE
  (path.write_bytes if isinstance(content, bytes) else path.write_text)(
      content)
  model = _model()
  with pytest.warns(RuntimeWarning, match=f"{path} is not used: .*{words}"
                    ".* The chief writes a new one"):
    got = placement.resolve_ps_assignment(model, _cluster(), str(tmp_path),
                                          {}, wait_secs=1)
  assert got == placement.balanced_assignment(model, NUM_PS, {})
  assert json.loads(path.read_text()) == got


@pytest.mark.parametrize("kind", ["symlink", "fifo"])
def test_a_ps_assignment_that_is_no_regular_file_is_not_followed(tmp_path,
                                                                 kind):
  path = tmp_path / assignment_file.ASSIGNMENT_FILE
  outside = tmp_path / "outside.json"
  good = placement.balanced_assignment(_model(), NUM_PS, {})
  if kind == "symlink":
    outside.write_text(json.dumps(good))
    path.symlink_to(outside)
  else:
    os.mkfifo(path)
  with pytest.warns(RuntimeWarning, match="not a regular file"):
    placement.resolve_ps_assignment(_model(), _cluster(), str(tmp_path), {},
                                    wait_secs=1)
  assert not path.is_symlink() and json.loads(path.read_text()) == good
  if kind == "symlink":
    assert json.loads(outside.read_text()) == good  # untouched


def test_a_worker_warns_once_and_waits_for_the_chiefs_file(tmp_path):
  path = tmp_path / assignment_file.ASSIGNMENT_FILE
  path.write_text('{"t0": [true, false, 2], "t1": [0, 1]}')
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with pytest.raises(RuntimeError, match="waited 1 s for the chief"):
      placement.resolve_ps_assignment(_model(), _cluster("worker"),
                                      str(tmp_path), {}, wait_secs=1)
  messages = [str(w.message) for w in caught]
  assert len(messages) == 1 and "This task waits for the chief's" in (
      messages[0])
  assert path.read_text() == '{"t0": [true, false, 2], "t1": [0, 1]}'


# --- table names ------------------------------------------------------------


@pytest.mark.parametrize("name", ["a b", "/abs", "\u00e9", "a\\b", ".x", "..",
                                  "../x", "a//b", "a/", "_a", "a\n"])
def test_a_table_name_tf_cannot_scope_or_a_file_would_hide_is_refused(name):
  with pytest.raises(ValueError, match=r"table name .* is not allowed: a "
                     r"table name must match \[A-Za-z0-9\]"):
    es.EmbeddingConfigSpec(
        table_to_config_dict={name: es.TableConfig(10, 2)},
        feature_to_config_dict={"a": es.FeatureConfig(name)},
        optimization_parameters=es.AdagradParameters(0.1))


@pytest.mark.parametrize("name", ["a/b", "a.b", "a-b", "9a", "a>b", "T_1"])
def test_table_names_tf_scopes_are_accepted(name):
  spec = es.EmbeddingConfigSpec(
      table_to_config_dict={name: es.TableConfig(10, 2)},
      feature_to_config_dict={"a": es.FeatureConfig(name)},
      optimization_parameters=es.AdagradParameters(0.1))
  assert list(spec.model.tables) == [name]


def test_a_column_whose_table_name_is_refused_names_the_column():
  import tensorflow as tf
  column = tec.embedding_column(
      tf.feature_column.categorical_column_with_identity("user id", 10), 2)
  with pytest.raises(ValueError, match=r"`feature_columns`: column .*user "
                     r"id.* table name .*user id.* is not allowed"):
    es.EmbeddingConfigSpec(feature_columns=[column],
                           optimization_parameters=es.AdagradParameters(0.1))


# --- the compiled-kernel cache ----------------------------------------------

_FAKE_COMPILER = """#!/bin/sh
if [ "$1" = "--version" ]; then echo "fake-compiler 1"; exit 0; fi
while [ $# -gt 0 ]; do
  if [ "$1" = "-o" ]; then echo "library $$" > "$2"; fi
  shift
done
"""


@pytest.fixture(name="fake_cache")
def _fake_cache(tmp_path, monkeypatch):
  """The kernels' builder with a stand-in compiler (it writes a file where
  the library goes) and a fresh cache directory: the cache's checks without
  a real build."""
  from estimator_spec.engine.kernels import builder
  compiler = tmp_path / "fake-c++"
  compiler.write_text(_FAKE_COMPILER)
  compiler.chmod(0o755)
  cache = tmp_path / "cache"
  monkeypatch.setenv("CXX", str(compiler))
  monkeypatch.setenv(builder.CACHE_ENV, str(cache))
  return builder, cache


def test_a_built_library_has_its_digest_and_is_reused(fake_cache):
  builder, cache = fake_cache
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    path, fresh = builder._build()
    assert fresh
    again, fresh = builder._build()
  assert again == path and not fresh
  digest = open(path + builder.DIGEST_SUFFIX).read().strip()
  import hashlib
  assert digest == hashlib.sha256(open(path, "rb").read()).hexdigest()
  assert stat.S_IMODE(os.stat(cache).st_mode) & 0o077 == 0


@pytest.mark.parametrize("how", ["planted", "corrupt", "no-digest", "link"])
def test_a_library_this_library_did_not_build_is_rebuilt(fake_cache, how,
                                                         tmp_path):
  builder, _ = fake_cache
  path, _ = builder._build()
  if how == "planted":
    open(path, "w").write("someone else's library")
  elif how == "corrupt":
    with open(path, "r+b") as f:
      f.truncate(3)
  elif how == "no-digest":
    os.remove(path + builder.DIGEST_SUFFIX)
  else:
    elsewhere = tmp_path / "elsewhere.so"
    os.rename(path, elsewhere)
    os.symlink(elsewhere, path)
  words = {"planted": "differs from the digest", "corrupt": "differs from",
           "no-digest": "no digest was recorded",
           "link": "a symbolic link"}[how]
  with pytest.warns(RuntimeWarning, match=f"{path} is not loaded: .*{words}"
                    ".* It is rebuilt"):
    again, fresh = builder._build()
  assert again == path and fresh and not os.path.islink(path)
  assert open(path).read().startswith("library ")
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    assert builder._build() == (path, False)


def test_a_cache_others_can_write_is_not_used(fake_cache):
  builder, cache = fake_cache
  cache.mkdir(mode=0o777)
  cache.chmod(0o777)
  with pytest.warns(RuntimeWarning, match=r"kernel cache .*cache is not used:"
                    " others can write it \\(mode 777\\)"):
    path, fresh = builder._build()
  assert fresh and not path.startswith(str(cache))
  assert os.listdir(cache) == []


def test_a_cached_library_that_does_not_load_is_rebuilt(fake_cache,
                                                       monkeypatch):
  builder, _ = fake_cache
  path, _ = builder._build()
  loaded = []

  def load_op_library(library):
    if not loaded:
      loaded.append(None)
      raise OSError("invalid ELF header")
    loaded.append(library)
    return "module"

  monkeypatch.setattr(builder.tf, "load_op_library", load_op_library)
  with pytest.warns(RuntimeWarning, match=f"{path} does not load .*invalid "
                    "ELF header.*rebuilt"):
    assert builder.load() == "module"
  assert loaded == [None, path]


# --- checkpoints on the command line ----------------------------------------


def _cli(capsys, *argv):
  from estimator_spec import __main__ as cli
  code = cli.main([str(a) for a in argv])
  out, err = capsys.readouterr()
  return code, out, err


@pytest.fixture(name="cut_checkpoint", scope="module")
def _cut_checkpoint(tmp_path_factory):
  """A model directory whose checkpoint's data file is cut to 10%."""
  from tests import test_mid_level as ml
  directory = tmp_path_factory.mktemp("cut") / "model"
  prefix = ml.small_checkpoint(directory)
  data = [f for f in os.listdir(directory) if ".data-" in f][0]
  path = directory / data
  with open(path, "r+b") as f:
    f.truncate(os.path.getsize(path) // 10)
  return prefix


@pytest.mark.parametrize("command", ["rows", "export-mid-level"])
def test_a_cut_checkpoint_is_one_clean_line(cut_checkpoint, capsys,
                                            tmp_path, command):
  argv = [command, "tests.test_mid_level:small_spec", "--model-dir",
          os.path.dirname(cut_checkpoint)]
  argv += (["--table", "tbl_a", "--ids", "0-2"] if command == "rows" else
           ["--output", tmp_path / "out" / "emb"])
  code, out, err = _cli(capsys, *argv)
  assert code == 2 and out == ""
  error = [line for line in err.splitlines() if "error:" in line]
  assert len(error) == 1, err
  assert ("cannot read or write the checkpoint: Read less bytes than "
          "requested (OutOfRangeError)") in error[0]
  for stack_text in ("Detected at node", "File \"", "[[", "Traceback"):
    assert stack_text not in err
  assert not (tmp_path / "out").exists()


def test_a_state_file_naming_a_missing_checkpoint_says_so(tmp_path, capsys):
  (tmp_path / "checkpoint").write_text(
      'model_checkpoint_path: "model.ckpt-99"\n')
  code, _, err = _cli(capsys, "rows", "tests.test_mid_level:small_spec",
                      "--model-dir", tmp_path, "--table", "tbl_a", "--ids",
                      "0-2")
  assert code == 2 and len(err.splitlines()) == 1, err
  assert (f"the `checkpoint` state file of '{tmp_path}' names "
          f"'{tmp_path}/model.ckpt-99', which does not exist") in err


@pytest.mark.parametrize("kind", ["fifo", "huge"])
def test_a_state_file_that_is_no_small_regular_file_is_refused(tmp_path,
                                                              capsys, kind):
  state = tmp_path / "checkpoint"
  if kind == "fifo":
    os.mkfifo(state)
  else:
    with open(state, "wb") as f:
      f.truncate(2**21)
  code, _, err = _cli(capsys, "rows", "tests.test_mid_level:small_spec",
                      "--model-dir", tmp_path, "--table", "tbl_a", "--ids",
                      "0-2")
  assert code == 2 and len(err.splitlines()) == 1, err
  assert "`checkpoint` state file of" in err and "cannot be read (it " in err


# --- int64 ids for a column that declares strings ---------------------------


@pytest.mark.parametrize("make", [
    lambda fc: fc.categorical_column_with_hash_bucket("h", 7),
    lambda fc: fc.categorical_column_with_vocabulary_list("h", ["a", "b"]),
], ids=["hash-bucket", "vocabulary-list"])
def test_integer_ids_for_a_string_column_are_refused_as_tf_does(make):
  import tensorflow as tf
  from estimator_spec.engine import inputs
  fc = tf.feature_column
  words = "Column dtype and SparseTensors dtype must be compatible"
  ids = tf.SparseTensor([[0, 0], [1, 0]], tf.constant([3, 5], tf.int64),
                        [2, 1])
  with tf.Graph().as_default():  # TF's own column: the oracle
    with pytest.raises(ValueError, match=words):
      tf.compat.v1.feature_column.input_layer(
          {"h": ids}, [fc.embedding_column(make(fc), 2)])
  column = tec.embedding_column(make(fc), 2)
  spec = es.EmbeddingConfigSpec(
      feature_columns=[column],
      optimization_parameters=es.AdagradParameters(0.1))
  feature = spec.model.features["h"]
  table = spec.model.tables[feature.table]
  with tf.Graph().as_default():
    with pytest.raises(ValueError, match=f"Feature 'h': {words}. key: h, "
                       "column dtype: tf.string, tensor dtype: tf.int64"):
      inputs.read_feature(feature, table, spec.column_for("h"), {"h": ids},
                          "Feature 'h'")
    strings = tf.SparseTensor([[0, 0]], tf.constant(["x"]), [1, 1])
    assert inputs.read_feature(feature, table, spec.column_for("h"),
                               {"h": strings}, "Feature 'h'").transformed


# --- the statistics hook ------------------------------------------------------


class _Profiler:
  period = 1
  sampling_rate = 1.0

  def __init__(self, directory):
    self.directory = directory

  def settings(self, table):
    return _settings(table=table)


class _Session:
  """Gives every run the packed lookups of one sampled step."""

  def __init__(self, packed):
    self._packed = packed

  def run(self, fetches):
    del fetches
    return self._packed


def test_the_hook_keeps_its_counts_when_the_lock_is_a_link(tmp_path):
  import tensorflow as tf
  from estimator_spec.profiling import sampling
  hook = sampling.StatisticsHook(_Profiler(str(tmp_path)), ["tbl_items"],
                                 take=None)
  hook._new_delta()
  # One feature: example 0 looks up 3 twice, example 1 looks up 7. The
  # step's packed vector: 3 ids, batch 2, the ids, the example of each.
  step = tf.compat.v1.train.SessionRunContext(
      None, _Session(np.array([3, 2, 3, 3, 7, 0, 0, 1], np.int64)))
  for _ in range(2):
    hook.before_run(step)
    hook.after_run(step, None)
  (tmp_path / ".lock").symlink_to(tmp_path / "outside")
  hook.save()  # a warning in the log; the counts stay
  assert not (tmp_path / "outside").exists()
  os.remove(tmp_path / ".lock")
  hook.save()
  saved = store.load(str(tmp_path), _settings())
  assert saved.lookups == 6 and saved.examples == 4
  assert dict(saved.hottest()) == {3: 4, 7: 2}


@FAST
@hypothesis.given(hs.one_of(hs.binary(max_size=200),
                            _JSON.map(lambda v: json.dumps(v).encode())))
def test_random_content_of_the_ps_assignment_never_crashes_the_chief(
    tmp_path_factory, data):
  directory = tmp_path_factory.mktemp("assignment")
  (directory / assignment_file.ASSIGNMENT_FILE).write_bytes(data)
  model = _model()
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", RuntimeWarning)
    got = placement.resolve_ps_assignment(model, _cluster(), str(directory),
                                          {}, wait_secs=1)
  assert assignment_file.assignment_problem(model, NUM_PS, got) is None


def test_the_command_silences_tf_python_logs_unless_asked(tmp_path, capsys,
                                                          monkeypatch):
  import logging
  import tensorflow as tf
  (tmp_path / "checkpoint").write_text("not a checkpoint state {{{")
  records = []

  class Keep(logging.Handler):
    def emit(self, record):
      records.append(record.getMessage())

  handler = Keep(level=logging.DEBUG)
  tf.get_logger().addHandler(handler)
  before = tf.get_logger().level
  argv = ["rows", "tests.test_mid_level:small_spec", "--model-dir", tmp_path,
          "--table", "tbl_a", "--ids", "0"]
  try:
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
    code, _, err = _cli(capsys, *argv)
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "names no checkpoint (it is empty or not a checkpoint state)" in err
    assert records == []  # TF's own warning about the state file: silenced
    assert tf.get_logger().level == before  # and the level restored
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "0")  # the user asks for them
    assert _cli(capsys, *argv)[0] == 2
    assert records  # TF's warning reaches the user's handlers
  finally:
    tf.get_logger().removeHandler(handler)


@FAST
@hypothesis.given(hs.binary(max_size=200))
def test_random_bytes_in_a_state_file_are_a_clear_refusal(tmp_path_factory,
                                                         data):
  from estimator_spec.checkpoints import tables
  directory = tmp_path_factory.mktemp("state")
  (directory / "checkpoint").write_bytes(data)
  with pytest.raises(FileNotFoundError, match="`checkpoint` state file of"):
    tables.resolve_checkpoint(str(directory), "read_rows")


@pytest.mark.parametrize("which", ["index", "data"])
def test_a_checkpoint_file_that_is_a_fifo_is_refused_not_waited_on(
    tmp_path, capsys, which):
  from tests import test_mid_level as ml
  prefix = ml.small_checkpoint(tmp_path / "model")
  name = [f for f in os.listdir(tmp_path / "model")
          if f.startswith(os.path.basename(prefix) + f".{which}")][0]
  os.remove(tmp_path / "model" / name)
  os.mkfifo(tmp_path / "model" / name)
  code, _, err = _cli(capsys, "rows", "tests.test_mid_level:small_spec",
                      "--model-dir", tmp_path / "model", "--table", "tbl_a",
                      "--ids", "0")
  assert code == 2 and len(err.splitlines()) == 1, err
  assert (f"the checkpoint file {tmp_path / 'model' / name} is not a regular "
          "file (a FIFO or a device)") in err


def _break(directory, how):
  data = [f for f in os.listdir(directory) if ".data-" in f][0]
  data, index = directory / data, directory / "model.ckpt-5.index"
  if how == "index-cut":
    with open(index, "r+b") as f:
      f.truncate(os.path.getsize(index) // 2)
  elif how == "index-garbage":
    index.write_bytes(bytes(range(256)))
  elif how == "data-missing":
    os.remove(data)
  elif how == "data-empty":
    data.write_bytes(b"")
  else:  # a flipped byte: the checksum differs
    content = bytearray(data.read_bytes())
    content[10] ^= 0xFF
    data.write_bytes(bytes(content))


@pytest.mark.parametrize("how, words", [
    ("index-cut", "bad magic number"), ("index-garbage", "bad magic number"),
    ("data-missing", "No such file or directory"),
    ("data-empty", "Read less bytes than requested"),
    ("data-flipped", "Checksum does not match")])
def test_each_broken_checkpoint_is_one_clean_line(tmp_path, capsys, how,
                                                  words):
  from tests import test_mid_level as ml
  ml.small_checkpoint(tmp_path / "model")
  _break(tmp_path / "model", how)
  code, out, err = _cli(capsys, "rows", "tests.test_mid_level:small_spec",
                        "--model-dir", tmp_path / "model", "--table",
                        "tbl_a", "--ids", "0")
  assert code == 2 and out == "" and len(err.splitlines()) == 1, err
  assert "TensorFlow cannot read or write the checkpoint: " in err
  assert words in err
  for stack_text in ("Detected at node", "File \"", "[[", "Traceback"):
    assert stack_text not in err


@pytest.mark.parametrize("command, argv", [
    ("rows", ["--table", "tbl_a", "--ids", "0"]),
    ("export-mid-level", ["--output", "out/emb"]),
    ("convert", ["--to-strategy", "mod", "--to-shards", "2", "--output",
                 "out/ckpt"])])
def test_a_flipped_byte_in_a_table_read_from_its_file_is_one_clean_line(
    tmp_path, capsys, monkeypatch, command, argv):
  # A table bigger than one block (here 4 rows) is read from its data file
  # by the library itself, which checks its checksum as TF's reader does
  # (the flipped byte above): one error line naming the tensor (after the
  # progress line of a command that shows one), nothing written.
  from estimator_spec.checkpoints import bundle_index
  from estimator_spec.checkpoints import tables
  from tests import test_mid_level as ml
  prefix = ml.small_checkpoint(tmp_path / "model")
  name = "dense_features/a_embedding/embedding_weights"
  location = bundle_index.read_bundle(prefix).locations[
      (name, ((0, ml.V), (0, ml.D)))]
  content = bytearray((tmp_path / "model" / os.path.basename(
      location.path)).read_bytes())
  content[location.offset + 7] ^= 0x01
  (tmp_path / "model" / os.path.basename(location.path)).write_bytes(
      bytes(content))
  monkeypatch.setattr(tables, "_BLOCK_BYTES", 4 * ml.D * 4)
  argv = [a.replace("out/", f"{tmp_path}/out/") for a in argv]
  code, out, err = _cli(capsys, command, "tests.test_mid_level:small_spec",
                        "--model-dir", tmp_path / "model", *argv)
  error = [line for line in err.splitlines() if "error:" in line]
  assert code == 2 and out == "" and len(error) == 1, err
  assert (f"checkpoint {prefix}: tensor '{name}', its stored slice of rows "
          f"[0, {ml.V}): ") in error[0]
  assert "do not have the CRC32C the index records" in error[0]
  for stack_text in ("Detected at node", "File \"", "Traceback"):
    assert stack_text not in err
  assert not (tmp_path / "out").exists()


def test_the_ps_assignment_is_written_with_the_umask(tmp_path):
  old = os.umask(0o077)
  try:
    placement.resolve_ps_assignment(_model(), _cluster(), str(tmp_path), {},
                                    wait_secs=1)
  finally:
    os.umask(old)
  path = tmp_path / assignment_file.ASSIGNMENT_FILE
  assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
  assert os.listdir(tmp_path) == [assignment_file.ASSIGNMENT_FILE]


def test_the_command_line_prints_no_tf_log_lines(tmp_path):
  # The package sets TF's C++ log level before TF loads under
  # `python -m estimator_spec` (unless the user set it).
  env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
  result = subprocess.run(
      [sys.executable, "-m", "estimator_spec", "profile", str(tmp_path)],
      env=env, capture_output=True, text=True, timeout=300, check=False)
  assert result.returncode == 2
  assert result.stderr.splitlines() == [
      f"python -m estimator_spec profile: error: no lookup statistics files "
      f"in {tmp_path} (a training run with profile_data_directory writes "
      "them)."]


_RESTORE_FROM_A_FIFO = r"""
import glob, os, sys
import numpy as np
import tensorflow as tf
import estimator_spec as es
import tpu_embedding_columns as tec

column = tec.embedding_column(
    tf.feature_column.categorical_column_with_identity("a", 10), 2)

def model_fn(features, labels, mode, params):
  x = tf.compat.v1.feature_column.input_layer(features, [column])
  loss = tf.reduce_mean(tf.square(tf.compat.v1.layers.dense(x, 1) - labels))
  train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
      loss, tf.compat.v1.train.get_global_step())
  return es.TPUEstimatorSpec(mode, loss=loss, train_op=train_op)

def input_fn(params):
  ids = np.arange(16).reshape(8, 2) % 10
  return tf.data.Dataset.from_tensor_slices(
      ({"a": ids}, np.ones((8, 1), np.float32))).repeat().batch(
          params["batch_size"], drop_remainder=True)

def estimator():
  return es.TPUEstimator(
      model_fn=model_fn, model_dir=sys.argv[1], use_tpu=False,
      train_batch_size=4, embedding_config_spec=es.EmbeddingConfigSpec(
          feature_columns=[column],
          optimization_parameters=es.AdagradParameters(0.1)))

estimator().train(input_fn, max_steps=1)
data = glob.glob(os.path.join(sys.argv[1], "model.ckpt-1.data-*"))[0]
os.remove(data)
os.mkfifo(data)
try:
  estimator().train(input_fn, max_steps=2)
except ValueError as error:
  print("REFUSED", error)
"""


def test_training_refuses_a_checkpoint_file_that_is_a_fifo(tmp_path):
  result = subprocess.run(
      [sys.executable, "-c", _RESTORE_FROM_A_FIFO, str(tmp_path / "m")],
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"), capture_output=True,
      text=True, timeout=240, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "REFUSED TPUEstimator.train: the checkpoint file" in result.stdout
  assert "is not a regular file (a FIFO or a device)" in result.stdout


_STATISTICS_FIFO = r"""
import faulthandler, glob, json, os, sys, warnings
import numpy as np
import tensorflow as tf
import estimator_spec as es
import tpu_embedding_columns as tec

# Should a file be waited on, the traceback shows where.
faulthandler.dump_traceback_later(200, exit=True)
model_dir, profile_dir = sys.argv[1], sys.argv[2]
column = tec.embedding_column(
    tf.feature_column.categorical_column_with_identity("a", 10), 2)

def model_fn(features, labels, mode, params):
  x = tf.compat.v1.feature_column.input_layer(features, [column])
  loss = tf.reduce_mean(tf.square(tf.compat.v1.layers.dense(x, 1) - labels))
  train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
      loss, tf.compat.v1.train.get_global_step())
  return es.TPUEstimatorSpec(mode, loss=loss, train_op=train_op)

def input_fn(params):
  ids = np.arange(16).reshape(8, 2) % 9 + 1  # no 0: every id is looked up
  return tf.data.Dataset.from_tensor_slices(
      ({"a": ids}, np.ones((8, 1), np.float32))).repeat().batch(
          params["batch_size"], drop_remainder=True)

def estimator():
  return es.TPUEstimator(
      model_fn=model_fn, model_dir=model_dir, use_tpu=False,
      train_batch_size=4, profile_sampling_rate=1.0,
      embedding_config_spec=es.EmbeddingConfigSpec(
          feature_columns=[column], profile_data_directory=profile_dir,
          optimization_parameters=es.AdagradParameters(0.1)))

estimator().train(input_fn, max_steps=1)
[path] = glob.glob(os.path.join(profile_dir, "*.json"))
os.remove(path)
os.mkfifo(path)  # nobody writes it: an open that waits would wait for ever
with warnings.catch_warnings(record=True) as caught:
  warnings.simplefilter("always")
  estimator().train(input_fn, max_steps=3)
for warning in caught:
  print("WARNING", warning.message)
print("STEP", tf.train.load_variable(model_dir, "global_step"))
print("FILE", path, os.path.isfile(path) and not os.path.islink(path))
print("LISTING", json.dumps(sorted(os.listdir(profile_dir))))
with open(path) as f:
  print("STATISTICS", json.dumps({k: v for k, v in json.load(f).items()
                                  if k in ("runs", "lookups", "examples")}))
"""


def test_training_goes_on_past_a_statistics_file_that_is_a_fifo(tmp_path):
  # A FIFO planted under the name of a table's statistics file: train()
  # reads that file at start-up (the report) and at each save. It is
  # refused without waiting, with a warning naming it and saying what
  # happens; the run trains, and its own statistics replace the FIFO.
  result = subprocess.run(
      [sys.executable, "-c", _STATISTICS_FIFO, str(tmp_path / "m"),
       str(tmp_path / "profile")],
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"), capture_output=True,
      text=True, timeout=240, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  lines = result.stdout.splitlines()
  path = next(line.split()[1] for line in lines if line.startswith("FILE"))
  warned = [line for line in lines
            if line.startswith("WARNING Lookup statistics")]
  assert warned, result.stdout
  for line in warned:
    assert line == (
        f"WARNING Lookup statistics file {path} is ignored: it is a FIFO, "
        "not a regular file. Training goes on; the file is replaced when "
        "statistics are next saved.")
  assert "STEP 3" in lines
  assert f"FILE {path} True" in lines
  assert f'LISTING [".lock", "{os.path.basename(path)}"]' in lines
  # The second run's counts alone (two steps of 4 examples of 2 ids): the
  # first run's were in the file the FIFO replaced.
  assert lines[-1] == 'STATISTICS {"runs": 1, "lookups": 16, "examples": 8}'
