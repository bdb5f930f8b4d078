"""The installed distribution's version, for every command's --version."""

from importlib.metadata import PackageNotFoundError, version


def version_text(prog: str) -> str:
    try:
        number = version("adl-enforcer")
    except PackageNotFoundError:
        number = "unknown (not installed)"
    return f"{prog} {number}"
