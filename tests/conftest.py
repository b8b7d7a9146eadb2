"""Suite-wide test settings."""

from hypothesis import settings

# Hypothesis fails an example that takes over 200 ms by default: a timing
# assertion that a busy CI machine can trip. Speed is the benchmark's job.
settings.register_profile("nri-midbatch", deadline=None)
settings.load_profile("nri-midbatch")
