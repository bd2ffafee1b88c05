"""The Estimator framework, written here: what `tf.estimator` gave a
TPUEstimator program, for current TensorFlow, where tensorflow-estimator no
longer exists (docs/estimator.md, 'Two stacks').

`Estimator` is the run loop (train, evaluate, predict, export) on
`tf.compat.v1` graph mode and TF's own session machinery
(`MonitoredTrainingSession` and the hooks of `tf.compat.v1.train`);
beside it the objects a program hands it or gets back: `ModeKeys`,
`EstimatorSpec`, `RunConfig`, the TPU `RunConfig`, `TPUConfig` and
`InputPipelineConfig`, `WarmStartSettings`, the `export` module (serving
input receivers and export outputs) and `TrainSpec`, `EvalSpec` and
`train_and_evaluate`.

Which framework a process uses (tensorflow-estimator's where it is
installed, this one elsewhere) is decided once, in `estimator/stack.py`;
nothing here imports tensorflow-estimator.
"""
