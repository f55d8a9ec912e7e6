"""Fitting the cost model to real profiles (`kvpd calibrate`), the calibrated cost model, and
pricing a real engine's logged steps with it."""
