"""The runner's configuration resolution (providers/runner/config.py): flag > environment >
config.json for the marketplace URL and token, in one place for every command."""

from __future__ import annotations

import pytest

from providers.runner.config import (
    CliError,
    marketplace_from,
    require_marketplace,
    state_dir_from,
    token_source,
)

SAVED = {"url": "https://saved.example", "token": "gmr_saved"}


@pytest.fixture
def clean_env(monkeypatch):
    for name in ("GPUMARKET_URL", "GPUMARKET_RUNNER_TOKEN", "GPUMARKET_RUNNER_STATE_DIR"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_flag_then_environment_then_config(clean_env):
    assert marketplace_from(None, None, SAVED) == ("https://saved.example", "gmr_saved")
    assert marketplace_from(None, None, {}) == (None, None)
    clean_env.setenv("GPUMARKET_URL", "https://env.example")
    clean_env.setenv("GPUMARKET_RUNNER_TOKEN", "gmr_env")
    assert marketplace_from(None, None, SAVED) == ("https://env.example", "gmr_env")
    assert token_source(None) == "GPUMARKET_RUNNER_TOKEN"
    assert marketplace_from("https://flag.example", "gmr_flag", SAVED) == (
        "https://flag.example", "gmr_flag")
    assert token_source("gmr_flag") == "--token"


def test_the_token_from_config_json_has_no_other_source(clean_env):
    assert token_source(None) is None


def test_required_url_and_token_are_named_when_missing(clean_env):
    with pytest.raises(CliError, match=r"^missing --url and --token: pass them"):
        require_marketplace(None, None, {})
    with pytest.raises(CliError, match=r"^missing --token: pass it"):
        require_marketplace("https://flag.example", None, {})
    with pytest.raises(CliError, match=r"^invalid --url 'ftp://x': it must start with"):
        require_marketplace("ftp://x", "gmr_flag", {})
    assert require_marketplace(None, "gmr_flag", SAVED) == ("https://saved.example",
                                                             "gmr_flag")


def test_state_dir_from_flag_else_environment_else_home(clean_env, tmp_path):
    assert state_dir_from(str(tmp_path)) == tmp_path
    clean_env.setenv("GPUMARKET_RUNNER_STATE_DIR", str(tmp_path / "env"))
    assert state_dir_from(None) == tmp_path / "env"
    clean_env.delenv("GPUMARKET_RUNNER_STATE_DIR")
    assert state_dir_from(None).name == ".gpumarket-runner"
