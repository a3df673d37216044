"""Run the redactor over every LongMemEval message (ordinary chat) and count what it redacts.

Usage: python benchmarks/redaction/longmemeval.py [--data DIR] [--out FILE]

Ordinary conversation should hold almost no secrets, so each redaction here is a likely false
positive; the examples are written out for review. Also times the redactor: microseconds a
message, and per 1,000 characters.
"""

from __future__ import annotations

import argparse
import gzip
import json
import time
from collections import Counter
from pathlib import Path

from api_service.core.redaction import Redactor

HERE = Path(__file__).resolve().parent
DEFAULT_DATA = HERE.parents[1].parent / "shared" / "data" / "longmemeval"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="LongMemEval folder")
    parser.add_argument(
        "--out", type=Path, default=HERE / "results" / "longmemeval.json", help="results file"
    )
    args = parser.parse_args()
    redactor = Redactor()
    report: dict[str, object] = {}
    started = time.perf_counter()
    for name in ("oracle", "s150"):
        seen: set[str] = set()
        kinds: Counter[str] = Counter()
        examples: list[dict[str, str]] = []
        messages = with_findings = chars = 0
        redacting = 0.0
        with gzip.open(args.data / f"{name}.conversations.jsonl.gz", "rt") as lines:
            for line in lines:
                for message in json.loads(line)["messages"]:
                    content = message["content"]
                    if content in seen:  # haystacks share sessions; count each text once
                        continue
                    seen.add(content)
                    messages += 1
                    chars += len(content)
                    t0 = time.perf_counter()
                    redacted, found = redactor.redact(content)
                    redacting += time.perf_counter() - t0
                    kinds.update(found)
                    with_findings += bool(found)
                    if found and len(examples) < 50:
                        examples.append({"kinds": ",".join(found), "text": redacted[:300]})
        report[name] = {
            "distinct_messages": messages,
            "messages_with_redactions": with_findings,
            "redactions": sum(kinds.values()),
            "by_kind": dict(kinds),
            "examples": examples,
            "mean_chars": round(chars / messages),
            "us_per_message": round(redacting / messages * 1e6, 1),
            "us_per_1000_chars": round(redacting / chars * 1e9, 1),
        }
        print(
            f"{name}: {messages} distinct messages, {sum(kinds.values())} redactions "
            f"{dict(kinds)}, {redacting / messages * 1e6:.1f} us a message",
            flush=True,
        )
    report["seconds"] = round(time.perf_counter() - started, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
