"""Packaging for the two libraries: tpu_embedding_columns and estimator_spec."""
from setuptools import find_packages, setup

setup(
    name="tpu-embedding-estimator",
    version="0.1.0",
    description=(
        "Estimator-era TPU embedding columns, EmbeddingConfigSpec and a host "
        "engine that reproduces TPU embedding semantics on CPU."
    ),
    python_requires=">=3.11,<3.12",
    packages=find_packages(include=["tpu_embedding_columns*", "estimator_spec*"]),
    # The engine's kernels are compiled from this source on first use.
    package_data={"estimator_spec.engine.kernels": ["*.cc"]},
    install_requires=[
        "tensorflow-cpu==2.15.*",
        "tensorflow-estimator==2.15.*",
        "protobuf>=3.20.3,<5",
        "numpy<2",
    ],
    extras_require={
        # selenium and Pillow: the browser test of the profile report;
        # matplotlib: the test that runs the demo (it draws a PNG).
        "test": ["pytest>=7", "hypothesis>=6.80", "selenium>=4.11",
                 "Pillow>=9", "matplotlib>=3.7,<4"],
        # `make demo` draws its training curve with matplotlib.
        "demo": ["matplotlib>=3.7,<4"],
    },
)
