"""Prometheus remote-write 1.0 out of the collector (see :mod:`.writer`)."""
