"""The estimator sides of the TorchRec peer benchmark: e2e_bench's
`peer26` workload on `ours` (estimator_spec.TPUEstimator) or `tf` (TF
2.15's TPUEstimator(use_tpu=False)). Runs in the project's environment
(.venv); bench/peers/compare.py starts it as a subprocess.

  python -m bench.peers.estimator_side --side ours --describe
      the work of the side as built (tables from its EmbeddingConfigSpec's
      columns, ids of its first batches as its input_fn feeds them, the
      dense parameters and optimizer ops of its graph after one step)
  python -m bench.peers.estimator_side --side ours --steps 80 --warmup 20
      one timed run (e2e_bench.run_in_child: a fresh child process)
  python -m bench.peers.estimator_side --side ours --fed --steps 80
      the same for the side's fed twin (e2e_bench's `peer26-fed`: the same
      model with its activations fed, no lookup, no update), for the
      embedding's cost

Prints one line `PEER_RESULT {json}` last.
"""
import argparse
import json
import os
import sys

os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"

from bench import e2e_bench  # pylint: disable=g-import-not-at-top
from bench.peers import workload as peer  # pylint: disable=g-import-not-at-top

tf = e2e_bench.tf
MLP_SCOPES = ("hidden_", "logit")


def _threads():
  intra = tf.config.threading.get_intra_op_parallelism_threads()
  inter = tf.config.threading.get_inter_op_parallelism_threads()
  return (f"TF intra-op {intra or 'default'}, inter-op {inter or 'default'} "
          f"(default: all {os.cpu_count()} CPUs)")


def _mlp_parameters(trainable):
  """The dense layers' parameter count, from {variable name: size}."""
  return sum(size for name, size in trainable.items()
             if name.startswith(MLP_SCOPES))


def optimizer_of(apply_ops, sparse):
  """'adagrad' when the graph updates with Adagrad ops of that kind
  (sparse: the table rows a batch touches; dense: whole variables)."""
  found = [t for t in apply_ops
           if ("Sparse" in t) == sparse and "Adagrad" in t]
  if found:
    return "adagrad"
  return "none" if not apply_ops else "other: " + ",".join(apply_ops)


def describe(side, batches=peer.CHECKED_BATCHES):
  job = dict(e2e_bench.peer26_job(steps=1, warmup=0), side=side)
  _, spec, input_fn = e2e_bench.build_parts(job)
  columns = spec.feature_columns
  tables = {c.categorical_column.name: [c.categorical_column.num_buckets,
                                        c.dimension] for c in columns}
  combiners = sorted({c.combiner for c in columns})
  fed, batch_size = [], None
  for features, labels in input_fn({"batch_size": job["batch"]}).take(batches):
    fed.append(peer.batch_work(
        {name: features[name].values.numpy() for name in tables}))
    batch_size = int(labels.shape[0])
  # The graph's dense layers and optimizer ops, after one training step.
  graph = e2e_bench.run_in_child(job)
  mlp = _mlp_parameters(graph["trainable"])
  in_graph_tables = sum(size for name, size in graph["trainable"].items()
                        if not name.startswith(MLP_SCOPES))
  parameters = spec.optimization_parameters
  if side == e2e_bench.OURS:
    table_optimizer = ("adagrad" if type(parameters).__name__ ==
                       "AdagradParameters" else type(parameters).__name__)
    how = (f"spec's {type(parameters).__name__}(lr "
           f"{parameters.learning_rate}, initial accumulator "
           f"{parameters.initial_accumulator}) on the host engine")
  else:
    # TF's CPU path skips the spec: the tables are graph variables that
    # the model's optimizer updates (sparsely, the rows a batch touches).
    table_optimizer = optimizer_of(graph["apply_ops"], sparse=True)
    how = ("the model's optimizer on the tables as graph variables "
           "(TF's CPU path skips the spec's "
           f"{type(parameters).__name__})")
  return peer.work(
      tables=tables, batches=fed, batch_size=batch_size,
      combiner=combiners[0] if len(combiners) == 1 else combiners, mlp=mlp,
      table_optimizer=table_optimizer,
      dense_optimizer=optimizer_of(graph["apply_ops"], sparse=False),
      table_optimizer_detail=how,
      dense_optimizer_detail="tf.compat.v1.train.AdagradOptimizer(0.05, "
      "initial_accumulator_value=0.1)",
      apply_ops=graph["apply_ops"], table_parameters_in_graph=in_graph_tables,
      threads=_threads(), version=f"TF {tf.__version__}")


def timed(side, steps, warmup, fed=False):
  job = dict(e2e_bench.peer26_job(warmup + steps, warmup), side=side,
             fed=fed)
  result = e2e_bench.run_in_child(job)
  mlp = _mlp_parameters(result["trainable"])
  return {"examples_per_s": result["examples_per_s"],
          "median_step_ms": result["median_step_ms"],
          "max_rss_mb": result["max_rss_mb"], "mlp": mlp,
          "threads": _threads(), "version": f"TF {tf.__version__}"}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--side", choices=e2e_bench.SIDES, required=True)
  parser.add_argument("--describe", action="store_true")
  parser.add_argument("--steps", type=int, default=80)
  parser.add_argument("--warmup", type=int, default=20)
  parser.add_argument("--fed", action="store_true",
                      help="time the side's fed twin")
  args = parser.parse_args()
  if args.fed and args.describe:
    parser.error("--fed is timed only: the twin has no tables to describe")
  if args.describe:
    result = describe(args.side)
  else:
    result = timed(args.side, args.steps, args.warmup, fed=args.fed)
  print("PEER_RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
  sys.exit(main())
