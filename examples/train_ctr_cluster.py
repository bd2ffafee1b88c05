"""The example CTR model (examples/dlrm.py) trained on a cluster: every
process of the cluster runs this same command, with its own TF_CONFIG.

    TF_CONFIG='{"cluster": {...}, "task": {"type": "worker", "index": 0}}' \\
        python -m examples.train_ctr_cluster --model-dir DIR

`tf.compat.v1.estimator.train_and_evaluate` does what each task needs: a ps
task serves its table partitions until it is stopped, the chief and the
workers train (synchronously by default: `--batch-size` is the global batch,
each training task reads its share; `--asynchronous` for per-task steps),
an evaluator task evaluates each new checkpoint. The model dir must be
shared by the chief and the evaluator (a common file system).

Every task generates the same examples (seed 0); each training task reads
its shard of them, as `params['context']` tells its input_fn.
"""
import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from estimator_spec import quiet  # pylint: disable=g-import-not-at-top

quiet.silence_deprecation_notices()

import tensorflow as tf  # pylint: disable=g-import-not-at-top

import estimator_spec  # pylint: disable=g-import-not-at-top
from examples import ctr_data  # pylint: disable=g-import-not-at-top
from examples import dlrm  # pylint: disable=g-import-not-at-top


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--model-dir", required=True)
  parser.add_argument("--scale", type=float, default=0.05)
  parser.add_argument("--steps", type=int, default=1000)
  parser.add_argument("--batch-size", type=int, default=1024,
                      help="global batch (synchronous)")
  parser.add_argument("--train-examples", type=int, default=200_000)
  parser.add_argument("--eval-examples", type=int, default=20_480)
  parser.add_argument("--asynchronous", action="store_true")
  parser.add_argument("--step-timeout", type=float, default=600.0,
                      help="seconds a synchronous step may wait for a task")
  args = parser.parse_args()
  tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.INFO)

  train_x, train_y = ctr_data.generate(args.train_examples, args.scale, seed=0)
  eval_x, eval_y = ctr_data.generate(args.eval_examples, args.scale, seed=1)
  columns, numeric = dlrm.build_columns(args.scale)
  estimator = estimator_spec.TPUEstimator(
      model_fn=dlrm.model_fn_for(columns, numeric),
      config=estimator_spec.RunConfig(
          model_dir=args.model_dir, save_checkpoints_steps=200,
          log_step_count_steps=100),
      use_tpu=False,
      train_batch_size=args.batch_size,
      eval_batch_size=1024,
      embedding_config_spec=dlrm.build_spec(args.scale),
      cluster_training=estimator_spec.ClusterTraining(
          asynchronous=args.asynchronous,
          step_timeout_secs=args.step_timeout))
  estimator_spec.estimator.train_and_evaluate(
      estimator,
      estimator_spec.estimator.TrainSpec(
          dlrm.input_fn_for(train_x, train_y), max_steps=args.steps),
      estimator_spec.estimator.EvalSpec(
          dlrm.input_fn_for(eval_x, eval_y, shuffle=False, repeat=False),
          steps=None, throttle_secs=10, start_delay_secs=0))
  print(f"{estimator.config.task_type} {estimator.config.task_id}: done",
        flush=True)


if __name__ == "__main__":
  main()
