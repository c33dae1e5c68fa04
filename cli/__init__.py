"""The `normbridge` command: a thin shell over the converters library."""
