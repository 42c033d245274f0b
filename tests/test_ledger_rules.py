"""supervisor.manager.ledger, fed by a real Outbox (SQLite in a temp dir) and a real Redactor: one entry a call, oldest
first, its state and attempts as the outbox counts them, what it carried (the payload's scalars, masked, cut
short; nested values and non-finite numbers left out), the manager's answer the same way, the last error masked
and cut; and rows of odd shapes (spoilt JSON, a payload that is not an object) that still give an entry."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.manager.ledger import LEDGER_VALUE_CHARS, ledger
from supervisor.manager.outbox import Outbox
from supervisor.text.redact import MASK, Redactor

SECRET = "tok-5ecret-value"


@pytest.fixture
def outbox(tmp_path: Path) -> Iterator[Outbox]:
    box = Outbox(tmp_path / "outbox.sqlite3")
    yield box
    box.close()


def masked() -> Redactor:
    return Redactor([SECRET])


def test_each_call_in_order_with_its_state_and_attempts(outbox: Outbox) -> None:
    first = outbox.add("register", {"label": "C.1"})
    second = outbox.add("running", {})
    third = outbox.add("bench-done", {"rate": 12.5})
    outbox.delivered(first, {"uuid": "u-1"})
    outbox.attempted(second, "HTTP 503")
    outbox.attempted(second, "HTTP 502")
    outbox.failed(third, "HTTP 400: bad rate", sent=True)
    entries = ledger(outbox.history(20), masked().text)
    assert [(e["id"], e["kind"], e["state"]) for e in entries] == [
        (first, "register", "delivered"), (second, "running", "pending"), (third, "bench-done", "failed")]
    assert entries[0]["answer"] == {"uuid": "u-1"} and entries[0]["carried"] == {"label": "C.1"}
    assert entries[0]["finished"] is not None and entries[1]["finished"] is None
    assert entries[1]["attempts"] == 2 and entries[1]["last_error"] == "HTTP 502"
    assert entries[2]["last_error"] == "HTTP 400: bad rate"
    assert all(isinstance(e["created"], float) for e in entries)


def test_a_call_failed_without_being_sent_counts_no_attempt(outbox: Outbox) -> None:
    """A call not sent (the row killed, given up, set aside) was shown as "1 attempt(s)": read as received."""
    refused = outbox.add("param-done", {})
    outbox.attempted(refused, "HTTP 503")
    outbox.failed(refused, "HTTP 400: bad", sent=True)
    killed = outbox.add("running", {})
    outbox.failed(killed, "not sent: the manager killed this instance", sent=False)
    retried = outbox.add("bench-done", {"rate": 1.0})
    outbox.attempted(retried, "HTTP 503")
    outbox.failed(retried, "not sent: the manager killed this instance", sent=False)
    outbox.delivered(delivered := outbox.add("register", {}), {"uuid": "u-1"})
    entries = ledger(outbox.history(20), masked().text)
    assert [(e["id"], e["attempts"]) for e in entries] == [(refused, 2), (killed, 0), (retried, 1), (delivered, 1)]


def test_only_the_scalars_of_what_was_carried_are_kept(outbox: Outbox) -> None:
    outbox.add("bench-done", {"rate": 0, "passed": False, "note": None, "ratio": 0.5,
                              "nested": {"a": 1}, "list": [1, 2], "inf": float("inf"), "nan": float("nan")})
    entry = ledger(outbox.history(20), masked().text)[0]
    assert entry["carried"] == {"rate": 0, "passed": False, "note": None, "ratio": 0.5}


def test_secrets_are_masked_in_what_was_carried_the_answer_and_the_error(outbox: Outbox) -> None:
    call = outbox.add("register", {"token": SECRET, "label": f"C.1 {SECRET}"})
    outbox.attempted(call, f"401 for Bearer {SECRET}")
    outbox.delivered(call, {"echo": SECRET})
    entry = ledger(outbox.history(20), masked().text)[0]
    assert SECRET not in repr(entry)
    assert entry["carried"]["label"].startswith("C.1 ") and entry["carried"]["token"] != SECRET
    assert entry["answer"]["echo"] != SECRET


def test_long_values_and_errors_are_cut(outbox: Outbox) -> None:
    call = outbox.add("bench-done", {"reason": "r" * 5000})
    outbox.failed(call, "e" * 5000, sent=True)
    entry = ledger(outbox.history(20), masked().text)[0]
    assert entry["carried"]["reason"] == "r" * LEDGER_VALUE_CHARS
    assert entry["last_error"] == "e" * LEDGER_VALUE_CHARS


def test_a_secret_across_the_cut_is_masked_before_it_is_cut(outbox: Outbox) -> None:
    # Masked first, then cut: a secret the cut would split is no longer whole once cut, and its first part would
    # show unmasked.
    head = LEDGER_VALUE_CHARS - len(SECRET) // 2
    call = outbox.add("register", {"token": "x" * head + SECRET})
    outbox.failed(call, "e" * head + SECRET, sent=True)
    entry = ledger(outbox.history(20), masked().text)[0]
    half = SECRET[:len(SECRET) // 2]
    assert half not in entry["last_error"] and half not in entry["carried"]["token"], entry
    assert entry["last_error"] == ("e" * head + MASK)[:LEDGER_VALUE_CHARS]


def test_an_answer_that_is_not_an_object_is_no_answer(outbox: Outbox) -> None:
    for response in ("ok", [1, 2], 7, None):
        outbox.delivered(outbox.add("running", {}), response)
    entries = ledger(outbox.history(20), masked().text)
    assert [e["answer"] for e in entries] == [{}, {}, {}, {}]


def test_rows_of_odd_shapes_still_give_an_entry() -> None:
    """Rows as an older outbox may hold them: spoilt JSON, bytes, no payload column at all."""
    rows = [{"id": 1, "kind": "register", "payload": "{spoilt", "response": b'{"uuid": "u"}', "last_error": ""},
            {"id": 2, "kind": "running"},
            {"id": 3, "kind": "x", "payload": '{"7": "seven"}', "last_error": 503}]
    entries = ledger(rows, masked().text)
    assert [(e["id"], e["carried"], e["answer"], e["last_error"]) for e in entries] == [
        (1, {}, {}, None), (2, {}, {}, None), (3, {"7": "seven"}, {}, "503")]
    assert entries[1]["state"] is None and entries[1]["attempts"] is None


def test_no_calls_no_ledger(outbox: Outbox) -> None:
    assert ledger(outbox.history(20), masked().text) == []
