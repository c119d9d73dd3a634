"""One module per CLI command; each exposes `command`, a typer-annotated function."""
