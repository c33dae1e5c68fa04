"""Monitoring a served model's BatchNorm statistics: drift of serving inputs against the running statistics
(`drift`), and re-estimating them on new data (`recalibration`).
"""
