"""docs/troubleshooting.md quotes error messages as the code prints them: each quoted fixed part
must still occur in the product's source, so a reworded message fails here until the page
follows."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "troubleshooting.md"
# setup.sh's own check is quoted too
SOURCES = [*sorted((REPO / "airflow_finalckpt").rglob("*.py")), REPO / "scripts" / "setup.sh"]


def _quoted_messages() -> list[str]:
    messages = []
    for line in PAGE.read_text().splitlines():
        match = re.match(r"\| `((?:[^`\\]|\\`)+)`", line)
        if match:
            messages.append(match.group(1).replace("\\`", "`"))
    return messages


def test_the_page_quotes_messages() -> None:
    assert len(_quoted_messages()) >= 25


def test_every_quoted_message_occurs_in_the_code() -> None:
    code = "\n".join(path.read_text() for path in SOURCES)
    missing = [message for message in _quoted_messages() if message not in code]
    assert not missing, f"docs/troubleshooting.md quotes messages the code no longer has: {missing}"
