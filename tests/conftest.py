"""The repository's test run: the conformance suite's driver selection serves every test here.

``cts.plugin`` (installed as ``hal_cts.plugin``) adds --driver, --driver-option and --run-fault-tests,
the `driver_uri` / `device` / `make_device` fixtures, and the one-line-per-reason skip summary.
"""

pytest_plugins = ["cts.plugin"]
