"""Test-session setup: quiet TensorFlow logs and the hypothesis profiles."""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import hypothesis  # pylint: disable=g-import-not-at-top

from estimator_spec import quiet  # pylint: disable=g-import-not-at-top

quiet.silence_deprecation_notices()

# Local runs draw new examples each time ("project"); CI (CI=true, as
# .ci/run is started) draws the same examples on every run ("ci"), so that a
# fresh `make test` never fails by chance. HYPOTHESIS_PROFILE picks either.
_COMMON = dict(
    deadline=None,
    print_blob=True,
    suppress_health_check=[hypothesis.HealthCheck.too_slow],
)
hypothesis.settings.register_profile("project", **_COMMON)
hypothesis.settings.register_profile("ci", derandomize=True, database=None,
                                     **_COMMON)
_ci = os.environ.get("CI", "").lower() in ("1", "true", "yes")
hypothesis.settings.load_profile(
    os.environ.get("HYPOTHESIS_PROFILE", "ci" if _ci else "project"))
