"""Reports across runs: comparison, calibration of planner factors, recipe review."""
