"""Microbenchmarks of the kit (python -m bench --help)."""
