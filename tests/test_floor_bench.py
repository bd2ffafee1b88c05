"""bench/floor_bench.py: the floor loop (bench/floor_loop.cc) does the
engine's work. On a table of 10,000 rows and a few of the bench's batches,
from the same table, it ends with the table and Adagrad accumulator the
engine's training steps give (float tolerance: the floor may contract
a + g * g into one fused multiply-add), touches only the rows the batches
hold, and counts the batches' distinct ids. No timing.
"""
import json
import subprocess

import numpy as np
import pytest

from bench import floor_bench
from estimator_spec.engine import kernels

ROWS = 10_000
STEPS = 3


@pytest.fixture(scope="module")
def batches(tmp_path_factory):
  directory = tmp_path_factory.mktemp("floor")
  ids, grad = floor_bench.make_batches(ROWS, STEPS)
  init = np.random.RandomState(2).uniform(
      -0.1, 0.1, (ROWS, floor_bench.DIMENSION)).astype(np.float32)
  init_path = str(directory / "init.bin")
  init.tofile(init_path)
  return {"binary": floor_bench.compile_floor(str(directory)),
          "paths": floor_bench.write_batches(str(directory), ids, grad),
          "ids": ids, "grad": grad, "init": init, "init_path": init_path,
          "directory": directory}


def _floor(batches, rows=ROWS):
  """(floor's result dict, table, accumulator) after STEPS steps."""
  dump = str(batches["directory"] / "dump.bin")
  done = subprocess.run(
      floor_bench.floor_command(batches["binary"], batches["paths"], rows, 0,
                                STEPS, init=batches["init_path"], dump=dump),
      capture_output=True, text=True, check=True)
  (line,) = [l for l in done.stdout.splitlines()
             if l.startswith(floor_bench.MARK)]
  state = np.fromfile(dump, np.float32).reshape(2, rows,
                                                floor_bench.DIMENSION)
  return json.loads(line[len(floor_bench.MARK):]), state[0], state[1]


def _engine(batches, monkeypatch):
  """(table, accumulator) of the engine after STEPS steps."""
  monkeypatch.setenv(kernels.ENV, "1")
  step = floor_bench.EngineStep(ROWS, batches["ids"], batches["grad"])
  with step.session() as sess:
    sess.run(step.table.assign(batches["init"]))
    for _ in range(STEPS):
      sess.run(step.train_op)
    return sess.run([step.table, step.accumulator])


def test_the_floor_trains_the_table_as_the_engine_does(batches, monkeypatch):
  _, floor_table, floor_acc = _floor(batches)
  engine_table, engine_acc = _engine(batches, monkeypatch)
  np.testing.assert_allclose(floor_acc, engine_acc, rtol=1e-5, atol=0)
  np.testing.assert_allclose(floor_table, engine_table, rtol=1e-5, atol=1e-7)
  touched = np.zeros(ROWS, bool)
  touched[batches["ids"].ravel()] = True
  # The comparison is not idle: every touched row moved, no other did.
  assert np.all(np.any(floor_table[touched] != batches["init"][touched],
                       axis=1))
  np.testing.assert_array_equal(floor_table[~touched],
                                batches["init"][~touched])
  np.testing.assert_array_equal(floor_acc[~touched],
                                np.float32(floor_bench.INITIAL_ACCUMULATOR))


def test_the_floor_counts_each_batchs_distinct_ids(batches):
  result, _, _ = _floor(batches)
  expected = np.mean([len(np.unique(b)) for b in batches["ids"]])
  assert result["distinct_ids"] == pytest.approx(expected, abs=0.05)
  assert result["steps"] == STEPS


def test_the_floor_refuses_ids_outside_the_table(batches):
  largest = int(batches["ids"].max())
  with pytest.raises(subprocess.CalledProcessError) as raised:
    _floor(batches, rows=largest)
  assert "an id is outside [0, ROWS)" in raised.value.stderr
