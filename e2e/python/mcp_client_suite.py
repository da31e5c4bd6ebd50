"""The official MCP Python SDK as the client of the monolith's MCP server.

Run by e2e/tests/it/mcp_e2e.rs against a running, seeded monolith:

    DUO_URL=... DUO_ALICE_MCP=... DUO_CAROL_MCP=... DUO_ALICE_API=... python mcp_client_suite.py

alice owns the `acme` group; carol is a guest there (she reads the private
project acme/platform/api but not its confidential issue #2). Each step prints
`ok: <name>`; any failure raises, says which step failed, and exits non-zero.
"""

import asyncio
import json
import os
import sys
import traceback
import uuid

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

URL = os.environ["DUO_URL"]
MCP_URL = f"{URL}/api/v4/mcp"
ALICE = os.environ["DUO_ALICE_MCP"]
CAROL = os.environ["DUO_CAROL_MCP"]
ALICE_API = os.environ["DUO_ALICE_API"]
API_PROJECT = "acme/platform/api"
STEPS = []


def step(name):
    def wrap(fn):
        STEPS.append((name, fn))
        return fn

    return wrap


def expect(condition, message):
    if not condition:
        raise AssertionError(message)


def connect(token):
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30)
    return Client(streamable_http_client(MCP_URL, http_client=http)), http


def text_of(result):
    return "\n".join(block.text for block in result.content if getattr(block, "text", None))


INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "suite", "version": "1"},
    },
}
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


@step("discovery: no token is a 401 naming the protected resource metadata")
async def discovery():
    async with httpx2.AsyncClient() as http:
        r = await http.post(MCP_URL, json=INITIALIZE, headers=ACCEPT)
        expect(r.status_code == 401, f"status {r.status_code}")
        challenge = r.headers.get("www-authenticate", "")
        expect("resource_metadata=" in challenge, challenge)
        expect(r.json()["error"]["code"] == -32001, r.text)


@step("scope: a token with only api is refused with insufficient_scope")
async def api_only():
    async with httpx2.AsyncClient() as http:
        r = await http.post(
            MCP_URL, json=INITIALIZE, headers={**ACCEPT, "Authorization": f"Bearer {ALICE_API}"}
        )
        expect(r.status_code == 403, f"status {r.status_code}")
        expect('error="insufficient_scope"' in r.headers.get("www-authenticate", ""), r.headers)


@step("session: initialize, version negotiated, tools listed with schemas")
async def tools_list():
    client, http = connect(ALICE)
    async with http, client:
        listed = await client.list_tools()
        names = {tool.name for tool in listed.tools}
        for wanted in [
            "get_issue",
            "create_issue",
            "get_merge_request",
            "get_merge_request_commits",
            "get_merge_request_diffs",
            "get_merge_request_pipelines",
            "get_pipeline_jobs",
            "get_workitem_notes",
            "create_workitem_note",
            "search",
            "semantic_code_search",
            "get_mcp_server_version",
        ]:
            expect(wanted in names, f"{wanted} missing from {sorted(names)}")
        issue_tool = next(t for t in listed.tools if t.name == "get_issue")
        expect(issue_tool.input_schema["required"] == ["id", "issue_iid"], issue_tool.input_schema)
        version = await client.call_tool("get_mcp_server_version", {})
        expect(not version.is_error and "version" in json.loads(text_of(version)), text_of(version))


@step("reads: an issue by project path, a merge request and its diffs")
async def reads():
    client, http = connect(ALICE)
    async with http, client:
        issue = await client.call_tool("get_issue", {"id": API_PROJECT, "issue_iid": 1})
        expect(not issue.is_error, text_of(issue))
        body = json.loads(text_of(issue))
        expect(body["title"] == "Login fails with expired sessions", body)
        expect(body["web_url"].endswith("/acme/platform/api/-/issues/1"), body)
        found = await client.call_tool(
            "search", {"scope": "issues", "search": "expired", "group_id": "acme"}
        )
        hits = json.loads(text_of(found))
        expect([h["iid"] for h in hits] == [1], hits)


@step("permissions: a guest gets an error for a confidential issue, and nothing of it")
async def confidential():
    client, http = connect(CAROL)
    async with http, client:
        readable = await client.call_tool("get_issue", {"id": API_PROJECT, "issue_iid": 1})
        expect(not readable.is_error, text_of(readable))
        hidden = await client.call_tool("get_issue", {"id": API_PROJECT, "issue_iid": 2})
        expect(hidden.is_error, text_of(hidden))
        expect("404 Issue Not Found" in text_of(hidden), text_of(hidden))
        expect("token leak" not in text_of(hidden).lower(), text_of(hidden))
        searched = await client.call_tool(
            "search", {"scope": "issues", "search": "token leak", "project_id": API_PROJECT}
        )
        expect(json.loads(text_of(searched)) == [], text_of(searched))
        missing = await client.call_tool("get_issue", {"id": "acme/nowhere", "issue_iid": 1})
        expect(missing.is_error and "404 Project Not Found" in text_of(missing), text_of(missing))


@step("writes: an issue and a note created as the token's user; a guest's internal note refused")
async def writes():
    title = f"Opened over MCP {uuid.uuid4().hex[:6]}"
    client, http = connect(ALICE)
    async with http, client:
        created = await client.call_tool(
            "create_issue", {"id": API_PROJECT, "title": title, "labels": "mcp,agent"}
        )
        expect(not created.is_error, text_of(created))
        issue = json.loads(text_of(created))
        expect(issue["author"]["username"] == "alice" and issue["labels"] == ["mcp", "agent"], issue)
        note = await client.call_tool(
            "create_workitem_note",
            {"project_id": API_PROJECT, "work_item_iid": issue["iid"], "body": "Looked into it."},
        )
        expect(not note.is_error, text_of(note))
        notes = await client.call_tool(
            "get_workitem_notes", {"project_id": API_PROJECT, "work_item_iid": issue["iid"]}
        )
        expect([n["body"] for n in json.loads(text_of(notes))] == ["Looked into it."], text_of(notes))
    # The issue is there for the REST API too.
    async with httpx2.AsyncClient(headers={"PRIVATE-TOKEN": ALICE_API}) as rest:
        r = await rest.get(f"{URL}/api/v4/projects/acme%2Fplatform%2Fapi/issues/{issue['iid']}")
        expect(r.status_code == 200 and r.json()["title"] == title, r.text)
    client, http = connect(CAROL)
    async with http, client:
        refused = await client.call_tool(
            "create_workitem_note",
            {"project_id": API_PROJECT, "work_item_iid": 1, "body": "psst", "internal": True},
        )
        expect(refused.is_error and "403" in text_of(refused), text_of(refused))


@step("arguments: a call that does not fit the schema is a JSON-RPC error")
async def bad_arguments():
    client, http = connect(ALICE)
    async with http, client:
        try:
            result = await client.call_tool("get_issue", {"id": API_PROJECT, "issue_iid": "one"})
        except Exception as e:  # the SDK raises the JSON-RPC error
            expect("invalid arguments" in str(e), str(e))
        else:
            raise AssertionError(f"no error: {result}")


async def main():
    failed = False
    for name, fn in STEPS:
        try:
            await fn()
            print(f"ok: {name}", flush=True)
        except Exception:
            failed = True
            print(f"FAILED: {name}", flush=True)
            traceback.print_exc()
    sys.exit(1 if failed else 0)


asyncio.run(main())
