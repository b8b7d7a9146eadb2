"""nri-midbatch: cgroup values for Koordinator batch and mid-tier pods, over NRI."""

__version__ = "0.1.0"
