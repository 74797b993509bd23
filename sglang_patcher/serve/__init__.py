"""Serving on a host: the serving profile of ``hosts.yaml``, the server's lifecycle there, and the
checks and benchmarks that run against it (``sglpatch check``, ``sglpatch bench``)."""
