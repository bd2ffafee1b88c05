"""Setup of docs/recipes.md, recipe 1: the reader's TPU job.

The job's `spec` (partition_strategy='mod'), its `model_fn` (ours takes it
as it is), `train_input_fn` / `eval_input_fn` over the small model of
tests/recipe_model.py, and the job's checkpoint (global step 100, tables
and Adagrad slots in 2 `mod` partitions, as a 2-host TPU job writes them)
copied to gs_copy/tpu_job. The training input ends after 2 batches, so
`max_steps=200_000` continues the job by 2 steps.
"""
import estimator_spec
from tests import recipe_model as model

spec = model.our_spec(model.columns("ours"), strategy="mod")
model_fn = model.model_fn_for(spec.feature_columns,
                              estimator_spec.TPUEstimatorSpec, model.adam)
train_input_fn = model.input_fn_for(*model.data(n=2048, seed=1),
                                    repeat=False)
eval_input_fn = model.input_fn_for(*model.data(n=1024, seed=2), repeat=False)
model.tpu_job_checkpoint("gs_copy/tpu_job")
