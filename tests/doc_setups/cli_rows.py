"""Setup of docs/cli.md's `read_rows` block: the small model of
tests/recipe_model.py trained 2 steps into runs/model with its tables in
`mod` layout over 2 TPU hosts (16 cores), and its `spec`."""
from tests import recipe_model as model

estimator = model.our_estimator("runs/model", model.adam, num_shards=16,
                                strategy="mod", batch=16)
estimator.train(model.input_fn_for(*model.data()), max_steps=2)
spec = model.our_spec(list(model.columns("ours")), strategy="mod")
