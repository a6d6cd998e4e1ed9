"""HAL conformance test suite: `pytest tests/cts --driver NAME`."""
