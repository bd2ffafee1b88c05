"""The modes of a run: the values of `tf.estimator.ModeKeys`, as plain
strings so that the config model needs no estimator import."""
TRAIN = "train"
EVAL = "eval"
PREDICT = "infer"
MODES = (TRAIN, EVAL, PREDICT)

# How TF's TPUEstimator names each mode's batch size in its messages
# ("train batch size 4 must be divisible by number of replicas 8").
BATCH_NAMES = {TRAIN: "train", EVAL: "eval", PREDICT: "predict"}
