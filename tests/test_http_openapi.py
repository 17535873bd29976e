"""schemathesis against the served OpenAPI document.

The schemathesis command (a real process) loads ``/agentik/openapi.json`` from
the running server and sends it generated requests, valid and invalid, in
every phase (coverage, fuzzing, stateful sequences following the links it
infers): every response must match the document — status code, content
type, headers, body — and none may be a 5xx.  All its checks run, including
that requests without the token are refused.

The event streams are left out: they never end, so no generated request to
them could finish; test_http_api.py tests them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from httpserver import TOKENS, threaded_server

SETTINGS = {
    "tokens": [
        {"name": "admin", "env": "ADMIN_TOKEN"},
        {"name": "alice", "env": "ALICE_TOKEN", "channels": ["http:web:alice:"]},
    ],
}
ADMIN = {"Authorization": f"Bearer {TOKENS['ADMIN_TOKEN']}"}
SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    db = tmp_path_factory.mktemp("openapi") / "agentik.db"
    with threaded_server(str(db), settings=SETTINGS, environ=TOKENS) as server:
        # Some real conversations with history, for the generated requests to find.
        with httpx.Client(base_url=server.api, headers=ADMIN) as c:
            for title in ("first", "second"):
                conv = c.post("/conversations", json={"title": title}).json()
                c.post(f"/conversations/{conv['id']}/messages", json={"content": "hello"})
        yield server


# Half a minute on an idle machine; the suite's 120 s guard is too tight under load.
@pytest.mark.timeout(450)
def test_schemathesis_finds_no_server_error_and_no_mismatch(api, tmp_path):
    assert SCHEMATHESIS.exists(), "schemathesis is in the dev extra: pip install -e '.[dev]'"
    result = subprocess.run(
        [
            str(SCHEMATHESIS),
            "run",
            api.api + "/openapi.json",
            "--header",
            f"Authorization: {ADMIN['Authorization']}",
            "--exclude-path-regex",
            # (uploads: their type comes from their bytes, which no schema can say, so a
            # schema-valid upload is refused; tests/test_http_attachments.py covers it)
            "/events$|/attachments$",
            "--checks",
            "all",
            "--max-examples",
            "30",
            "--seed",
            # (another seed: AGENTIK_FUZZ_SEED=N, to shake out what this one misses)
            os.environ.get("AGENTIK_FUZZ_SEED", "20251"),
            "--workers",
            "2",
            "--generation-database",
            "none",
            "--no-color",
        ],
        capture_output=True,
        text=True,
        timeout=400,
        cwd=tmp_path,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "Failures:" not in output and "Errors:" not in output, output
    # It really exercised the API: every operation but the two streams (the two
    # approvals operations, redact, /ready, /status, the conversation status, search,
    # regenerate, edit, an attachment's download and the four checkpoint operations).
    assert "Tested: 26" in output


def test_the_document_lists_every_route(api):
    with httpx.Client(base_url=api.url) as c:
        doc = c.get("/agentik/openapi.json").json()
    ops = {
        (method.upper(), path)
        for path, item in doc["paths"].items()
        for method in item
        if method != "parameters"
    }
    assert ops == {
        ("GET", "/health"),
        ("GET", "/ready"),
        ("GET", "/agentik/status"),
        ("GET", "/agentik/openapi.json"),
        ("POST", "/agentik/conversations"),
        ("GET", "/agentik/conversations"),
        ("POST", "/agentik/conversations/import"),
        ("GET", "/agentik/conversations/{conversation_id}/export"),
        ("GET", "/agentik/conversations/{conversation_id}/checkpoints"),
        ("POST", "/agentik/conversations/{conversation_id}/checkpoints"),
        ("GET", "/agentik/conversations/{conversation_id}/checkpoints/{checkpoint_id}"),
        ("DELETE", "/agentik/conversations/{conversation_id}/checkpoints/{checkpoint_id}"),
        ("GET", "/agentik/conversations/{conversation_id}"),
        ("PATCH", "/agentik/conversations/{conversation_id}"),
        ("DELETE", "/agentik/conversations/{conversation_id}"),
        ("POST", "/agentik/conversations/{conversation_id}/messages"),
        ("GET", "/agentik/conversations/{conversation_id}/messages"),
        ("POST", "/agentik/conversations/{conversation_id}/attachments"),
        ("GET", "/agentik/conversations/{conversation_id}/attachments/{sha256}"),
        ("POST", "/agentik/conversations/{conversation_id}/interrupt"),
        ("GET", "/agentik/conversations/{conversation_id}/status"),
        ("GET", "/agentik/conversations/{conversation_id}/approvals"),
        ("POST", "/agentik/conversations/{conversation_id}/approvals/{approval_id}"),
        ("POST", "/agentik/conversations/{conversation_id}/questions/{question_id}"),
        ("POST", "/agentik/conversations/{conversation_id}/messages/{message_id}/redact"),
        ("GET", "/agentik/conversations/{conversation_id}/events"),
        ("GET", "/agentik/events"),
        ("GET", "/agentik/search"),
        ("POST", "/agentik/conversations/{conversation_id}/regenerate"),
        ("POST", "/agentik/conversations/{conversation_id}/edit"),
    }
    # Every error code the server can answer is in the document's enum.
    from agentik.transports.http.openapi import ERROR_CODES

    enum = doc["components"]["schemas"]["Error"]["properties"]["error"]["properties"]["code"]
    assert enum["enum"] == list(ERROR_CODES)
