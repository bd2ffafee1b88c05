"""The same programs give the same numbers on both stacks (docs/estimator.md,
'Two stacks').

Runs in .venv (TF 2.15, tensorflow-estimator) and drives the other stack
through .venv-tf2's interpreter (TF 2.21, tf_keras, TF_USE_LEGACY_KERAS=1),
which `make test` builds first (`ESTIMATOR_SPEC_TF2_PYTHON` names another
one). Each step runs tests/two_stacks.py's actions in a process of one
stack, on the two programs it holds (the example DLRM model, and a program
written the way public TPU code is: TFRecords, PER_HOST_V2, host_call,
scaffold_fn):

1. TF 2.15 trains each program 2 steps from scratch (the TPU-style one
   with scaffold_fn taking its top layer from another checkpoint); the
   model directory is copied for each stack.
2. Each stack trains its copy 6 more steps: every variable (tables and
   their Adagrad slots, dense weights and their Adam slots, the global
   step) must match within 1e-6 relative; so must the metrics of
   evaluate, the predictions, the events host_call writes. TF 2.15 with
   this library's Estimator framework under the TPUEstimator
   (`ESTIMATOR_SPEC_FRAMEWORK=own`) must match TF 2.15 with
   tensorflow-estimator's exactly.
3. Each stack takes the other's checkpoint: it evaluates it (the same
   metrics as its writer's), resumes training from it, and exports it;
   each SavedModel runs in TensorFlow alone, without this library, on both
   stacks, and serves the predictions.
"""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tests import two_stacks

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAMS = ("dlrm", "tpu_style")
START_STEPS = 2
STEPS = 6
RESUME_STEPS = 2
# TF 2.21's float32 kernels round differently from TF 2.15's; over the run
# (8 Adam and Adagrad steps) the largest difference, relative to each
# variable's largest value, measured 4.95e-7 and 1.12e-6 in two runs
# (`bottom_0/bias/Adam`, whose moments are the smallest): a few float32
# roundings (2**-23 = 1.19e-7), bounded here at 32 of them.
RTOL = 32 * 2.0**-23

pytestmark = [pytest.mark.tf215, pytest.mark.slow]


# How each stack runs: (interpreter, environment variables it needs).
# "2.15-own" is TF 2.15 with this library's Estimator framework under the
# TPUEstimator instead of tensorflow-estimator's (`estimator/stack.py`).
def _interpreters():
  other = os.environ.get("ESTIMATOR_SPEC_TF2_PYTHON") or os.path.join(
      REPO, ".venv-tf2", "bin", "python")
  if not os.access(other, os.X_OK):
    pytest.fail(f"{other} is missing: this test runs the programs on TF "
                "2.21 too; build it with `make venv-tf2` (`make test` "
                "does).", pytrace=False)
  return {"2.15": (sys.executable, {}),
          "2.15-own": (sys.executable, {"ESTIMATOR_SPEC_FRAMEWORK": "own"}),
          "2.21": (other, {"TF_USE_LEGACY_KERAS": "1"})}


def _start(interpreter, actions, directory, name):
  """Starts one process running `actions`; returns (process, result
  path)."""
  python, variables = interpreter
  request = os.path.join(directory, f"{name}.request.json")
  result = os.path.join(directory, f"{name}.result.json")
  with open(request, "w", encoding="utf-8") as out:
    json.dump({"actions": actions}, out)
  env = {k: v for k, v in os.environ.items()
         if k not in ("PYTHONHOME", "ESTIMATOR_SPEC_FRAMEWORK",
                      "TF_USE_LEGACY_KERAS")}
  env.update(PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2", **variables)
  process = subprocess.Popen(
      [python, "-m", "tests.two_stacks", request, result], cwd=REPO,
      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  return process, result


def _finish(started, name):
  process, result = started
  try:
    output, _ = process.communicate(timeout=900)
  except subprocess.TimeoutExpired:
    process.kill()
    output, _ = process.communicate()
    pytest.fail(f"{name} did not finish in 900 s:\n{output[-4000:]}")
  assert process.returncode == 0, f"{name} failed:\n{output[-6000:]}"
  with open(result, encoding="utf-8") as results:
    return json.load(results)["results"]


def _run_all(steps, directory):
  """Runs {name: (interpreter, actions)} at once (the stacks side by side);
  returns {name: results}."""
  started = {name: _start(interpreter, actions, directory, name)
             for name, (interpreter, actions) in steps.items()}
  return {name: _finish(process, name) for name, process in started.items()}


def _train_and_read(stack, root, program, data):
  model_dir = os.path.join(root, f"{program}-{stack}")
  return [
      dict(do="train", program=program, model_dir=model_dir,
           steps=STEPS, **data),
      dict(do="variables", model_dir=model_dir,
           out=os.path.join(root, f"{program}-{stack}.npz")),
      dict(do="evaluate", program=program, model_dir=model_dir, steps=2,
           name="own", **data),
      dict(do="predict", program=program, model_dir=model_dir, count=16,
           **data),
      dict(do="export", program=program, model_dir=model_dir,
           examples_out=os.path.join(root, f"{program}-examples.json"),
           **data),
      dict(do="events", dir=os.path.join(model_dir, "host")),
  ]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  interpreters = _interpreters()
  root = str(tmp_path_factory.mktemp("two_stacks"))
  records = os.path.join(root, "records")
  two_stacks.write_records(records)
  data = {"data_dir": records}
  init = os.path.join(root, "init")
  start = _run_all({"start": (interpreters["2.15"], [
      dict(do="train", program="tpu_style", model_dir=init, steps=3, **data)
  ] + [dict(do="train", program=p, model_dir=os.path.join(root, f"{p}-0"),
            steps=START_STEPS, init_checkpoint=init, **data)
       for p in PROGRAMS])}, root)["start"]
  for program in PROGRAMS:
    for stack in interpreters:
      shutil.copytree(os.path.join(root, f"{program}-0"),
                      os.path.join(root, f"{program}-{stack}"))
  trained = _run_all({stack: (interpreter, [
      action for program in PROGRAMS
      for action in _train_and_read(stack, root, program,
                                    dict(data, init_checkpoint=init))])
                      for stack, interpreter in interpreters.items()}, root)
  return dict(root=root, init=init, data=data, start=start, trained=trained,
              interpreters=interpreters)


def _by_program(results):
  """{program: {action: result}} of one process's `_train_and_read`s."""
  per = len(results) // len(PROGRAMS)
  names = ("train", "variables", "evaluate", "predict", "export", "events")
  return {program: dict(zip(names, results[i * per:(i + 1) * per]))
          for i, program in enumerate(PROGRAMS)}


def _npz(path):
  with np.load(path) as values:
    return {name.replace("|", "/"): values[name] for name in values.files}


def _relative_difference(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  scale = max(float(np.max(np.abs(b))) if b.size else 0.0, 1e-12)
  return float(np.max(np.abs(a - b))) / scale if b.size else 0.0


# Against TF 2.15 with tensorflow-estimator: TF 2.21 within RTOL (its
# kernels round the dense layers' float32 sums differently), TF 2.15 on this
# library's framework exactly (the same graph, built in the same order).
TOLERANCES = [("2.21", RTOL), ("2.15-own", 0.0)]


@pytest.mark.parametrize("stack,rtol", TOLERANCES)
@pytest.mark.parametrize("program", PROGRAMS)
def test_both_stacks_train_to_the_same_variables(runs, program, stack,
                                                  rtol):
  root = runs["root"]
  ours = _by_program(runs["trained"]["2.15"])[program]
  theirs = _by_program(runs["trained"][stack])[program]
  assert ours["train"]["digest"] == theirs["train"]["digest"]  # same data
  assert ours["train"]["step"] == theirs["train"]["step"] == START_STEPS + (
      STEPS)
  old = _npz(os.path.join(root, f"{program}-2.15.npz"))
  new = _npz(os.path.join(root, f"{program}-{stack}.npz"))
  assert sorted(old) == sorted(new)
  for name in old:  # the layout records (strategy, shards) and the like
    if old[name].dtype.kind not in "fiu":
      np.testing.assert_array_equal(new[name], old[name], err_msg=name)
  differences = {name: _relative_difference(new[name], old[name])
                 for name in old if old[name].dtype.kind in "fiu"}
  worst = sorted(differences.items(), key=lambda item: -item[1])[:5]
  assert worst[0][1] <= rtol, worst
  # The run trained: tables, slots and dense weights moved from the start.
  start = tf.train.load_checkpoint(os.path.join(root, f"{program}-0"))
  moved = [name for name in old if old[name].dtype.kind == "f" and
           not np.array_equal(old[name], start.get_tensor(name))]
  assert any("Adagrad" in name for name in moved), moved
  assert any("Adam" in name for name in moved), moved


@pytest.mark.parametrize("stack,rtol", TOLERANCES)
@pytest.mark.parametrize("program", PROGRAMS)
def test_both_stacks_evaluate_predict_and_summarize_alike(runs, program,
                                                          stack, rtol):
  ours = _by_program(runs["trained"]["2.15"])[program]
  theirs = _by_program(runs["trained"][stack])[program]
  assert ours["evaluate"].keys() == theirs["evaluate"].keys()
  for key, value in ours["evaluate"].items():
    assert theirs["evaluate"][key] == pytest.approx(value, rel=rtol,
                                                     abs=0), key
  # Predictions as a whole, relative to their largest value (a tiny
  # probability may differ by an ulp, ~1e-6 of itself).
  assert len(ours["predict"]) == len(theirs["predict"]) == 16
  for key in ours["predict"][0]:
    mine = [p[key] for p in ours["predict"]]
    other = [p[key] for p in theirs["predict"]]
    assert _relative_difference(other, mine) <= rtol, key
  if program == "tpu_style":
    # host_call: a summary every step, at the global step the step read
    # (before its own increment), on both sides.
    steps = list(range(START_STEPS, START_STEPS + STEPS))
    for events in (ours["events"], theirs["events"]):
      assert [s for s in events["host_loss"] if s >= START_STEPS] == steps


@pytest.fixture(scope="module")
def crossed(runs):
  """Each stack on the other's checkpoints: first serving both exports with
  TensorFlow alone, then evaluating, resuming and exporting."""
  root, data = runs["root"], dict(runs["data"], init_checkpoint=runs["init"])
  exports = {stack: {p: _by_program(results)[p]["export"]["export_dir"]
                     for p in PROGRAMS}
             for stack, results in runs["trained"].items()}
  steps = {}
  for stack in ("2.15", "2.21"):
    other = "2.21" if stack == "2.15" else "2.15"
    actions = [dict(do="serve", export_dir=exports[side][p],
                    examples=os.path.join(root, f"{p}-examples.json"))
               for p in PROGRAMS for side in (stack, other)]
    for program in PROGRAMS:
      model_dir = os.path.join(root, f"{program}-{other}")
      actions += [
          dict(do="evaluate", program=program, model_dir=model_dir, steps=2,
               name=f"by_{stack}", **data),
          dict(do="train", program=program, model_dir=model_dir,
               steps=RESUME_STEPS, **data),
          dict(do="export", program=program, model_dir=model_dir,
               examples_out=os.path.join(root, f"{program}-again.json"),
               **data)]
    steps[stack] = (runs["interpreters"][stack], actions)
  # Resuming writes into the other stack's directory: one at a time.
  return {stack: _run_all({stack: step}, root)[stack]
          for stack, step in steps.items()}


def _crossed_results(crossed, stack):
  results = crossed[stack]
  serving = {(p, side): results[i * 2 + j] for i, p in enumerate(PROGRAMS)
             for j, side in enumerate((stack, "other"))}
  rest = results[len(PROGRAMS) * 2:]
  per_program = {p: dict(zip(("evaluate", "train", "export"),
                             rest[i * 3:(i + 1) * 3]))
                 for i, p in enumerate(PROGRAMS)}
  return serving, per_program


@pytest.mark.parametrize("program", PROGRAMS)
def test_a_checkpoint_of_one_stack_evaluates_and_resumes_on_the_other(
    runs, crossed, program):
  for stack, other in (("2.15", "2.21"), ("2.21", "2.15")):
    _, per_program = _crossed_results(crossed, stack)
    # The writer's own evaluation of that checkpoint, before resuming.
    writer = _by_program(runs["trained"][other])[program]["evaluate"]
    for key, value in writer.items():
      assert per_program[program]["evaluate"][key] == pytest.approx(
          value, rel=RTOL), (stack, key)
    assert per_program[program]["train"]["step"] == (
        START_STEPS + STEPS + RESUME_STEPS)
    assert os.path.isdir(per_program[program]["export"]["export_dir"])


@pytest.mark.parametrize("program", PROGRAMS)
def test_the_saved_models_serve_in_tensorflow_alone_on_both_stacks(
    runs, crossed, program):
  predictions = _by_program(runs["trained"]["2.15"])[program]["predict"]
  key = "probability"
  expected = np.array([p[key] for p in predictions[:8]]).reshape(-1)
  for stack in ("2.15", "2.21"):
    serving, _ = _crossed_results(crossed, stack)
    for side in (stack, "other"):
      served = serving[(program, side)]
      assert not served["library_imported"], (stack, side)
      got = np.asarray(served["outputs"][key]).reshape(-1)[:len(expected)]
      np.testing.assert_allclose(got, expected, rtol=1e-5,
                                 err_msg=f"{program} {side} on {stack}")
