"""Suite-wide test settings."""

import os

from hypothesis import settings

# Hypothesis fails an example that takes over 200 ms by default: a timing
# assertion that a busy CI machine can trip. Speed is the benchmark's job.
settings.register_profile("nri-midbatch", deadline=None)
# HYPOTHESIS_PROFILE=long: the history model (tests/unit/test_history_model.py) runs far
# more and longer histories than its fixed budget, and shrinks what fails (docs/testing.md).
settings.register_profile(
    "long", parent=settings.get_profile("nri-midbatch"), max_examples=2000, stateful_step_count=80
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "nri-midbatch"))
