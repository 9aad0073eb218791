from __future__ import annotations

import tomllib
from pathlib import Path

import msgspec
import pytest

from proxy.protocol.control import Controls
from proxy.services import policy_of
from proxy.settings import Settings, SettingsError, load_settings

ROOT = Path(__file__).resolve().parents[2]


def test_default_toml_lists_every_setting_with_its_real_default():
    documented = tomllib.loads((ROOT / "config" / "default.toml").read_text())
    assert documented == msgspec.structs.asdict(Settings())


def test_layers_file_then_environment_then_flags(tmp_path):
    config = tmp_path / "pcp.toml"
    config.write_text('port = 7000\ncontext_budget = 3000\nhost = "0.0.0.0"\n')

    settings = load_settings(config, environ={"PCP_PORT": "7100", "PCP_API_KEYS": "k1, k2"}, overrides={"port": 7200, "host": None})

    assert settings.port == 7200  # flag beats environment beats file
    assert settings.context_budget == 3000  # file beats default
    assert settings.host == "0.0.0.0"  # an absent flag does not override
    assert settings.api_keys == ["k1", "k2"]


def test_config_file_can_come_from_the_environment(tmp_path):
    config = tmp_path / "pcp.toml"
    config.write_text("max_rounds = 7\n")
    assert load_settings(environ={"PCP_CONFIG": str(config)}).max_rounds == 7


@pytest.mark.parametrize(
    ("environ", "named"),
    [
        ({"PCP_PORT": "eighty"}, "PCP_PORT"),
        ({"PCP_CONTEXT_BUDGET": "100"}, "PCP_CONTEXT_BUDGET"),
        ({"PCP_SUMMARIES": "magic"}, "PCP_SUMMARIES"),
        ({"PCP_CONTEXT_BUGDET": "4096"}, "PCP_CONTEXT_BUGDET"),
        ({"PCP_FOLLOWUP_SHARE": "0.9"}, "PCP_FOLLOWUP_SHARE"),
    ],
)
def test_bad_environment_values_name_their_key(environ, named):
    with pytest.raises(SettingsError, match=named):
        load_settings(environ=environ)


def test_unknown_key_in_file_is_refused(tmp_path):
    config = tmp_path / "pcp.toml"
    config.write_text("context_budgte = 1\n")
    with pytest.raises(SettingsError, match="context_budgte"):
        load_settings(config, environ={})


def test_a_models_followup_share_is_checked(tmp_path):
    config = tmp_path / "pcp.toml"
    config.write_text('[models."agent-*"]\nfollowup_share = 0.01\n')
    with pytest.raises(SettingsError, match="followup_share must be between 0.05 and 0.5"):
        load_settings(config, environ={})


def test_missing_or_broken_file(tmp_path):
    with pytest.raises(SettingsError, match="does not exist"):
        load_settings(tmp_path / "absent.toml", environ={})
    broken = tmp_path / "broken.toml"
    broken.write_text("port = \n")
    with pytest.raises(SettingsError, match="not valid TOML"):
        load_settings(broken, environ={})


def test_a_former_name_is_read_as_the_current_one(tmp_path):
    """``consolidator`` was the name of ``summaries``: a TOML file or environment that still says it keeps working."""
    toml = tmp_path / "old.toml"
    toml.write_text('consolidator = "llm"\n')
    assert load_settings(toml, environ={}).summaries == "llm"
    assert load_settings(environ={"PCP_CONSOLIDATOR": "llm"}).summaries == "llm"
    assert load_settings(environ={"PCP_CONSOLIDATOR": "llm", "PCP_SUMMARIES": "extractive"}).summaries == "extractive"


def test_the_embedded_models_window_is_a_slots_unless_one_is_set():
    assert policy_of(Settings(upstream_base_url="", local_n_ctx=6000)).window == 6000
    assert policy_of(Settings(upstream_base_url="", local_n_ctx=6000, context_window=32000)).window == 32000
    assert policy_of(Settings(upstream_base_url="http://127.0.0.1:9/v1", local_n_ctx=6000)).window == 0  # another upstream's is unknown


def test_the_embedded_model_keeps_its_own_budget_whatever_model_a_client_names():
    """No upstream: local_context_budget (and the chat threshold), never a model family's; with one, the family's."""
    embedded = Settings(upstream_base_url="", local_context_budget=2048)
    assert policy_of(embedded).rounds.budget == 2048
    for model in ("claude-sonnet-4-5", "gpt-5", "smollm2"):
        policy = Controls(embedded, policy_of(embedded)).for_model(model).policy
        assert (policy.threshold, policy.rounds.budget) == (8192, 2048)
    upstream = Settings(upstream_base_url="http://127.0.0.1:9/v1", local_context_budget=2048)
    assert policy_of(upstream).rounds.budget == 4096  # 0: the chat budget, where the family is none the proxy knows
    policy = Controls(upstream, policy_of(upstream)).for_model("claude-sonnet-4-5").policy
    assert (policy.threshold, policy.rounds.budget) == (32_768, 16_384)
