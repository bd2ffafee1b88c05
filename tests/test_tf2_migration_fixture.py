"""docs/tf2_migration.md's TF2 steps on every TensorFlow, from saved outputs.

The page's estimator half needs TF 2.15; its TF2 half (restore the
exported checkpoint into `HostTPUEmbedding`, look up, train one step, serve
with TF's `TPUEmbeddingForServing`) must work on current TensorFlow too.
tests/data/tf2_migration/ holds what tests/tf2_migration_fixture.py wrote
on TF 2.15: the estimator's checkpoint exported by
`export_mid_level_checkpoint`, one batch of ids, a fixed activation
gradient, and the lookups and the tables and Adagrad accumulators after
one step computed there. Here, in both environments:

- the checkpoint restores completely into `HostTPUEmbedding` built from
  `interop.to_mid_level` of the same spec, and the lookups equal the saved
  ones;
- one `apply_gradients` with the saved gradient gives the saved tables and
  accumulators;
- TF's `TPUEmbeddingForServing` restores it completely and looks up the
  same activations.

On TF 2.15 the generator runs again into a temporary directory and must
write the checked-in fixture (same checkpoint keys, same numbers), so the
fixture cannot silently drift from the code (`tf215`).
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # pylint: disable=g-import-not-at-top
import pytest
import tensorflow as tf

import estimator_spec as es
from estimator_spec import interop
from tests import tf2_migration_fixture as fixture

PREFIX = str(fixture.DIRECTORY / fixture.PREFIX)
# Across TensorFlow versions: the same float32 operations, possibly other
# kernels.
TOLERANCE = dict(rtol=1e-6, atol=1e-7)


def _expected():
  with np.load(fixture.DIRECTORY / fixture.EXPECTED) as saved:
    return {key: saved[key] for key in saved.files}


def _ids(expected):
  return {name: fixture.as_sparse(expected[f"ids/{name}"])
          for name in fixture.FEATURES}


def _restored():
  config = interop.to_mid_level(fixture.spec())
  host = es.HostTPUEmbedding(*config)
  status = tf.train.Checkpoint(embedding=host).restore(PREFIX)
  host.build()
  status.assert_consumed()
  return config, host


def test_the_fixture_is_checked_in_and_small():
  names = sorted(p.name for p in fixture.DIRECTORY.iterdir())
  assert fixture.EXPECTED in names
  assert f"{fixture.PREFIX}.index" in names
  assert any(n.startswith(f"{fixture.PREFIX}.data-") for n in names)
  total = sum(p.stat().st_size for p in fixture.DIRECTORY.iterdir())
  assert total < 32_000, total


def test_config_matches_the_checkpoint_and_the_saved_arrays():
  config = interop.to_mid_level(fixture.spec())
  assert sorted(config.feature_config) == sorted(fixture.FEATURES)
  expected = _expected()
  assert sorted(k for k in expected if k.startswith("after/")) == sorted(
      f"after/{t}{s}" for t in config.tables for s in ("", "/accumulators"))
  keys = {name for name, _ in tf.train.list_variables(PREFIX)}
  for table in config.tables:
    for slot in ("", ".Saccumulators"):
      assert f"embedding/{table}{slot}/.ATTRIBUTES/VARIABLE_VALUE" in keys


def test_lookups_of_the_restored_checkpoint_equal_the_saved_ones():
  expected = _expected()
  config, host = _restored()
  host.enqueue(_ids(expected), training=False)
  activations = host.dequeue()
  for name in config.feature_config:
    np.testing.assert_allclose(activations[name], expected[f"lookups/{name}"],
                               err_msg=name, **TOLERANCE)
  # The sequence feature: [batch, max_sequence_length, dim], zeros past an
  # example's last id.
  clicked = expected["ids/clicked_items"]
  assert activations["clicked_items"].shape == (fixture.BATCH, 3, 4)
  for example, ids in enumerate(clicked):
    present = int((ids >= 0).sum())
    assert not activations["clicked_items"][example, present:].numpy().any()


def test_one_step_gives_the_saved_tables_and_accumulators():
  expected = _expected()
  config, host = _restored()
  before = fixture.state(host, config)
  host.enqueue(_ids(expected))
  host.dequeue()
  host.apply_gradients({name: tf.constant(expected[f"grads/{name}"])
                        for name in config.feature_config})
  after = fixture.state(host, config)
  assert sorted(after) == sorted(k for k in expected if k.startswith("after/"))
  for key, value in after.items():
    np.testing.assert_allclose(value, expected[key], err_msg=key, **TOLERANCE)
    assert (value != before[key]).any(), f"{key}: the step changed nothing"


def test_tpu_embedding_for_serving_restores_it_and_looks_up_the_same():
  expected = _expected()
  serving = tf.tpu.experimental.embedding.TPUEmbeddingForServing(
      *interop.to_mid_level(fixture.spec(), for_serving=True))
  serving.build()
  tf.train.Checkpoint(embedding=serving).restore(PREFIX).assert_consumed()
  served = serving(_ids(expected))
  for name in fixture.FEATURES:
    np.testing.assert_allclose(served[name], expected[f"lookups/{name}"],
                               err_msg=name, **TOLERANCE)


@pytest.mark.tf215
@pytest.mark.slow
def test_the_generator_writes_the_checked_in_fixture(tmp_path):
  fixture.generate(tmp_path)
  assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
      p.name for p in fixture.DIRECTORY.iterdir())
  regenerated = dict(np.load(tmp_path / fixture.EXPECTED))
  expected = _expected()
  assert sorted(regenerated) == sorted(expected)
  for key, value in expected.items():
    assert regenerated[key].shape == value.shape, key
    assert regenerated[key].dtype == value.dtype, key
    np.testing.assert_allclose(regenerated[key], value, rtol=1e-6, atol=1e-7,
                               err_msg=key)
  new = tf.train.load_checkpoint(str(tmp_path / fixture.PREFIX))
  old = tf.train.load_checkpoint(PREFIX)
  keys = sorted(new.get_variable_to_shape_map())
  assert keys == sorted(old.get_variable_to_shape_map())
  for key in keys:
    if key.startswith("embedding/"):
      np.testing.assert_allclose(new.get_tensor(key), old.get_tensor(key),
                                 rtol=1e-6, atol=1e-7, err_msg=key)
