"""The name the project is installed under (``pip install hal-gpu``); its import packages are ``hal``,
``runtime`` and ``hal_cts``. One definition, for the version look-up and the messages that say what
to install."""

NAME = "hal-gpu"


def install_hint(extra: str) -> str:
    """The pip command that installs the project with ``extra`` (as the unavailable drivers suggest)."""
    return f"pip install '{NAME}[{extra}]'"
