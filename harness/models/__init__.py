"""The real models (``registry``: fetch, convert, paths, offline) and cpu_int4's fidelity against bf16."""
