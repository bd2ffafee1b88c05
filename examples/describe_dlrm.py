"""`make demo` (until the estimator drop-in lands): derive the TPU embedding
configuration of the DLRM-style example for a 4-host, 32-core topology and
print its tables, features, per-shard memory and configuration proto."""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from estimator_spec import quiet  # pylint: disable=g-import-not-at-top

quiet.silence_deprecation_notices()

import estimator_spec  # pylint: disable=g-import-not-at-top
from estimator_spec.config import report  # pylint: disable=g-import-not-at-top
from examples import dlrm  # pylint: disable=g-import-not-at-top


def main():
  spec = dlrm.build_spec(partition_strategy="mod")
  config = estimator_spec.EmbeddingConfig(
      spec, batch_size=4096, num_hosts=4, num_cores=32,
      mode=estimator_spec.TRAIN)
  print(report.describe(config, include_proto=True))
  eval_config = estimator_spec.EmbeddingConfig(
      spec, batch_size=4096, num_hosts=4, num_cores=32,
      mode=estimator_spec.EVAL)
  print(f"\nEVAL uses mode {eval_config.config_proto.mode} (INFERENCE = 1) "
        "with no embedding optimizer.")


if __name__ == "__main__":
  main()
