"""The package's version is the project's one version (Cargo.toml's
``[workspace.package] version``), as the installed metadata and as
``fencecheck.__version__``."""

import importlib.metadata
import tomllib

import fencecheck as fc
from conftest import REPO


def workspace_version() -> str:
    with open(REPO / "Cargo.toml", "rb") as f:
        return tomllib.load(f)["workspace"]["package"]["version"]


def test_dunder_version_is_the_workspace_version() -> None:
    """fencecheck.__version__ is Cargo.toml's version, not a copy that can drift."""
    assert fc.__version__ == workspace_version()


def test_installed_metadata_carries_the_same_version() -> None:
    """pip's metadata (pyproject's dynamic version) agrees with __version__."""
    assert importlib.metadata.version("fencecheck") == fc.__version__
