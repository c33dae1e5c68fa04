"""The `normbridge` command: a thin shell over the converters library and the registry (nothing imports it)."""
