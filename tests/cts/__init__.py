"""HAL conformance test suite.

Installed: ``python -m hal_cts --driver NAME``; in the repository: ``pytest tests/cts --driver NAME``.
"""
