"""Redaction with realistic samples of each kind, and ordinary text left alone."""

from __future__ import annotations

import re
import time
from dataclasses import replace

import pytest
from detect_secrets.plugins.aws import AWSKeyDetector
from detect_secrets.plugins.base import RegexBasedDetector
from detect_secrets.plugins.basic_auth import BasicAuthDetector
from detect_secrets.plugins.github_token import GitHubTokenDetector
from detect_secrets.plugins.gitlab_token import GitLabTokenDetector
from detect_secrets.plugins.openai import OpenAIDetector
from detect_secrets.plugins.slack import SlackDetector
from detect_secrets.plugins.stripe import StripeDetector

from api_service.auth import new_secret
from api_service.core import redaction
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
    # The fewest digits a card has, and a card in text that is not ASCII.
    ("card_number", "old visa 4222222222222 still works", "4222222222222"),
    ("card_number", "carte 4242 4242 4242 4242 \u2014 merci", "4242 4242 4242 4242"),
    # \d matches other scripts' digits: text that is not ASCII has its digits counted by re.
    ("card_number", "card 4" + "\u0662" * 12, "4" + "\u0662" * 12),
    ("card_number", "JCB 3530 1113 3330 0000", "3530 1113 3330 0000"),
    ("card_number", "diners 30569309025904, exp 11/28", "30569309025904"),
    ("card_number", "mastercard 2223003122003222", "2223003122003222"),
    ("card_number", "maestro 6759649826438453", "6759649826438453"),
    # This service's own key, as an agent's shell history or tool config would hold it.
    (
        "memory_api_key",
        "export MEMORY_API_KEY=cmk_Zx9Yw8Vu7Ts6Rq5Po4Nm3Lk2Ji1Hg0FeDcBa_-q7W5e",
        "cmk_Zx9Yw8Vu7Ts6Rq5Po4Nm3Lk2Ji1Hg0FeDcBa_-q7W5e",
    ),
    ("private_key", f"here is the deploy key:\n{PEM}\nthanks", PEM),
    # Cut short: no END line, so the header and the base64 lines after it go.
    ("private_key", f"the first half:\n{PEM[:-34]}", PEM[:-34]),
]


@pytest.mark.parametrize(("kind", "text", "secret"), SECRETS)
def test_each_secret_kind_is_redacted(kind: str, text: str, secret: str) -> None:
    redacted, kinds = Redactor().redact(text)
    assert secret not in redacted
    assert f"[REDACTED:{kind}]" in redacted
    assert kind in kinds


ORDINARY = [
    "My flight is TP 1351 on 2023-05-03, seat 14A, booking ref 6XKQ2P.",
    "I ran 10 km in 52:30 and my order 1234 5678 9012 3456 is late.",  # fails Luhn
    "The meeting is at 3pm; call 555-0134 if late.",
    "Use git commit -m 'fix' then push to https://github.com/org/repo.git",
    "Bearer bonds were popular in the 1920s.",
    "Write a haiku about sk-ateboarding in the rain",
    # Words joined by hyphens after `sk-`: a key's random part holds digits.
    "Pick one of the sk-learn-compatible-estimators listed there",
    # Luhn-valid, but outside the card networks' ranges: an IMEI (it uses Luhn's check too),
    # and a phone number written without spaces.
    "My phone's IMEI is 490154203237518.",
    "Call me at +4917012345675 after six.",
    "My email is jo.doe@example.com and phone +1 415 555 0134",  # PII is off by default
]


@pytest.mark.parametrize("text", ORDINARY)
def test_ordinary_text_is_left_alone(text: str) -> None:
    assert Redactor().redact(text) == (text, [])


def test_the_services_own_keys_are_redacted_as_issued() -> None:
    for _ in range(200):
        secret = new_secret()
        for text in (secret, f"MEMORY_API_KEY={secret}", f"key: {secret}."):
            redacted, kinds = Redactor().redact(text)
            assert secret not in redacted and kinds == ["memory_api_key"]


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


def test_numbers_in_metadata_are_redacted_when_they_hold_a_finding() -> None:
    value = {"card": 4111111111111111, "order": 4111111111111112, "score": 0.5, "ok": True}
    assert Redactor().redact_value(value) == {
        "card": "[REDACTED:card_number]",
        "order": 4111111111111112,  # not Luhn-valid: a number like any other
        "score": 0.5,
        "ok": True,
    }
    # Timestamps (s, ms), ids and coordinates have a phone number's digits: kept as given.
    ordinary = [1732900000, 1732900000123, 123456789, -1001234567890, 37.77492951, 0.87654321]
    assert Redactor(pii=True).redact_value(ordinary) == ordinary
    assert Redactor(pii=True).redact_value({"card": 4111111111111111}) == {
        "card": "[REDACTED:card_number]"
    }


def test_luhn() -> None:
    assert luhn_valid("4111111111111111")
    assert not luhn_valid("4111111111111112")


# The needles each plugin rule was written for follow these patterns; a detect-secrets upgrade
# that changes them must be read before its rule's needles are trusted again.
PLUGIN_PATTERNS = {
    "aws_key": [
        "(?:A3T[A-Z0-9]|ABIA|ACCA|AKIA|ASIA)[0-9A-Z]{16}",
        "aws.{0,20}?(?:key|pwd|pw|password|pass|token).{0,20}?[\\'\\\"]([0-9a-zA-Z/+]{40})[\\'\\\"]",
    ],
    "github_token": ["(ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9_]{36}"],
    "gitlab_token": [
        "(glpat|gldt|glft|glsoat|glrt)-[A-Za-z0-9_\\-]{20,50}(?!\\w)",
        "GR1348941[A-Za-z0-9_\\-]{20,50}(?!\\w)",
        "glcbt-([0-9a-fA-F]{2}_)?[A-Za-z0-9_\\-]{20,50}(?!\\w)",
        "glimt-[A-Za-z0-9_\\-]{25}(?!\\w)",
        "glptt-[A-Za-z0-9_\\-]{40}(?!\\w)",
        "glagent-[A-Za-z0-9_\\-]{50,1024}(?!\\w)",
        "gloas-[A-Za-z0-9_\\-]{64}(?!\\w)",
    ],
    "slack_token": [
        "xox(?:a|b|p|o|s|r)-(?:\\d+-)+[a-z0-9]+",
        "https://hooks\\.slack\\.com/services/T[a-zA-Z0-9_]+/B[a-zA-Z0-9_]+/[a-zA-Z0-9_]+",
    ],
    "stripe_key": ["(?:r|s)k_live_[0-9a-zA-Z]{24}"],
    "openai_key": ["sk-[A-Za-z0-9-_]*[A-Za-z0-9]{20}T3BlbkFJ[A-Za-z0-9]{20}"],
    "url_password": [
        "://[^:/\\?\\#\\[\\]@!\\$\\&'\\(\\)\\*\\+,;=\\s]+:([^:/\\?\\#\\[\\]@!\\$\\&'\\(\\)\\*\\+,;=\\s]+)@"
    ],
}


CASE_BLIND = {"aws_key": [False, True], "slack_token": [True, True]}


def test_the_plugins_patterns_are_those_the_needles_were_written_for() -> None:
    plugins: dict[str, type[RegexBasedDetector]] = {
        "aws_key": AWSKeyDetector,
        "github_token": GitHubTokenDetector,
        "gitlab_token": GitLabTokenDetector,
        "slack_token": SlackDetector,
        "stripe_key": StripeDetector,
        "openai_key": OpenAIDetector,
        "url_password": BasicAuthDetector,
    }
    for kind, plugin in plugins.items():
        denylist = plugin().denylist
        assert [p.pattern for p in denylist] == PLUGIN_PATTERNS[kind], kind
        # A pattern that starts ignoring case may match letters its needles do not cover.
        ignore_case = [bool(p.flags & re.IGNORECASE) for p in denylist]
        assert ignore_case == CASE_BLIND.get(kind, [False] * len(denylist)), kind


def _variants(text: str) -> list[str]:
    return [text, text.upper(), text.lower(), f"see: {text} (done)"]


EXTRA = [
    "Authorization: BEARER 8f14e45fceea167a5a36dedd4bea2543",
    "aws_secret_access_key = 'wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY'",
    "hook https://hooks.slack.com/services/T00000000/B00000000/XXXXXXXXXXXXXXXXXXXXXXXX",
    "openai sk-abcdefghij0123456789T3BlbkFJabcdefghij0123456789",
    "rk_test_4eC39HqLyjWDarjtT1zdp7dcQ and GR1348941abcdefghijklmnopqrstu",
    "card 4111111111111111 and 4111-1111-1111-1111 and 6011 1111 1111 1117",
]


@pytest.mark.parametrize("text", EXTRA)
def test_the_extra_samples_hold_secrets(text: str) -> None:
    assert Redactor().redact(text)[1]


@pytest.mark.parametrize(
    "text", [t for _, text, _ in SECRETS for t in _variants(text)] + EXTRA + ORDINARY
)
def test_skipping_rules_by_their_needles_changes_nothing(
    text: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with_needles = (Redactor(pii=True).redact(text), Redactor().redact(text))
    for name in ("_SECRET_RULES", "_PII_RULES"):
        rules = getattr(redaction, name)
        monkeypatch.setattr(redaction, name, tuple(replace(r, needs=()) for r in rules))
    assert (Redactor(pii=True).redact(text), Redactor().redact(text)) == with_needles


def test_every_rules_needles_are_looked_for() -> None:
    """The one pass over a text looks for the needles the rules had at import: a rule whose
    needles it does not know would never run."""
    for rule in redaction._SECRET_RULES + redaction._PII_RULES:
        for needle in rule.needs:
            assert redaction._needles_in(f"x{needle}x") >= {needle}, (rule.kind, needle)


def test_a_key_cut_short_is_redacted_up_to_its_last_base64_line() -> None:
    text = f"first half:\n{PEM[:-34]}\nthe rest tomorrow"
    assert Redactor().redact(text) == (
        "first half:\n[REDACTED:private_key]\nthe rest tomorrow",
        ["private_key"],
    )
    encrypted = (
        "-----BEGIN RSA PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\nDEK-Info: AES-128-CBC,0A1B\n\n"
        "MIIEpAIBAAKCAQEA3Tz2mr7SZiAMfQyuvBjM2\nok, that was all I had"
    )
    assert Redactor().redact(encrypted)[0] == "[REDACTED:private_key]\nok, that was all I had"
    body = PEM.splitlines()[1:3]
    one_line = f"key: -----BEGIN OPENSSH PRIVATE KEY----- {body[0]} {body[1]} Thanks"
    assert Redactor().redact(one_line)[0] == "key: [REDACTED:private_key] Thanks"


# Text made to defeat a backtracking matcher, for every rule: a secret's start repeated with
# no end in sight, or one long run after it. (unit, tail): the unit repeated up to the size.
HOSTILE = [
    ("sk-", "T3BlbkFJ"),  # the OpenAI pattern restarted at every `sk-` (39 s at 100 KB on re)
    ("sk-a-", ""),
    ("eyJ-", ""),  # a JWT's first part, never a dot (7.9 s)
    ("eyJa.", "'"),
    ("-----BEGIN RSA PRIVATE KEY-----\n", ""),  # no END line (3.5 s)
    ("-----BEGIN PRIVATE KEY-----\nAAAAAAAAAAAAAAA ", "!"),
    ("a.", ""),  # an email's domain after one @ (24 s): see _hostile
    ("%1", "@"),  # its local part
    ("glagent-", "x"),
    ("GR1348941-", "x"),
    ("xoxb-1-", ""),
    ("https://hooks.slack.com/services/T", ""),
    ("://a:", ""),
    ("Bearer ", "x"),
    ("aws key '", ""),
    ("github_pat_", ""),
    ("ghp_", ""),
    ("sk_live_", ""),
    ("cmk_", ""),
    ("cmk_" + "a" * 43, "b"),
    ("4", "-"),
    ("4 ", ""),
    ("+1 (", ""),
]
MAX_CONTENT = 100_000  # characters: the API's content limit


def _hostile(unit: str, tail: str) -> str:
    head = "@" if unit == "a." else ""
    body = unit * (MAX_CONTENT // len(unit))
    return (head + body)[: MAX_CONTENT - len(tail)] + tail


@pytest.mark.parametrize(("unit", "tail"), HOSTILE)
def test_hostile_text_is_redacted_in_time_linear_in_its_length(unit: str, tail: str) -> None:
    """Redaction runs on the API's event loop: text at the content limit must not hold it for
    seconds. Linear matching takes 1-100 ms here; the backtracking patterns these cases were
    written for took 3.5-39 s."""
    text = _hostile(unit, tail)
    started = time.perf_counter()
    Redactor(pii=True).redact(text)
    assert time.perf_counter() - started < 1.0


def test_thousands_of_distinct_secrets_are_replaced_in_one_pass() -> None:
    keys = [f"AKIA{i:016d}" for i in range(MAX_CONTENT // 21)]
    started = time.perf_counter()
    redacted, kinds = Redactor().redact(" ".join(keys))
    assert time.perf_counter() - started < 1.0  # 2.8 s with a replace and a scan for each
    assert redacted == " ".join(["[REDACTED:aws_key]"] * len(keys))
    assert kinds == ["aws_key"] * len(keys)


def test_only_the_reviewed_patterns_stay_on_a_backtracking_matcher() -> None:
    """RE2 refuses look-arounds; the plugin patterns left on re for that are GitLab's, whose
    repeats are bounded. A detect-secrets upgrade that adds another must be read first."""
    plugins = [AWSKeyDetector, BasicAuthDetector, GitHubTokenDetector, GitLabTokenDetector]
    plugins += [OpenAIDetector, SlackDetector, StripeDetector]
    on_re = [
        p.pattern
        for plugin in plugins
        for p in plugin().denylist
        if isinstance(redaction.on_re2(p), re.Pattern)
    ]
    assert on_re == PLUGIN_PATTERNS["gitlab_token"]


@pytest.mark.parametrize("space", [" ", "\t", "\u00a0", "\u2003", "\u3000", "\x0b", "\x85"])
def test_a_bearer_token_after_any_white_space_is_redacted(space: str) -> None:
    token = "abcdefghijklmnopqrstuvwxyz0123"
    redacted, kinds = Redactor().redact(f"Authorization: Bearer{space}{token}")
    assert token not in redacted and kinds == ["bearer_token"]


def test_a_secret_pasted_again_on_its_own_is_redacted_there_too() -> None:
    text = (
        "DATABASE_URL=postgres://app:S3cr3t-Passw0rd@db.internal/prod; "
        "the password is S3cr3t-Passw0rd, not S3cr3t-Passw0rd2"
    )
    redacted, kinds = Redactor().redact(text)
    assert redacted == (
        "DATABASE_URL=postgres://app:[REDACTED:url_password]@db.internal/prod; "
        "the password is [REDACTED:url_password], not S3cr3t-Passw0rd2"
    )
    assert kinds == ["url_password"]


@pytest.mark.parametrize(
    ("text", "redacted"),
    [
        (
            "Connect via mongodb://admin:admin@db:27017 as the administrator",
            "Connect via mongodb://admin:[REDACTED:url_password]@db:27017 as the administrator",
        ),
        ("x://u:e@h here we see e", "x://u:[REDACTED:url_password]@h here we see e"),
    ],
)
def test_a_short_secret_is_redacted_only_where_it_was_found(text: str, redacted: str) -> None:
    """Elsewhere a short string is most likely a word, or part of one: replacing it there
    would change the user's text (and could grow it many times over)."""
    assert Redactor().redact(text) == (redacted, ["url_password"])


def test_findings_that_overlap_leave_nothing_of_either() -> None:
    """An AWS key id run into the name of a secret access key: both findings go whole."""
    secret = "a" * 38 + "Zz"
    redacted, _ = Redactor().redact(f"AKIA1234567890123AWS_KEY='{secret}'")
    assert secret not in redacted and "AKIA" not in redacted


@pytest.mark.parametrize(
    "text",
    [
        "Trasa Gdańsk-Wrzeszcz-Oliwa-Przymorze-Zaspa",  # `sk-` inside a word, after ń
        "Gdań" + JWT,  # a JWT's `eyJ` right after ń
    ],
)
def test_a_token_does_not_start_inside_a_word(text: str) -> None:
    assert Redactor().redact(text) == (text, [])


def test_a_token_starts_after_any_character_that_is_not_a_words() -> None:
    key = "sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4z-Q7r"
    for before in ("", " ", "=", "\u00a0", "«", "-"):
        assert Redactor().redact(before + key)[0] == before + "[REDACTED:api_key]"
