"""One record per optimizer class (estimator_spec/engine/rules.py).

An optimizer class's rule, fused shortcut and compiled kernel are
registered together and found by the exact class: a subclass of
AdagradParameters with its own record runs its own rule (neither Adagrad's
compiled kernel nor its fused kernel), and a subclass without one is
refused, with a message saying how to register, before any table changes.
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest
import tensorflow as tf

import estimator_spec as es
from estimator_spec.engine import HostEmbeddingEngine
from estimator_spec.engine import pipeline as pipeline_lib
from estimator_spec.engine import rules
from tests import test_engine_eager as eager
from tests.ragged import sparse_value


class SignAdagrad(es.AdagradParameters):
  """Adagrad's arguments and slot, a rule of its own (below)."""


class PlainAdagrad(es.AdagradParameters):
  """A subclass that registers nothing."""


def sign_rule(w, slots, g, lr, optimizer):
  """w -= lr * sign(g); the accumulator keeps its value."""
  del optimizer
  return w - lr * tf.sign(g), {"accumulator": slots["accumulator"]}


@pytest.fixture(name="registered")
def registered_fixture(monkeypatch):
  """SignAdagrad's record, in a copy of the registry the test restores."""
  monkeypatch.setattr(rules, "RECORDS", dict(rules.RECORDS))
  rules.register(SignAdagrad)(sign_rule)
  return rules.RECORDS[SignAdagrad]


def test_every_library_optimizer_has_its_own_record():
  for cls in es.ALL_OPTIMIZERS:
    record = rules.RECORDS[cls]
    assert record is rules.record_for(cls(0.1, **_required(cls))), cls
  shortcuts = {cls.__name__: (record.fused is not None, record.compiled)
               for cls, record in rules.RECORDS.items()
               if record.fused is not None or record.compiled is not None}
  assert shortcuts == {"AdagradParameters": (True, "adagrad"),
                       "StochasticGradientDescentParameters": (True, "sgd")}


def _required(cls):
  return {"MomentumParameters": {"momentum": 0.9},
          "AdagradMomentumParameters": {"momentum": 0.9},
          "RMSPropParameters": {"rho": 0.9, "momentum": 0.9, "epsilon": 1.0},
         }.get(cls.__name__, {})


def test_a_subclass_with_its_own_record_gets_only_that_record(registered):
  pipeline = pipeline_lib.UpdatePipeline.of(
      eager.spec_of(SignAdagrad(0.1)).model, "t")
  assert pipeline.rule is sign_rule is registered.rule
  assert pipeline.fused is None and pipeline.compiled is None


def _engine(optimizer):
  """An eager engine of one partition per table, tables at their start."""
  config = es.EmbeddingConfig(eager.spec_of(optimizer), batch_size=eager.BATCH)
  engine = HostEmbeddingEngine(config, num_shards=1)
  engine.create_variables()
  eager.set_initial_tables(engine, lambda op: op)
  return engine


def _read(engine):
  return eager.state(engine, lambda t: {k: v.numpy() for k, v in t.items()})


def _step(engine):
  """The first step of `eager.BATCHES` with its activation gradients."""
  result = engine.lookup({
      k: tf.SparseTensor(*sparse_value(eager.BATCHES[0][k], np.int64))
      for k in "fgh"})
  grads = {k: tf.constant(v) for k, v in eager.activation_grads(0).items()}
  engine.apply_gradients(result, grads, tf.constant(0, tf.int64))


def test_a_subclass_with_its_own_record_trains_by_its_own_rule(registered):
  del registered
  engine = _engine(SignAdagrad(0.1))
  before = _read(engine)
  _step(engine)
  after = _read(engine)
  adagrad = _engine(es.AdagradParameters(0.1))
  _step(adagrad)
  assert not np.array_equal(after["t"], _read(adagrad)["t"])
  # Every row the step touched moved by lr times the sign of its summed
  # gradient: each moved entry by 0.1, never by Adagrad's scaled step.
  for table in ("t", "s"):
    moved = after[table] != before[table]
    assert moved.any(), table
    np.testing.assert_allclose(
        np.abs(after[table] - before[table])[moved], 0.1, rtol=1e-5)
    np.testing.assert_array_equal(after[f"{table}/accumulator"],
                                  before[f"{table}/accumulator"])


def test_a_subclass_without_a_record_is_refused_by_name():
  with pytest.raises(TypeError) as info:
    pipeline_lib.UpdatePipeline.of(eager.spec_of(PlainAdagrad(0.1)).model,
                                   "t")
  message = str(info.value)
  assert message.startswith("PlainAdagrad has no update rule")
  assert "@estimator_spec.engine.rules.register(PlainAdagrad)" in message
  assert "base class AdagradParameters is not inherited" in message


def test_a_subclass_without_a_record_is_refused_before_any_variable():
  """The engine builds a table's pipeline before its variables: nothing is
  made, so nothing can change."""
  config = es.EmbeddingConfig(eager.spec_of(PlainAdagrad(0.1)),
                              batch_size=eager.BATCH)
  engine = HostEmbeddingEngine(config, num_shards=1)
  with pytest.raises(TypeError, match="PlainAdagrad has no update rule"):
    engine.create_variables()
  assert engine.created_tables() == []
