"""Side-by-side benchmarks of the daemon against its peers (README.md here); bench/run.py runs them.

A package so the scenarios import their shared helpers (bench.common) as `bench.*`, from the
repository's root (`python -m bench.run`) or by path (`python bench/run.py`, see run.load_package).
"""
