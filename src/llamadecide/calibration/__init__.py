"""Calibration: labelled data in; metrics, fitted temperature/bias, thresholds and profiles out."""
