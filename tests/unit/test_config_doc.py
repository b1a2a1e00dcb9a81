"""docs/configuration.md is generated from the settings classes and must stay current."""

from __future__ import annotations

from typer.testing import CliRunner

from controlplane.cli import app
from controlplane.cli.config_cmd import markdown
from tests.conftest import REPO


def test_configuration_doc_is_current() -> None:
    """What ``kvwise config --markdown`` prints is the file, byte for byte (it once added
    a blank line at the end, so the help's redirect changed the file)."""
    doc = (REPO / "docs" / "configuration.md").read_text()
    printed = CliRunner().invoke(app, ["config", "--markdown"])
    assert printed.exit_code == 0, printed.output
    assert printed.stdout == doc == markdown(), (
        "docs/configuration.md is stale: run `kvwise config --markdown > docs/configuration.md`"
    )


def test_every_setting_is_documented_where_declared() -> None:
    from agent.settings import AgentSettings
    from controlplane.service.settings import ControllerSettings

    for cls in (ControllerSettings, AgentSettings):
        for name, field in cls.model_fields.items():
            assert field.description, f"{cls.__name__}.{name} has no description"
