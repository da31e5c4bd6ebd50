"""GitLab's own REST client, python-gitlab, driving the monolith unchanged.

Run by e2e/tests/it/python_gitlab_e2e.rs against a running, seeded monolith:

    DUO_URL=http://127.0.0.1:3000 DUO_ADMIN_TOKEN=... DUO_USER_TOKEN=... python gitlab_client_suite.py

Each check is the common operation of one python-gitlab manager; any failure
raises, prints which step failed, and exits non-zero.
"""

import os
import sys
import traceback
import uuid

import gitlab

URL = os.environ["DUO_URL"]
ADMIN = gitlab.Gitlab(URL, private_token=os.environ["DUO_ADMIN_TOKEN"])
USER = gitlab.Gitlab(URL, private_token=os.environ["DUO_USER_TOKEN"])
SUFFIX = uuid.uuid4().hex[:6]
STEPS = []


def step(name):
    def wrap(fn):
        STEPS.append((name, fn))
        return fn

    return wrap


def expect(condition, message):
    if not condition:
        raise AssertionError(message)


@step("users: auth, current user, list, get, create, update, block, unblock")
def users(ctx):
    ADMIN.auth()
    expect(ADMIN.user.username == "root", f"current user is {ADMIN.user.username}")
    USER.auth()
    expect(USER.user.username == "alice", f"current user is {USER.user.username}")
    names = [u.username for u in ADMIN.users.list(get_all=True)]
    expect("alice" in names and "bob" in names, f"users listed: {names}")
    alice = ADMIN.users.get(USER.user.id)
    expect(alice.username == "alice", "users.get")
    found = ADMIN.users.list(username="alice")
    expect([u.id for u in found] == [alice.id], "users.list(username=)")
    created = ADMIN.users.create(
        {"username": f"py{SUFFIX}", "name": "Py Client", "email": f"py{SUFFIX}@example.com", "password": "a-long-password-1"}
    )
    created.name = "Py Client Renamed"
    created.save()
    expect(ADMIN.users.get(created.id).name == "Py Client Renamed", "user update")
    created.block()
    expect(ADMIN.users.get(created.id).state == "blocked", "user block")
    created.unblock()
    expect(ADMIN.users.get(created.id).state == "active", "user unblock")
    ctx["extra_user"] = created


@step("personal access tokens: create for a user, list, get, self, revoke")
def tokens(ctx):
    user = ctx["extra_user"]
    token = user.personal_access_tokens.create({"name": "py-token", "scopes": ["api"], "expires_at": "2099-01-01"})
    expect(token.token.startswith("glpat-"), "token text")
    as_user = gitlab.Gitlab(URL, private_token=token.token)
    as_user.auth()
    expect(as_user.user.username == user.username, "token authenticates")
    listed = [t.id for t in ADMIN.personal_access_tokens.list(user_id=user.id)]
    expect(token.id in listed, f"token listed: {listed}")
    shown = ADMIN.personal_access_tokens.get(token.id)
    expect(shown.name == "py-token", "token get")
    own = as_user.personal_access_tokens.get("self")
    expect(own.id == token.id, "token self")
    as_user.personal_access_tokens.delete("self")
    try:
        as_user.auth()
    except gitlab.exceptions.GitlabAuthenticationError:
        pass
    else:
        raise AssertionError("a revoked token still authenticates")


@step("groups: create, get by path, list, update; members: add, list, update, remove")
def groups(ctx):
    group = ADMIN.groups.create({"name": f"Py Group {SUFFIX}", "path": f"py-group-{SUFFIX}", "visibility": "private"})
    same = ADMIN.groups.get(f"py-group-{SUFFIX}")
    expect(same.id == group.id, "group by path")
    expect(group.id in [g.id for g in ADMIN.groups.list(get_all=True)], "groups.list")
    group.description = "made by python-gitlab"
    group.save()
    expect(ADMIN.groups.get(group.id).description == "made by python-gitlab", "group update")
    alice_id = USER.user.id
    member = group.members.create({"user_id": alice_id, "access_level": gitlab.const.AccessLevel.DEVELOPER})
    expect(member.access_level == 30, "member added")
    expect(alice_id in [m.id for m in group.members.list(get_all=True)], "members listed")
    member.access_level = gitlab.const.AccessLevel.MAINTAINER
    member.save()
    expect(group.members.get(alice_id).access_level == 40, "member updated")
    ctx["group"] = group


@step("projects: create, get by path, list, update; members")
def projects(ctx):
    group = ctx["group"]
    project = ADMIN.projects.create({"name": f"Py Project {SUFFIX}", "path": "py-project", "namespace_id": group.id})
    path = f"py-group-{SUFFIX}/py-project"
    expect(ADMIN.projects.get(path).id == project.id, "project by path")
    expect(project.id in [p.id for p in ADMIN.projects.list(get_all=True)], "projects.list")
    project.description = "described"
    project.save()
    expect(ADMIN.projects.get(project.id).description == "described", "project update")
    bob = ADMIN.users.list(username="bob")[0]
    member = project.members.create({"user_id": bob.id, "access_level": gitlab.const.AccessLevel.REPORTER})
    expect(member.access_level == 20, "project member added")
    expect(bob.id in [m.id for m in project.members.list(get_all=True)], "project members listed")
    project.members.delete(bob.id)
    expect(bob.id not in [m.id for m in project.members.list(get_all=True)], "project member removed")
    ctx["project"] = ADMIN.projects.get(project.id)
    # alice is a maintainer of the group: she sees the project through it.
    ctx["user_project"] = USER.projects.get(path)


@step("issues: create with list labels, list and filter, get, edit, close, reopen; notes")
def issues(ctx):
    project = ctx["user_project"]
    issue = project.issues.create({"title": "From python-gitlab", "description": "body", "labels": ["bug", "py"]})
    expect(sorted(issue.labels) == ["bug", "py"], f"labels {issue.labels}")
    expect(issue.iid in [i.iid for i in project.issues.list(labels=["bug"], get_all=True)], "labels filter")
    expect(issue.iid in [i.iid for i in project.issues.list(state="opened", get_all=True)], "state filter")
    issue = project.issues.get(issue.iid)
    issue.title = "Edited by python-gitlab"
    issue.labels = ["bug", "triaged"]
    issue.save()
    fresh = project.issues.get(issue.iid)
    expect(fresh.title == "Edited by python-gitlab", "issue edited")
    expect(sorted(fresh.labels) == ["bug", "triaged"], f"labels after edit {fresh.labels}")
    fresh.state_event = "close"
    fresh.save()
    closed = project.issues.get(issue.iid)
    expect(closed.state == "closed" and closed.closed_at, "issue closed")
    expect(closed.attributes["closed_by"]["username"] == "alice", "closed_by")
    closed.state_event = "reopen"
    closed.save()
    expect(project.issues.get(issue.iid).state == "opened", "issue reopened")
    note = fresh.notes.create({"body": "a comment from python"})
    expect(note.body == "a comment from python", "note created")
    expect(note.id in [n.id for n in fresh.notes.list(get_all=True)], "notes listed")


@step("merge requests: create, list, get, edit, close, reopen, changes; notes")
def merge_requests(ctx):
    project = ctx["user_project"]
    mr = project.mergerequests.create(
        {"source_branch": "feature", "target_branch": "main", "title": "Py MR", "labels": ["review"]}
    )
    expect(mr.labels == ["review"], f"mr labels {mr.labels}")
    expect(mr.iid in [m.iid for m in project.mergerequests.list(get_all=True)], "mrs listed")
    mr = project.mergerequests.get(mr.iid)
    mr.title = "Py MR, edited"
    mr.save()
    expect(project.mergerequests.get(mr.iid).title == "Py MR, edited", "mr edited")
    mr.state_event = "close"
    mr.save()
    expect(project.mergerequests.get(mr.iid).state == "closed", "mr closed")
    mr.state_event = "reopen"
    mr.save()
    expect(project.mergerequests.get(mr.iid).state == "opened", "mr reopened")
    changes = mr.changes()
    expect("changes" in changes, "mr changes")
    note = mr.notes.create({"body": "looks good"})
    expect(note.id in [n.id for n in mr.notes.list(get_all=True)], "mr notes")


@step("review surfaces: the bot user, reviewers, diff discussions, replies, resolution")
def review_surfaces(ctx):
    project = ctx["user_project"]
    found = USER.users.list(username="GitLabDuo")
    expect([u.username for u in found] == ["GitLabDuo"], "the review bot is listed")
    bot = found[0]
    expect(bot.bot is True, f"bot flag {bot.attributes.get('bot')}")
    expect(USER.user.attributes.get("bot") is False, "people are no bots")
    diff = (
        "diff --git a/app.py b/app.py\n"
        "--- a/app.py\n"
        "+++ b/app.py\n"
        "@@ -1,2 +1,3 @@\n"
        " import os\n"
        "+print(os.environ['SECRET'])\n"
        " main()\n"
    )
    mr = project.mergerequests.create(
        {"source_branch": "review-me", "target_branch": "main", "title": "Py review", "diff": diff}
    )
    mr.reviewer_ids = [bot.id]
    mr.save()
    mr = project.mergerequests.get(mr.iid)
    expect([r["username"] for r in mr.reviewers] == ["GitLabDuo"], f"reviewers {mr.reviewers}")
    # The worker may already be reviewing (or have refused: alice holds no seat here).
    details = [(d.user["username"], d.state) for d in mr.reviewer_details.list(get_all=True)]
    expect(
        len(details) == 1 and details[0][0] == "GitLabDuo" and details[0][1] in ("unreviewed", "review_started", "reviewed"),
        f"reviewer states {details}",
    )
    position = {
        "position_type": "text",
        "base_sha": "a" * 40,
        "start_sha": "b" * 40,
        "head_sha": "c" * 40,
        "old_path": "app.py",
        "new_path": "app.py",
        "new_line": 2,
    }
    thread = mr.discussions.create({"body": "Do not print secrets.", "position": position})
    expect(thread.attributes["notes"][0]["type"] == "DiffNote", "a diff note")
    reply = thread.notes.create({"body": "Removed in the next push."})
    expect(reply.attributes["position"]["new_line"] == 2, "the reply keeps the line")
    thread.resolved = True
    thread.save()
    listed = {d.id: d for d in mr.discussions.list(get_all=True)}
    expect(thread.id in listed, "discussions listed")
    notes = listed[thread.id].attributes["notes"]
    expect(len(notes) == 2 and all(n["resolved"] for n in notes), f"thread resolved {notes}")
    expect(notes[0]["position"]["new_path"] == "app.py", "position read back")
    fetched = mr.discussions.get(thread.id)
    expect(fetched.attributes["notes"][1]["body"] == "Removed in the next push.", "discussion get")
    issue = project.issues.create({"title": "Discuss me"})
    started = issue.discussions.create({"body": "Shall we?"})
    started.notes.create({"body": "We shall."})
    threads = issue.discussions.list(get_all=True)
    expect([len(d.attributes["notes"]) for d in threads] == [2], "issue discussions")


@step("epics: create, list, get, edit, close; notes")
def epics(ctx):
    group = USER.groups.get(ctx["group"].id)
    epic = group.epics.create({"title": "Py epic", "labels": ["roadmap"]})
    expect(epic.iid in [e.iid for e in group.epics.list(get_all=True)], "epics listed")
    epic = group.epics.get(epic.iid)
    epic.title = "Py epic, edited"
    epic.save()
    expect(group.epics.get(epic.iid).title == "Py epic, edited", "epic edited")
    epic.state_event = "close"
    epic.save()
    expect(group.epics.get(epic.iid).state == "closed", "epic closed")
    note = epic.notes.create({"body": "epic comment"})
    expect(note.id in [n.id for n in epic.notes.list(get_all=True)], "epic notes")


@step("pipelines and jobs: list, get, trace")
def pipelines(ctx):
    project = ADMIN.projects.get("acme/platform/api")
    pipelines = project.pipelines.list(get_all=True)
    expect(len(pipelines) >= 1, "pipelines listed")
    pipeline = project.pipelines.get(pipelines[0].id)
    expect(pipeline.id == pipelines[0].id, "pipeline get")
    jobs = project.jobs.list(get_all=True)
    expect(len(jobs) >= 1, "jobs listed")
    job = project.jobs.get(jobs[0].id)
    expect(job.id == jobs[0].id, "job get")
    expect(isinstance(job.trace(), bytes), "job trace")
    expect(len(pipeline.jobs.list(get_all=True)) >= 1, "pipeline jobs")


@step("repository tree: recursive, paginated")
def repository_tree(ctx):
    project = ADMIN.projects.get("acme/platform/api")
    top = project.repository_tree(get_all=True)
    top_paths = {entry["path"] for entry in top}
    expect("README.md" in top_paths and "src" in top_paths, "top level listed")
    expect(not any("/" in path for path in top_paths), "top level only without recursive")
    # python-gitlab sends recursive=True; the whole tree comes back.
    everything = project.repository_tree(recursive=True, get_all=True)
    paths = {entry["path"] for entry in everything}
    expect("src/main.rs" in paths and "config/api.toml" in paths, "nested files listed")
    expect(top_paths <= paths, "the top level is part of the whole tree")
    # Pages of one entry each still add up to the whole tree.
    paged = project.repository_tree(recursive=True, per_page=1, get_all=True)
    expect({entry["path"] for entry in paged} == paths, "pagination covers the tree")
    first_page = project.repository_tree(recursive=True, per_page=2, page=1)
    expect(len(first_page) == 2, "a page holds per_page entries")


def main():
    ctx = {}
    for name, fn in STEPS:
        try:
            fn(ctx)
        except Exception:  # noqa: BLE001 - every failure is reported with its step
            print(f"FAILED: {name}", file=sys.stderr)
            traceback.print_exc()
            return 1
        print(f"ok: {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
