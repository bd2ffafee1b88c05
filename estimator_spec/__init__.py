"""TPU embedding configuration for Estimator-era models.

`EmbeddingConfigSpec`, the optimization-parameter classes, `TableConfig` and
`FeatureConfig` take the arguments of TF 2.15's classes of the same names;
`EmbeddingConfig` derives the TPU embedding configuration proto.
"""
from estimator_spec.config import EVAL
from estimator_spec.config import PREDICT
from estimator_spec.config import TRAIN
from estimator_spec.config import EmbeddingConfig
from estimator_spec.estimator import ExportSavedModelApiVersion
from estimator_spec.estimator import TPUEstimator
from estimator_spec.estimator import TPUEstimatorSpec
from estimator_spec.model import EmbeddingModel
from estimator_spec.optimizers import ALL_OPTIMIZERS
from estimator_spec.optimizers import AdagradMomentumParameters
from estimator_spec.optimizers import AdagradParameters
from estimator_spec.optimizers import AdamParameters
from estimator_spec.optimizers import FtrlParameters
from estimator_spec.optimizers import MomentumParameters
from estimator_spec.optimizers import OptimizationParameters
from estimator_spec.optimizers import ProximalAdagradParameters
from estimator_spec.optimizers import ProximalYogiParameters
from estimator_spec.optimizers import RMSPropParameters
from estimator_spec.optimizers import StochasticGradientDescentParameters
from estimator_spec.sharding import ShardLayout
from estimator_spec.spec import EmbeddingConfigSpec
from estimator_spec.spec import FeatureConfig
from estimator_spec.spec import TableConfig

__all__ = [
    "EmbeddingConfigSpec", "EmbeddingConfig", "EmbeddingModel", "TableConfig",
    "FeatureConfig", "ShardLayout", "OptimizationParameters",
    "AdagradParameters", "AdagradMomentumParameters", "AdamParameters",
    "FtrlParameters", "MomentumParameters", "ProximalAdagradParameters",
    "ProximalYogiParameters", "RMSPropParameters",
    "StochasticGradientDescentParameters", "ALL_OPTIMIZERS", "TRAIN", "EVAL",
    "PREDICT", "TPUEstimator", "TPUEstimatorSpec", "ExportSavedModelApiVersion"
]
