"""Recognising torch normalizations by what they compute, and proving it: the work behind the torch recognizers.

`exported_program.py` reads the normalization layers of a torch.export program (one op call each: `aten_calls.py`);
`computed.py` traces a live module that is no stock class and `exported_computed.py` cuts a program's hand-written
modules out of its graph (`traced_groups.py`); `norm_graph.py` reads what their ops compute, `derived_spec.py` (or
`declared_spec.py`, for a class declared with `converters.recognize`) makes the spec, `norm_proof.py` proves it against
the NumPy reference. `norm_names.py` says which class names make a candidate, `norm_hazards.py` reports a candidate
nobody proved. The recognizers that ask this code are in `../recognizers/`.
"""
