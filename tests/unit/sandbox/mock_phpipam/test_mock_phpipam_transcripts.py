"""Replay every recorded request of phpipam-api.md against the mock and compare the answers.

The requests run in recording order against a store seeded with the recorded server's clean
state, so address ids, IPs and holes line up with the transcripts. Status, the kept headers
(``Location``, ``Connection``, ``Content-Type``) and the body bytes must match, after blanking
``time``, token values and expiry stamps.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import requests
from phpipam_mock_helpers import SEED, normalise
from phpipam_transcripts import TRANSCRIPTS

from mock_phpipam import ManualClock, MockPhpipamServer, Store
from mock_phpipam.store import StoreSettings

# Tokens the recording used for "a valid token"; replayed with the mock's current token.
VALID_TOKENS = {"mecHgCchmVl2mi0K70QqJIzm", "9B2_gsZhdNR25VSZ5xvybjfp"}
# Not replayed as plain requests: the gateway set-up (seeded instead), and the sections
# that changed the database by hand (9: token expiry, 10g: API off, 11: lock-out); those
# have dedicated tests in test_mock_phpipam_auth.py.
REPLAYED = [
    t
    for t in TRANSCRIPTS
    if t["id"] != "create" and not t["id"].startswith(("9", "11")) and t["id"] != "10g"
]


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes


@pytest.fixture(scope="module")
def replay() -> Iterator[dict[str, Answer]]:
    store = Store(
        SEED, clock=ManualClock(1_800_000_000.0), settings=StoreSettings(enforce_ssl=True)
    )
    answers: dict[str, Answer] = {}
    with MockPhpipamServer(store) as server, requests.Session() as session:
        token = ""
        for t in REPLAYED:
            headers = {k: (token if v in VALID_TOKENS else v) for k, v in t["headers"].items()}
            if t["data"] is not None and "Content-Type" not in headers:
                headers["Content-Type"] = "application/x-www-form-urlencoded"  # curl -d
            response = session.request(
                t["method"],
                server.url + t["path"],
                headers=headers,
                data=t["data"],
                auth=t["auth"],
                timeout=5,
            )
            if t["path"].endswith("/user/") and t["method"] == "POST" and response.ok:
                token = response.json()["data"]["token"]
            answers[t["id"]] = Answer(
                response.status_code, dict(response.headers), response.content
            )
        yield answers


@pytest.mark.parametrize("transcript", REPLAYED, ids=[t["id"] for t in REPLAYED])
def test_answer_matches_recording(transcript: dict, replay: dict[str, Answer]) -> None:
    answer = replay[transcript["id"]]
    assert answer.status == transcript["status"], answer.body
    for name in ("Location", "Connection", "Content-Type"):
        assert answer.headers.get(name) == transcript["response_headers"].get(name), name
    assert normalise(answer.body) == normalise(transcript["body"].encode())


def test_replay_covers_the_recorded_behaviours() -> None:
    # Guard against the generator silently dropping transcripts.
    ids = {t["id"] for t in REPLAYED}
    for expected in (
        "1e",
        "1m",
        "2o",
        "3e",
        "3g",
        "4b",
        "4m",
        "5j",
        "5k",
        "6e",
        "7a-1",
        "7p",
        "10b",
    ):
        assert expected in ids
    assert len(REPLAYED) > 100
