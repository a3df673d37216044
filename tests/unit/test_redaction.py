"""Redaction with realistic samples of each kind, and ordinary text left alone."""

from __future__ import annotations

import pytest

from api_service.core.redaction import Redactor, luhn_valid

JWT = (
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4ifQ."
    "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"
)
PEM = (
    "-----BEGIN OPENSSH PRIVATE KEY-----\n"
    "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW\n"
    "QyNTUxOQAAACDiG2oqzQ0NBhU6Rk4xQJhkxr0X5vF6v5pA0g7tYjJ3XwAAAJgQdW4yEHVu\n"
    "-----END OPENSSH PRIVATE KEY-----"
)

SECRETS = [
    ("aws_key", "export AWS_ACCESS_KEY_ID=AKIAIOSFODNN7EXAMPLE", "AKIAIOSFODNN7EXAMPLE"),
    (
        "github_token",
        "git clone https://x:ghp_16C7e42F292c6912E7710c838347Ae178B4a@github.com/o/r",
        "ghp_16C7e42F292c6912E7710c838347Ae178B4a",
    ),
    (
        "github_token",
        "GH_TOKEN=github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyzABCD",
        "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyzABCD",
    ),
    ("gitlab_token", "token glpat-xT8dJ2cL9vQ4mN7bR1kZ", "glpat-xT8dJ2cL9vQ4mN7bR1kZ"),
    (
        "slack_token",
        "SLACK_BOT_TOKEN=xoxb-2210534765-3928475610293-Zk8Qp2Lr7Vt1Xy4Wn6Bm9Cd0",
        "xoxb-2210534765-3928475610293-Zk8Qp2Lr7Vt1Xy4Wn6Bm9Cd0",
    ),
    (
        "stripe_key",
        "stripe.api_key = 'sk_live_4eC39HqLyjWDarjtT1zdp7dc'",
        "sk_live_4eC39HqLyjWDarjtT1zdp7dc",
    ),
    (
        "api_key",
        "OPENAI_API_KEY=sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4z-Q7r",
        "sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4z-Q7r",
    ),
    (
        "api_key",
        "ANTHROPIC_API_KEY=sk-ant-api03-Zx9Yw8Vu7Ts6Rq5Po4Nm3Lk2Ji1Hg0FeDcBa",
        "sk-ant-api03-Zx9Yw8Vu7Ts6Rq5Po4Nm3Lk2Ji1Hg0FeDcBa",
    ),
    ("jwt", f"the session token is {JWT}", JWT),
    (
        "bearer_token",
        "curl -H 'Authorization: Bearer 8f14e45fceea167a5a36dedd4bea2543'",
        "8f14e45fceea167a5a36dedd4bea2543",
    ),
    (
        "url_password",
        "DATABASE_URL=postgres://app:S3cr3t-Passw0rd@db.internal:5432/prod",
        "S3cr3t-Passw0rd",
    ),
    ("card_number", "charge my card 4242 4242 4242 4242, exp 04/29", "4242 4242 4242 4242"),
    ("card_number", "amex 3782-822463-10005 please", "3782-822463-10005"),
    ("private_key", f"here is the deploy key:\n{PEM}\nthanks", PEM),
]


@pytest.mark.parametrize(("kind", "text", "secret"), SECRETS)
def test_each_secret_kind_is_redacted(kind: str, text: str, secret: str) -> None:
    redacted, kinds = Redactor().redact(text)
    assert secret not in redacted
    assert f"[REDACTED:{kind}]" in redacted
    assert kind in kinds


@pytest.mark.parametrize(
    "text",
    [
        "My flight is TP 1351 on 2023-05-03, seat 14A, booking ref 6XKQ2P.",
        "I ran 10 km in 52:30 and my order 1234 5678 9012 3456 is late.",  # fails Luhn
        "The meeting is at 3pm; call 555-0134 if late.",
        "Use git commit -m 'fix' then push to https://github.com/org/repo.git",
        "Bearer bonds were popular in the 1920s.",
        "Write a haiku about sk-ateboarding in the rain",
        "My email is jo.doe@example.com and phone +1 415 555 0134",  # PII is off by default
    ],
)
def test_ordinary_text_is_left_alone(text: str) -> None:
    assert Redactor().redact(text) == (text, [])


def test_personal_data_when_the_org_asks_for_it() -> None:
    redacted, kinds = Redactor(pii=True).redact("mail jo.doe@example.com or +1 415 555 0134")
    assert redacted == "mail [REDACTED:email] or [REDACTED:phone]"
    assert kinds == ["email", "phone"]


def test_metadata_values_are_redacted_recursively() -> None:
    value = {
        "env": {"key": "AKIAIOSFODNN7EXAMPLE"},
        "list": ["ok", "sk_live_4eC39HqLyjWDarjtT1zdp7dc"],
        "n": 3,
    }
    assert Redactor().redact_value(value) == {
        "env": {"key": "[REDACTED:aws_key]"},
        "list": ["ok", "[REDACTED:stripe_key]"],
        "n": 3,
    }


def test_luhn() -> None:
    assert luhn_valid("4111111111111111")
    assert not luhn_valid("4111111111111112")
