"""One module per group of commands; cli/main.py imports each explicitly."""
