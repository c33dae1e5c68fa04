"""Monitoring a served model's BatchNorm statistics: drift of serving inputs against the running statistics
(`drift`), re-estimating them on new data (`recalibration`), and the serving collector that ships statistics
windows of live traffic to the registry (`collector`: `monitor()`, on `window` and `sender`).
"""
