"""tgserve's HTTP layer. `__version__` is the installed distribution's version (pyproject.toml),
read once here so `tgserve --version`, GET /version and the OpenAPI document agree."""

from importlib import metadata

try:
    __version__ = metadata.version("tgserve")
except metadata.PackageNotFoundError:  # run from a checkout that was never installed
    __version__ = "0+unknown"
