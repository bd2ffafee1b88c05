"""Setup of docs/recipes.md, recipe 3: our checkpoint in runs/cpu_model.

Our `spec` (Adagrad) of the small model of tests/recipe_model.py, trained 2
steps by `estimator_spec.TPUEstimator` into runs/cpu_model with the model's
Adam; `model_fn` as TF's TPUEstimator runs it (TF's columns of
`interop.to_tensorflow(spec)`, TF's TPUEstimatorSpec); `train_input_fn`,
whose input ends after 2 batches.
"""
import tensorflow as tf

from estimator_spec import interop
from tests import recipe_model as model

model.our_estimator("runs/cpu_model", model.adam).train(
    model.input_fn_for(*model.data()), max_steps=2)
spec = model.our_spec(model.columns("ours"))
tf_columns = interop.columns_by_name(interop.to_tensorflow(spec))
model_fn = model.model_fn_for(
    [tf_columns[name] for name in
     ("a_embedding", "b_shared_embedding", "c_shared_embedding")],
    tf.compat.v1.estimator.tpu.TPUEstimatorSpec, model.adam)
train_input_fn = model.input_fn_for(*model.data(n=2048, seed=1),
                                    repeat=False)
