"""estimator_spec/tf1_names.py holds what TF 2.15 says: the names of
`tf.compat.v1` (TF 1.x's API) that TF 2.15's `tf` lacks, as
tools/tf1_names.py writes them."""
import pytest
import tensorflow as tf

from estimator_spec import tf1_names
from tools import tf1_names as generator


@pytest.mark.tf215
def test_the_table_is_what_tf_215_lacks():
  assert tf1_names.MISSING == {
      module: frozenset(names) for module, names in
      generator.missing_names(tf.compat.v1, tf).items()}


@pytest.mark.tf215
def test_the_generated_source_is_the_module():
  with open(tf1_names.__file__, encoding="utf-8") as handle:
    text = handle.read()
  assert text == generator.source(generator.missing_names(tf.compat.v1, tf),
                                  text)


@pytest.mark.parametrize("dotted,prefix", [
    ("logging.info", "logging"),
    ("gfile.Exists", "gfile"),
    ("train.AdamOptimizer", "train.AdamOptimizer"),
    ("train.AdamOptimizer.minimize", "train.AdamOptimizer"),
    ("Session", "Session"),
    ("contrib.layers.fully_connected", "contrib"),
    ("saved_model.tag_constants.SERVING", "saved_model.tag_constants"),
    ("nn.rnn_cell.LSTMCell", "nn.rnn_cell"),
    ("train.Checkpoint", None),
    ("compat.v1.logging.info", None),
    ("io.gfile.exists", None),
    ("nn.relu", None),
])
def test_tf1_prefix(dotted, prefix):
  assert tf1_names.tf1_prefix(dotted) == prefix


def test_tf2_keeps_what_tf1_moved_under_compat_v1():
  for old, new in tf1_names.MOVED_TO_COMPAT_V1.items():
    assert tf1_names.tf1_prefix(old) is not None, old
    obj = tf.compat.v1
    for part in new.split("."):
      obj = getattr(obj, part)
    assert obj is not None
