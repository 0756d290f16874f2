"""Predicted against measured: run comparisons, verdicts, calibration."""
