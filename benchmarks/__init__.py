"""Research benchmarks: scripts run with `python -m benchmarks.NAME` from the repository root that
print the figures docs/measurements.md reports. Not part of the installed package (README.md here
maps each to its section)."""
