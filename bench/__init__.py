"""The nri-midbatch benchmark (`make bench`, `python -m bench`); see docs/performance.md."""
