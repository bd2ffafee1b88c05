"""`estimator_spec.estimator`: the TPUEstimator drop-in, and the counterpart
of `tf.estimator` that a TPUEstimator program uses beside it.

`tpu_estimator` is the surface (arguments, modes, params and context,
input_fn, hooks, export); `host_step` does one model_fn call's embedding
work (checks from `batch_checks`, lookups, gradients, update); `spec` holds
`TPUEstimatorSpec`; `hooks` the session hooks; `tpu_context` the emulated
TPU topology. Where the tables live and the training on a cluster are the
cluster wing's (`estimator_spec.cluster`), which the surface calls.

The names of `tf.estimator` (`Estimator`, `EstimatorSpec`, `ModeKeys`,
`RunConfig`, `export`, `TrainSpec`, `EvalSpec`, `train_and_evaluate`,
`WarmStartSettings`, `VocabInfo` and the session hooks) come from the
framework this process runs on (`stack`): tensorflow-estimator's on TF
2.15, the library's own (`framework/`) on current TensorFlow, so that a
program written with them runs on both (docs/estimator.md, 'Two stacks').
"""
# pylint: disable=g-import-not-at-top
import tensorflow as tf

from estimator_spec.estimator import stack
from estimator_spec.estimator import export
from estimator_spec.estimator.framework.estimator import (
    load_global_step_from_checkpoint_dir)
from estimator_spec.estimator.host_step import StepTable
from estimator_spec.estimator.host_step import step_tables
from estimator_spec.estimator.spec import ExportSavedModelApiVersion
from estimator_spec.estimator.spec import TPUEstimatorSpec
from estimator_spec.estimator.tpu_estimator import TPUEstimator
from estimator_spec.estimator.tpu_estimator import host_only_settings

Estimator = stack.Estimator
EstimatorSpec = stack.EstimatorSpec
ModeKeys = stack.ModeKeys
RunConfig = stack.RunConfig
TrainSpec = stack.TrainSpec
EvalSpec = stack.EvalSpec
train_and_evaluate = stack.train_and_evaluate
WarmStartSettings = stack.WarmStartSettings
VocabInfo = tf.compat.v1.train.VocabInfo

# The session hooks `tf.estimator` re-exported from `tf.compat.v1.train`
# (TF's own on both stacks).
_TRAIN = tf.compat.v1.train
CheckpointSaverHook = _TRAIN.CheckpointSaverHook
CheckpointSaverListener = _TRAIN.CheckpointSaverListener
FeedFnHook = _TRAIN.FeedFnHook
FinalOpsHook = _TRAIN.FinalOpsHook
GlobalStepWaiterHook = _TRAIN.GlobalStepWaiterHook
LoggingTensorHook = _TRAIN.LoggingTensorHook
NanLossDuringTrainingError = _TRAIN.NanLossDuringTrainingError
NanTensorHook = _TRAIN.NanTensorHook
ProfilerHook = _TRAIN.ProfilerHook
SecondOrStepTimer = _TRAIN.SecondOrStepTimer
SessionRunArgs = _TRAIN.SessionRunArgs
SessionRunContext = _TRAIN.SessionRunContext
SessionRunHook = _TRAIN.SessionRunHook
SessionRunValues = _TRAIN.SessionRunValues
StepCounterHook = _TRAIN.StepCounterHook
StopAtStepHook = _TRAIN.StopAtStepHook
SummarySaverHook = _TRAIN.SummarySaverHook
HOOK_NAMES = (
    "CheckpointSaverHook", "CheckpointSaverListener", "FeedFnHook",
    "FinalOpsHook", "GlobalStepWaiterHook", "LoggingTensorHook",
    "NanLossDuringTrainingError", "NanTensorHook", "ProfilerHook",
    "SecondOrStepTimer", "SessionRunArgs", "SessionRunContext",
    "SessionRunHook", "SessionRunValues", "StepCounterHook", "StopAtStepHook",
    "SummarySaverHook",)

__all__ = ["TPUEstimator", "TPUEstimatorSpec", "ExportSavedModelApiVersion",
           "host_only_settings", "StepTable", "step_tables", "Estimator",
           "EstimatorSpec", "ModeKeys", "RunConfig", "TrainSpec", "EvalSpec",
           "train_and_evaluate", "WarmStartSettings", "VocabInfo", "export",
           "load_global_step_from_checkpoint_dir"] + list(HOOK_NAMES)
