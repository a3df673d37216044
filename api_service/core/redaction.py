"""Redaction of secrets before anything is stored or embedded.

Known secret kinds are replaced by `[REDACTED:<kind>]`. Token formats come from the maintained
detect-secrets plugins; what they lack is added here: whole PEM private-key blocks (the plugin
matches only the header line), current OpenAI/Anthropic-style `sk-` keys, bearer tokens,
passwords in URLs, Luhn-valid card numbers, and, per organization, emails and phone numbers.

Every pattern that RE2 can run runs on RE2, whose matching takes time linear in the text.
Python's re backtracks: a pattern like `sk-[...]*...T3BlbkFJ` starts again at every `sk-` of
a long run and scans to its end, and 100 KB made for it held a request's event loop for 39
s. The few patterns RE2 refuses (look-arounds, back-references) have bounded repeats or
start only at rare anchors; tests/unit/test_redaction.py times every rule on such input.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import re2
from ahocorasick_rs import AhoCorasick, Implementation, MatchKind
from detect_secrets.plugins.aws import AWSKeyDetector
from detect_secrets.plugins.base import RegexBasedDetector
from detect_secrets.plugins.basic_auth import BasicAuthDetector
from detect_secrets.plugins.github_token import GitHubTokenDetector
from detect_secrets.plugins.gitlab_token import GitLabTokenDetector
from detect_secrets.plugins.jwt import JwtTokenDetector
from detect_secrets.plugins.openai import OpenAIDetector
from detect_secrets.plugins.slack import SlackDetector
from detect_secrets.plugins.stripe import StripeDetector


def marker(kind: str) -> str:
    return f"[REDACTED:{kind}]"


@dataclass(frozen=True)
class _Rule:
    kind: str
    # (start, end) of each finding in the text
    spans: Callable[[str], Iterable[tuple[int, int]]]
    # Lower-case strings one of which every match holds: the rule is skipped on text (lower-
    # cased) that holds none. Most text holds none, and a regex scan costs microseconds per KB.
    # A case-blind pattern's needles avoid i, k and s: re's IGNORECASE also matches them to
    # letters that lower() does not map to them (dotless i, long s).
    needs: tuple[str, ...] = ()


_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # a pattern RE2 refuses stays on re; that is no error


def linear(pattern: str) -> Any:
    """`pattern` compiled for RE2 (flags inline: `(?i)`, `(?s)`); re2.error where it needs
    what RE2 lacks."""
    return re2.compile(pattern, _RE2_OPTIONS)


def on_re2(pattern: re.Pattern[str]) -> Any:
    """A compiled re pattern moved to RE2 where RE2 takes it and its flags mean the same there;
    left on re otherwise."""
    flags = pattern.flags & ~re.UNICODE
    if flags & re.VERBOSE and not re.search(r"[\s#]", pattern.pattern):
        flags &= ~re.VERBOSE  # nothing in the pattern for it to change
    if flags & ~re.IGNORECASE:
        return pattern
    try:
        return linear(("(?i)" if flags else "") + pattern.pattern)
    except re2.error:
        return pattern


def _match_spans(pattern: Any, text: str, group: int = 0) -> list[tuple[int, int]]:
    return [m.span(group) for m in pattern.finditer(text)]


def _plugin(kind: str, plugin: RegexBasedDetector, needs: tuple[str, ...], group: int = 0) -> _Rule:
    """A rule from a detect-secrets plugin's patterns, keeping the whole match (its own
    analyze_string keeps only capture groups where a pattern has them)."""
    patterns = [on_re2(p) for p in plugin.denylist]
    return _Rule(
        kind, lambda text: [s for p in patterns for s in _match_spans(p, text, group)], needs
    )


# Where re's \b starts a match: RE2's \b knows only ASCII letters, and would start one inside
# a word after a letter such as ń. The character before is matched, the token is group 1.
_WORD_START = r"(?:^|[^\p{L}\p{N}_])"
_JWT = linear(_WORD_START + r"(eyJ[A-Za-z0-9_-]+\.eyJ[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*)")


def _jwts(text: str) -> list[tuple[int, int]]:
    return [
        m.span(1) for m in _JWT.finditer(text) if JwtTokenDetector.is_formally_valid(m.group(1))
    ]


def _regex(kind: str, pattern: str, needs: tuple[str, ...] = (), group: int = 0) -> _Rule:
    compiled = linear(pattern)
    return _Rule(kind, lambda text: _match_spans(compiled, text, group), needs)


def luhn_valid(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch)
        if i % 2 == 1:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


# Card numbers as people write them: unbroken, in groups of four, or Amex's 4-6-5; not after
# a plus sign, where they are phone numbers. The first digit is matched before the
# look-behind so that re scans only from digits (7x faster). Its back-references keep it on
# re; every repeat is bounded.
_CARD = re.compile(
    r"\d(?<![\d+-]\d)"
    r"(?:\d{12,18}|\d{3}(?:([ -])\d{4}){2,3}(?:\1\d{1,3})?|\d{3}([ -])\d{6}\2\d{4,5})"
    r"(?![\d-])"
)


_ASCII_DIGITS = b"0123456789"
_CARD_DIGITS = 13  # the fewest a card number has


def _cards(text: str) -> list[tuple[int, int]]:
    # Most text holds fewer digits than a card: they are counted at C speed, where the pattern
    # costs microseconds per KB. Only in ASCII text: \d also matches other scripts' digits.
    if text.isascii():
        raw = text.encode()
        if len(raw) - len(raw.translate(None, _ASCII_DIGITS)) < _CARD_DIGITS:
            return []
    found = []
    for match in _CARD.finditer(text):
        digits = "".join(str(int(d)) for d in re.sub(r"[ -]", "", match.group(0)))
        if _issued(digits) and luhn_valid(digits):
            found.append(match.span())
    return found


# The card networks' number ranges: (first prefix, last prefix, lengths). A number outside
# them is something else that passes Luhn's check: an IMEI (which uses it too, 15 digits),
# an account or parcel number, one in ten phone numbers written without spaces.
_ISSUERS: tuple[tuple[str, str, range], ...] = (
    ("4", "4", range(13, 20, 3)),  # Visa: 13, 16 or 19
    ("51", "55", range(16, 17)),  # Mastercard
    ("2221", "2720", range(16, 17)),
    ("34", "34", range(15, 16)),  # American Express
    ("37", "37", range(15, 16)),
    ("6011", "6011", range(16, 20)),  # Discover
    ("644", "649", range(16, 20)),
    ("65", "65", range(16, 20)),
    ("62", "62", range(16, 20)),  # UnionPay
    ("3528", "3589", range(16, 20)),  # JCB
    ("300", "305", range(14, 20)),  # Diners Club
    ("36", "36", range(14, 20)),
    ("38", "39", range(16, 20)),
    ("5018", "5018", range(13, 20)),  # Maestro
    ("5020", "5020", range(13, 20)),
    ("5038", "5038", range(13, 20)),
    ("5893", "5893", range(13, 20)),
    ("6304", "6304", range(13, 20)),
    ("6759", "6759", range(13, 20)),
    ("6761", "6763", range(13, 20)),
)


def _issued(digits: str) -> bool:
    """Whether `digits` (ASCII) lie in a card network's range, at one of its lengths."""
    return any(
        len(digits) in lengths and first <= digits[: len(first)] <= last
        for first, last, lengths in _ISSUERS
    )


# A key pasted without its END line (cut short, or split over two messages): the header, its
# encryption fields, and the runs of base64 after it, on their own lines or, where a chat
# turned the newlines into spaces, on one. A run is 16 characters at least, so the words of
# a sentence after the key are kept (the key's last line, if shorter, is too). Its look-ahead
# keeps it on re: it starts only at a header, and each run ends at the next white space.
_UNTERMINATED_KEY = re.compile(
    r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----"
    r"(?:\s*(?:Proc-Type|DEK-Info): [^\n]*)*"
    r"(?:\s*[A-Za-z0-9+/=]{16,}(?![^\s]))*"
)


def _unterminated_keys(text: str) -> list[tuple[int, int]]:
    return _match_spans(_UNTERMINATED_KEY, text)


_SK_KEY = linear(_WORD_START + r"(sk-(?:[A-Za-z0-9]+-)*[A-Za-z0-9_-]{20,})")


def _sk_keys(text: str) -> list[tuple[int, int]]:
    # A key's random part holds digits; words joined by hyphens (sk-learn-compatible-models)
    # do not.
    return [
        (start, end)
        for start, end in _match_spans(_SK_KEY, text, 1)
        if any(c.isdigit() for c in text[start:end])
    ]


# What re's \s+ matches (str.isspace()): RE2's \s is ASCII white space alone, and a token
# pasted after a no-break space would pass.
_SPACES = r"[\s\p{Z}\x0b\x1c-\x1f\x85]+"

_SECRET_RULES: tuple[_Rule, ...] = (
    _regex(
        "private_key",
        r"(?s)-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----.*?"
        r"-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----",
        needs=("-----begin ",),
    ),
    _Rule("private_key", _unterminated_keys, ("-----begin ",)),
    # The plugins' needles follow their patterns (tests/unit/test_redaction.py pins them);
    # AWS's second pattern is case-blind, hence "aw".
    _plugin("aws_key", AWSKeyDetector(), ("a3t", "abia", "acca", "akia", "asia", "aw")),
    _plugin("github_token", GitHubTokenDetector(), ("ghp_", "gho_", "ghu_", "ghs_", "ghr_")),
    _regex("github_token", r"github_pat_[A-Za-z0-9_]{22,255}", ("github_pat_",)),
    _plugin(
        "gitlab_token",
        GitLabTokenDetector(),
        (
            *("glpat-", "gldt-", "glft-", "glsoat-", "glrt-", "gr1348941", "glcbt-"),
            *("glimt-", "glptt-", "glagent-", "gloas-"),
        ),
    ),
    _plugin("slack_token", SlackDetector(), ("xox", ".com")),
    _plugin("stripe_key", StripeDetector(), ("k_live_",)),
    _regex("stripe_key", r"(?:sk|rk)_(?:live|test)_[0-9a-zA-Z]{24,99}", ("k_live_", "k_test_")),
    _plugin("openai_key", OpenAIDetector(), ("t3blbkfj",)),
    _Rule("api_key", _sk_keys, ("sk-",)),
    # This service's own keys (auth.KEY_PREFIX): those most likely pasted into an agent's memory.
    _regex(
        "memory_api_key", _WORD_START + r"(cmk_[A-Za-z0-9_-]{43})(?:[^A-Za-z0-9_-]|$)", ("cmk_",), 1
    ),
    _Rule("jwt", _jwts, ("eyj",)),
    _regex(
        "bearer_token", r"(?i)\bBearer" + _SPACES + r"([A-Za-z0-9._~+/-]{16,}=*)", ("bearer",), 1
    ),
    _plugin("url_password", BasicAuthDetector(), ("://",), group=1),
    _Rule("card_number", _cards),
)

# Look-arounds keep the phone pattern on re; its repeats are bounded.
_PHONE = re.compile(r"(?<![\w+])\+?\d{1,3}[ .-]?\(?\d{2,4}\)?[ .-]?\d{3,4}[ .-]?\d{3,4}(?!\w)")

_PII_RULES: tuple[_Rule, ...] = (
    _regex("email", r"\b[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}\b", ("@",)),
    _Rule("phone", lambda text: _match_spans(_PHONE, text)),
)


# Every rule's needles, found in one pass over the text: one `in` a needle took longer than
# all of the rules' patterns on ordinary text.
_NEEDLES = AhoCorasick(sorted({n for rule in _SECRET_RULES + _PII_RULES for n in rule.needs}))


def _needles_in(lowered: str) -> set[str]:
    return set(_NEEDLES.find_matches_as_strings(lowered, overlapping=True))


# A finding pasted again elsewhere, without the context its pattern needs (a URL's password
# in a sentence), is the same secret; but a short string recurs by chance, and one inside a
# longer word is part of that word: a URL password "admin" must not take the "admin" out of
# "administrator".
_REPEAT_MIN_CHARS = 8


def _is_word_char(ch: str) -> bool:
    return ch.isalnum() or ch == "_"


def _stands_alone(text: str, start: int, end: int) -> bool:
    """Whether text[start:end] splits no run of word characters."""
    inside_at_start = start > 0 and _is_word_char(text[start - 1]) and _is_word_char(text[start])
    inside_at_end = end < len(text) and _is_word_char(text[end - 1]) and _is_word_char(text[end])
    return not (inside_at_start or inside_at_end)


def _replace_spans(text: str, spans: Iterable[tuple[int, int]], kind: str) -> tuple[str, int]:
    """`text` with every finding replaced by the kind's marker, and how many distinct ones
    there were. Each finding is replaced where the rule found it, and wherever else its text
    stands on its own if it is long enough to be no coincidence; findings that overlap become
    one marker, so no part of either is left. One pass (Aho-Corasick for the other
    occurrences): a replace and a new scan for each was quadratic in their number, and
    thousands of distinct keys fit in one message."""
    found = [(a, b) for a, b in spans if 0 <= a < b]
    if not found:
        return text, 0
    distinct = sorted({text[a:b] for a, b in found})
    repeatable = [s for s in distinct if len(s) >= _REPEAT_MIN_CHARS]
    if repeatable:
        # A contiguous NFA builds in time linear in the strings; the DFA chosen by default
        # for a few strings built in seconds for one of 20 KB.
        matcher = AhoCorasick(
            repeatable,
            matchkind=MatchKind.LeftmostLongest,
            implementation=Implementation.ContiguousNFA,
        )
        found += [
            (a, b) for _, a, b in matcher.find_matches_as_indexes(text) if _stands_alone(text, a, b)
        ]
    parts: list[str] = []
    last = 0
    for a, b in _merged(found):
        parts += (text[last:a], marker(kind))
        last = b
    parts.append(text[last:])
    return "".join(parts), len(distinct)


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Overlapping spans joined, in order."""
    out: list[tuple[int, int]] = []
    for a, b in sorted(spans):
        if out and a < out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


@dataclass(frozen=True)
class Redactor:
    """Replaces secrets (and, with `pii`, emails and phone numbers) in text."""

    pii: bool = False

    def redact(self, text: str) -> tuple[str, list[str]]:
        """The text with each finding replaced by its marker, and the kinds found."""
        kinds: list[str] = []
        rules = _SECRET_RULES + (_PII_RULES if self.pii else ())
        present = _needles_in(text.lower())
        for rule in rules:
            if rule.needs and present.isdisjoint(rule.needs):
                continue
            text, replaced = _replace_spans(text, rule.spans(text), rule.kind)
            if replaced:
                present = _needles_in(text.lower())
                kinds.extend([rule.kind] * replaced)
        return text, kinds

    def redact_value(self, value: Any) -> Any:
        """`value` with every string inside it redacted (metadata objects). An integer that
        is a card number becomes its redacted text; the personal-data rules leave numbers
        alone, as timestamps, ids and coordinates have the digits of a phone number."""
        if isinstance(value, str):
            return self.redact(value)[0]
        if isinstance(value, int) and not isinstance(value, bool):
            text = str(value)
            redacted = Redactor(pii=False).redact(text)[0]
            return value if redacted == text else redacted
        if isinstance(value, dict):
            return {k: self.redact_value(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.redact_value(v) for v in value]
        return value
