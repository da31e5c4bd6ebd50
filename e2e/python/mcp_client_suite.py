"""The official MCP Python SDK as the client of the monolith's MCP server.

Run by e2e/tests/it/mcp_e2e.rs against a running, seeded monolith:

    DUO_URL=... DUO_ALICE_MCP=... DUO_CAROL_MCP=... DUO_ALICE_API=... python mcp_client_suite.py

alice owns the `acme` group; carol is a guest there (she reads the private
project acme/platform/api but not its confidential issue #2). Each step prints
`ok: <name>`; any failure raises, says which step failed, and exits non-zero.
"""

import asyncio
import base64
import hashlib
import json
import os
import re
import secrets
import sys
import traceback
import uuid
from urllib.parse import parse_qs, urlencode, urlparse

import httpx2
from mcp import Client
from mcp.client.auth import OAuthClientProvider, TokenStorage
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientMetadata

URL = os.environ["DUO_URL"]
MCP_URL = f"{URL}/api/v4/mcp"
ALICE = os.environ["DUO_ALICE_MCP"]
CAROL = os.environ["DUO_CAROL_MCP"]
ALICE_API = os.environ["DUO_ALICE_API"]
ALICE_PASSWORD = os.environ["DUO_ALICE_PASSWORD"]
REDIRECT = "http://127.0.0.1:47111/callback"
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


class MemoryStorage(TokenStorage):
    def __init__(self):
        self.tokens = None
        self.client_info = None

    async def get_tokens(self):
        return self.tokens

    async def set_tokens(self, tokens):
        self.tokens = tokens

    async def get_client_info(self):
        return self.client_info

    async def set_client_info(self, client_info):
        self.client_info = client_info


def hidden(html, name):
    found = re.search(rf'name="{name}" value="([^"]*)"', html)
    expect(found, f"no {name} in the page")
    return found.group(1).replace("&amp;", "&")


async def signed_in_browser():
    """An HTTP client with alice's web session, as a browser would have."""
    web = httpx2.AsyncClient(base_url=URL, follow_redirects=False, timeout=30)
    form = await web.get("/users/sign_in")
    r = await web.post(
        "/users/sign_in",
        data={
            "authenticity_token": hidden(form.text, "authenticity_token"),
            "username": "alice",
            "password": ALICE_PASSWORD,
        },
    )
    expect(r.status_code == 303, f"sign-in answered {r.status_code}")
    return web


async def consent(web, authorize_url, decision="approve"):
    """Opens the consent page and presses a button; returns the redirect's query."""
    page = await web.get(authorize_url)
    expect(page.status_code == 200, f"consent page {page.status_code}: {page.text[:300]}")
    expect("Authorize" in page.text, page.text[:300])
    fields = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', page.text))
    fields = {k: v.replace("&amp;", "&") for k, v in fields.items()}
    fields["decision"] = decision
    r = await web.post("/oauth/authorize", data=fields)
    expect(r.status_code == 302, f"consent answered {r.status_code}: {r.text[:300]}")
    location = r.headers["location"]
    expect(location.startswith(REDIRECT), location)
    return parse_qs(urlparse(location).query)


@step("oauth: discovery, dynamic registration, consent with PKCE S256, then tools with the token")
async def oauth_flow():
    web = await signed_in_browser()
    seen = {}

    async def redirect_handler(url):
        seen["url"] = url

    async def callback_handler():
        query = await consent(web, seen["url"])
        return AuthorizationCodeResult(
            code=query["code"][0], state=query.get("state", [None])[0], iss=query.get("iss", [None])[0]
        )

    storage = MemoryStorage()
    provider = OAuthClientProvider(
        server_url=MCP_URL,
        client_metadata=OAuthClientMetadata(
            client_name="MCP suite",
            redirect_uris=[REDIRECT],
            grant_types=["authorization_code", "refresh_token"],
            response_types=["code"],
            scope="mcp",
        ),
        storage=storage,
        redirect_handler=redirect_handler,
        callback_handler=callback_handler,
    )
    http = httpx2.AsyncClient(auth=provider, timeout=30)
    client = Client(streamable_http_client(MCP_URL, http_client=http))
    async with http, client:
        issue = await client.call_tool("get_issue", {"id": API_PROJECT, "issue_iid": 1})
        expect(not issue.is_error, text_of(issue))
        expect(json.loads(text_of(issue))["author"]["username"] == "bob", text_of(issue))
    expect("code_challenge_method=S256" in seen["url"], seen["url"])
    tokens, info = storage.tokens, storage.client_info
    expect(tokens.scope == "mcp" and tokens.refresh_token, tokens)

    # The token is good for MCP and nothing else of the API.
    async with httpx2.AsyncClient() as plain:
        r = await plain.get(
            f"{URL}/api/v4/projects/1/issues", headers={"Authorization": f"Bearer {tokens.access_token}"}
        )
        expect(r.status_code == 403, f"REST with an mcp token: {r.status_code}")

        # Refresh rotates: the new pair works, the old refresh token is spent.
        form = {"grant_type": "refresh_token", "client_id": info.client_id, "refresh_token": tokens.refresh_token}
        r = await plain.post(f"{URL}/oauth/token", data=form)
        expect(r.status_code == 200, r.text)
        fresh = r.json()
        again = await plain.post(f"{URL}/oauth/token", data=form)
        expect(again.status_code == 400 and again.json()["error"] == "invalid_grant", again.text)

        # The user sees the application and can revoke it.
        listed = await web.get("/-/user_settings/applications")
        expect("MCP suite" in listed.text, listed.text[:300])

        # Revocation (RFC 7009): the access token stops working.
        r = await plain.post(f"{URL}/oauth/revoke", data={"token": fresh["access_token"], "client_id": info.client_id})
        expect(r.status_code == 200, r.text)
        r = await plain.post(
            MCP_URL, json=INITIALIZE, headers={**ACCEPT, "Authorization": f"Bearer {fresh['access_token']}"}
        )
        expect(r.status_code == 401, f"revoked token: {r.status_code}")
    await web.aclose()


@step("oauth: a wrong PKCE verifier, a forged consent, an unregistered redirect and a denial are refused")
async def oauth_refusals():
    async with httpx2.AsyncClient(timeout=30) as plain:
        reg = await plain.post(
            f"{URL}/oauth/register", json={"client_name": "Verifier test", "redirect_uris": [REDIRECT]}
        )
        expect(reg.status_code == 201, reg.text)
        client_id = reg.json()["client_id"]
        bad = await plain.post(
            f"{URL}/oauth/register", json={"client_name": "Evil", "redirect_uris": ["http://evil.example/cb"]}
        )
        expect(bad.status_code == 400 and bad.json()["error"] == "invalid_redirect_uri", bad.text)
        web = await signed_in_browser()
        verifier = secrets.token_urlsafe(48)
        challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
        params = {
            "response_type": "code",
            "client_id": client_id,
            "redirect_uri": REDIRECT,
            "code_challenge": challenge,
            "code_challenge_method": "S256",
            "scope": "mcp",
            "state": "xyz",
        }
        query = await consent(web, "/oauth/authorize?" + urlencode(params))
        expect(query["state"] == ["xyz"], query)
        code = query["code"][0]
        exchange = {"grant_type": "authorization_code", "client_id": client_id, "code": code, "redirect_uri": REDIRECT}
        wrong = await plain.post(f"{URL}/oauth/token", data={**exchange, "code_verifier": secrets.token_urlsafe(48)})
        expect(wrong.status_code == 400 and wrong.json()["error"] == "invalid_grant", wrong.text)
        right_too_late = await plain.post(f"{URL}/oauth/token", data={**exchange, "code_verifier": verifier})
        expect(right_too_late.status_code == 400, right_too_late.text)
        # A redirect URI the client never registered: an error page, no redirect.
        page = await web.get("/oauth/authorize?" + urlencode({**params, "redirect_uri": "https://evil.example/cb"}))
        expect(page.status_code == 400 and "location" not in page.headers, page.status_code)
        # Plain PKCE (or none) is refused back to the client.
        r = await web.get("/oauth/authorize?" + urlencode({**params, "code_challenge_method": "plain"}))
        expect(r.status_code == 302 and "error=invalid_request" in r.headers["location"], r.headers)
        denied = await consent(web, "/oauth/authorize?" + urlencode(params), decision="deny")
        expect(denied["error"] == ["access_denied"] and "code" not in denied, denied)
        # The consent form needs the session's form token: a forged post gets no code.
        page = await web.get("/oauth/authorize?" + urlencode(params))
        fields = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', page.text))
        fields = {k: v.replace("&amp;", "&") for k, v in fields.items()}
        forged = await web.post("/oauth/authorize", data={**fields, "authenticity_token": "forged", "decision": "approve"})
        expect(forged.status_code == 403 and "location" not in forged.headers, forged.status_code)
        # Nobody signed in: the sign-in page, no code.
        async with httpx2.AsyncClient(base_url=URL, follow_redirects=False) as anonymous:
            r = await anonymous.post("/oauth/authorize", data={**fields, "decision": "approve"})
            expect(r.status_code == 303 and r.headers["location"].startswith("/users/sign_in"), r.headers)
        # The list of every application is the admin's.
        r = await web.get("/admin/applications")
        expect(r.status_code == 404, f"a non-admin got /admin/applications: {r.status_code}")
        await web.aclose()


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
