"""Setup of docs/recipes.md, recipe 4: a trained `estimator` to export.

`estimator_spec.TPUEstimator` over the small model of tests/recipe_model.py
trained 2 steps in runs/cpu_model, and its feature `columns` a, b, c.
"""
from tests import recipe_model as model

columns = list(model.columns("ours"))
estimator = model.our_estimator("runs/cpu_model", model.adam)
estimator.train(model.input_fn_for(*model.data()), max_steps=2)
