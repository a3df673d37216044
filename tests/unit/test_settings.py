"""api_service's settings as the environment gives them, and the --help that lists them."""

from __future__ import annotations

import pytest

from api_service.settings import ApiSettings, Limits, env_help


@pytest.mark.parametrize(
    "value",
    ["https://a.example,https://b.example", ' ["https://a.example", "https://b.example"]'],
)
def test_lists_are_comma_separated_or_json(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("MEMORY_CORS_ORIGINS", value)
    monkeypatch.setenv("MEMORY_INDEX_SHARDS", value.replace("https://", ""))
    settings = ApiSettings()
    assert settings.cors_origins == ["https://a.example", "https://b.example"]
    assert settings.index_shards == ["a.example", "b.example"]


def test_help_names_every_setting_with_its_default_and_meaning() -> None:
    text = env_help()
    for name, info in ApiSettings.model_fields.items():
        assert info.description, f"{name} has no description for --help"
        if name == "database_url":
            assert "MEMORY_DATABASE_URL or DATABASE_URL (default: unset)" in text
        elif name in ("limits", "default_plan"):
            assert f"MEMORY_{name.upper()}__*: {info.description}" in text
        else:
            assert f"MEMORY_{name.upper()} (default: " in text and info.description in text
    assert "MEMORY_LIMITS__CONTENT_CHARS (default: 100000)" in text
    assert len(Limits.model_fields) == text.count("MEMORY_LIMITS__") - 1
