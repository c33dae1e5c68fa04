"""Reading and writing `.pt2` files (torch.export archives) without running anything stored in them.

`archive.py` reads an archive into an ExportedProgram: `program_checks.py` (with `expressions.py` and `magnitudes.py`)
refuses a program that would run code or build numbers too large, `tensors.py` checks each payload's metadata,
`payloads.py` maps large payloads from the file, `treespecs.py` reads input and output structures of types this process
has not imported, `versions.py` refuses a program this torch would read as something else; `program_schema.py` and
`deserializer.py` are the faster path through torch's deserializer. `structure.py` holds a program's archive parts for
the registry and writes a `.pt2` back from them. Torch's private code is reached only through `../torch_internals.py`.
"""
