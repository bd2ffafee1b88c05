"""The modes of a run: the values of `tf.estimator.ModeKeys`, as plain
strings so that the config model needs no estimator import."""
TRAIN = "train"
EVAL = "eval"
PREDICT = "infer"
MODES = (TRAIN, EVAL, PREDICT)
