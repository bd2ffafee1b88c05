"""`estimator_spec.estimator.export`: the counterpart of `tf.estimator.export`
(serving input receivers and export outputs), from the framework this
process runs on (`estimator/stack.py`): tensorflow-estimator's on TF 2.15,
this library's on current TensorFlow."""
from estimator_spec.estimator import stack

ExportOutput = stack.export.ExportOutput
PredictOutput = stack.export.PredictOutput
ClassificationOutput = stack.export.ClassificationOutput
RegressionOutput = stack.export.RegressionOutput
ServingInputReceiver = stack.export.ServingInputReceiver
TensorServingInputReceiver = stack.export.TensorServingInputReceiver
build_parsing_serving_input_receiver_fn = (
    stack.export.build_parsing_serving_input_receiver_fn)
build_raw_serving_input_receiver_fn = (
    stack.export.build_raw_serving_input_receiver_fn)

__all__ = ["ExportOutput", "PredictOutput", "ClassificationOutput",
           "RegressionOutput", "ServingInputReceiver",
           "TensorServingInputReceiver",
           "build_parsing_serving_input_receiver_fn",
           "build_raw_serving_input_receiver_fn"]
