//! The demo projects' code: a short history per repository, by different
//! people, with a feature branch behind the demo merge request, so a newcomer
//! can clone, browse and ask about real code. Written through the same commit
//! plumbing as the API; a repository that already has commits is left alone.

use crate::repositories::pushes::RefUpdate;
use crate::repositories::writer::{self, CommitRequest, FileAction, Signature};
use crate::repositories::{Repositories, RepositoryError};

struct Person {
    name: &'static str,
    email: &'static str,
}

const ALICE: Person = Person {
    name: "Alice Owner",
    email: "alice@example.com",
};
const BOB: Person = Person {
    name: "Bob Developer",
    email: "bob@example.com",
};
const ROOT: Person = Person {
    name: "Administrator",
    email: "root@example.com",
};

/// One commit of the demo history.
struct Step {
    branch: &'static str,
    start: Option<&'static str>,
    who: &'static Person,
    /// Days after 2026-09-01.
    day: i64,
    message: &'static str,
    files: &'static [(&'static str, &'static str)],
}

const DAY0: i64 = 1_788_220_800; // 2026-09-01T00:00:00Z

/// `acme/platform/api`: a small Rust service with the session bug of issue #1
/// and its fix on `fix-session-refresh` (merge request !1).
const API: &[Step] = &[
    Step {
        branch: "main",
        start: None,
        who: &ALICE,
        day: 0,
        message: "Start the API service\n\nAn HTTP service with sign-in, sessions and a rate limit.",
        files: &[
            (
                "README.md",
                "# API\n\nThe Acme platform API: sign-in, sessions and account data.\n\n## Running\n\n```sh\ncargo run -- --config config/api.toml\n```\n",
            ),
            (
                "Cargo.toml",
                "[package]\nname = \"acme-api\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[dependencies]\nserde = { version = \"1\", features = [\"derive\"] }\ntoml = \"0.8\"\n",
            ),
            (
                "config/api.toml",
                "# Service settings\nlisten = \"0.0.0.0:8080\"\n\n[sessions]\n# Sessions older than this are expired.\nmax_age_days = 30\n\n[rate_limit]\n# Requests per client address per minute.\nrequests_per_minute = 120\nburst = 20\n",
            ),
            (
                "src/main.rs",
                "mod config;\nmod rate_limit;\nmod session;\n\nfn main() {\n    let config = config::load(\"config/api.toml\").expect(\"config\");\n    println!(\"listening on {}\", config.listen);\n}\n",
            ),
            (
                "src/config.rs",
                "use serde::Deserialize;\n\n/// Settings read from `config/api.toml`.\n#[derive(Debug, Deserialize)]\npub struct Config {\n    pub listen: String,\n    pub sessions: Sessions,\n    pub rate_limit: RateLimit,\n}\n\n#[derive(Debug, Deserialize)]\npub struct Sessions {\n    pub max_age_days: u32,\n}\n\n#[derive(Debug, Deserialize)]\npub struct RateLimit {\n    pub requests_per_minute: u32,\n    pub burst: u32,\n}\n\npub fn load(path: &str) -> Result<Config, String> {\n    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;\n    toml::from_str(&text).map_err(|e| e.to_string())\n}\n",
            ),
            (
                "src/rate_limit.rs",
                "/// A token bucket per client address: `requests_per_minute` refill, `burst`\n/// at most. A client over the limit gets 429 Too Many Requests.\npub struct Bucket {\n    tokens: f64,\n    capacity: f64,\n    refill_per_sec: f64,\n}\n\nimpl Bucket {\n    pub fn new(requests_per_minute: u32, burst: u32) -> Self {\n        Bucket {\n            tokens: burst as f64,\n            capacity: burst as f64,\n            refill_per_sec: requests_per_minute as f64 / 60.0,\n        }\n    }\n\n    /// Takes one token after `elapsed` seconds; false means answer 429.\n    pub fn take(&mut self, elapsed: f64) -> bool {\n        self.tokens = (self.tokens + elapsed * self.refill_per_sec).min(self.capacity);\n        if self.tokens >= 1.0 {\n            self.tokens -= 1.0;\n            true\n        } else {\n            false\n        }\n    }\n}\n",
            ),
        ],
    },
    Step {
        branch: "main",
        start: None,
        who: &BOB,
        day: 3,
        message: "Add sessions with an expiry\n\nA session older than max_age_days is refused at sign-in.",
        files: &[(
            "src/session.rs",
            "/// Why a session cannot be used.\n#[derive(Debug, PartialEq)]\npub enum SessionError {\n    Expired,\n    Unknown,\n}\n\npub struct Session {\n    pub user_id: u64,\n    pub age_days: u32,\n}\n\nimpl Session {\n    pub fn expired(&self, max_age_days: u32) -> bool {\n        self.age_days > max_age_days\n    }\n}\n\n/// Signs a user in with an existing session.\npub fn login(session: &Session, max_age_days: u32) -> Result<u64, SessionError> {\n    if session.expired(max_age_days) {\n        return Err(SessionError::Expired);\n    }\n    Ok(session.user_id)\n}\n",
        )],
    },
    Step {
        branch: "main",
        start: None,
        who: &ALICE,
        day: 5,
        message: "Document the rate limit",
        files: &[(
            "docs/rate-limits.md",
            "# Rate limits\n\nEach client address may make `requests_per_minute` requests per minute\n(default 120), with bursts of up to `burst` (default 20). Over the limit the\nAPI answers 429 Too Many Requests with a `Retry-After` header.\n\nChange the numbers in `config/api.toml` under `[rate_limit]`.\n",
        )],
    },
    Step {
        branch: "fix-session-refresh",
        start: Some("main"),
        who: &BOB,
        day: 8,
        message: "Refresh expired sessions instead of failing\n\nFixes #1: a session past its age is renewed at sign-in rather than\nanswered with a 500.",
        files: &[(
            "src/session.rs",
            "/// Why a session cannot be used.\n#[derive(Debug, PartialEq)]\npub enum SessionError {\n    Expired,\n    Unknown,\n}\n\npub struct Session {\n    pub user_id: u64,\n    pub age_days: u32,\n}\n\nimpl Session {\n    pub fn expired(&self, max_age_days: u32) -> bool {\n        self.age_days > max_age_days\n    }\n\n    /// A fresh session for the same user.\n    pub fn refresh(&self) -> Session {\n        Session { user_id: self.user_id, age_days: 0 }\n    }\n}\n\n/// Signs a user in with an existing session, renewing it when it expired.\npub fn login(session: &Session, max_age_days: u32) -> Result<u64, SessionError> {\n    if session.expired(max_age_days) {\n        return Ok(session.refresh().user_id);\n    }\n    Ok(session.user_id)\n}\n",
        )],
    },
];

/// `acme/website`: the public site, with the pricing page of issue #1.
const WEBSITE: &[Step] = &[
    Step {
        branch: "main",
        start: None,
        who: &ALICE,
        day: 1,
        message: "Publish the website",
        files: &[
            (
                "index.html",
                "<!doctype html>\n<html lang=\"en\">\n<head><meta charset=\"utf-8\"><title>Acme</title><link rel=\"stylesheet\" href=\"style.css\"></head>\n<body>\n<h1>Acme</h1>\n<p>Tools for teams that ship.</p>\n<a href=\"pricing.html\">Pricing</a>\n</body>\n</html>\n",
            ),
            (
                "pricing.html",
                "<!doctype html>\n<html lang=\"en\">\n<head><meta charset=\"utf-8\"><title>Pricing</title></head>\n<body>\n<h1>Pricing</h1>\n<table>\n<tr><th>Plan</th><th>Price</th></tr>\n<tr><td>Starter</td><td>$10 per user</td></tr>\n<tr><td>Team</td><td>$25 per user</td></tr>\n</table>\n</body>\n</html>\n",
            ),
            (
                "style.css",
                "body { font-family: sans-serif; margin: 2rem auto; max-width: 40rem; }\nh1 { color: #6b4fbb; }\n",
            ),
        ],
    },
    Step {
        branch: "main",
        start: None,
        who: &BOB,
        day: 4,
        message: "Add a contact form script\n\nValidates the email address before the form is sent.",
        files: &[(
            "contact.js",
            "// Checks the contact form before it is sent.\nfunction validEmail(text) {\n  return /^[^@\\s]+@[^@\\s]+\\.[^@\\s]+$/.test(text);\n}\n\ndocument.querySelector('#contact')?.addEventListener('submit', (event) => {\n  const email = event.target.email.value;\n  if (!validEmail(email)) {\n    event.preventDefault();\n    alert('Please enter a valid email address.');\n  }\n});\n",
        )],
    },
];

/// `hobby/notes`: a tiny Python notes app.
const NOTES: &[Step] = &[Step {
    branch: "main",
    start: None,
    who: &ROOT,
    day: 2,
    message: "A notes app in one file",
    files: &[
        ("README.md", "# Notes\n\nKeep short notes in a JSON file.\n"),
        (
            "notes.py",
            "\"\"\"Keep short notes in a JSON file.\"\"\"\nimport json\nimport sys\nfrom pathlib import Path\n\nSTORE = Path.home() / \".notes.json\"\n\n\ndef load():\n    if STORE.exists():\n        return json.loads(STORE.read_text())\n    return []\n\n\ndef add(text):\n    notes = load()\n    notes.append(text)\n    STORE.write_text(json.dumps(notes, indent=2))\n\n\nif __name__ == \"__main__\":\n    add(\" \".join(sys.argv[1:]))\n",
        ),
    ],
}];

/// The demo history of each seeded project, by its id; the ref updates made,
/// per project, to be recorded like pushes.
pub async fn seed(
    repositories: &Repositories,
    api: i64,
    website: i64,
    notes: i64,
) -> Result<Vec<(i64, RefUpdate)>, RepositoryError> {
    let mut updates = Vec::new();
    for (project, steps) in [(api, API), (website, WEBSITE), (notes, NOTES)] {
        if !repositories.looks_empty(project) {
            continue;
        }
        let path = repositories.ensure(project, "main").await?;
        for step in steps {
            let request = CommitRequest {
                branch: step.branch.to_owned(),
                start: step.start.map(str::to_owned),
                message: step.message.to_owned(),
                author: Signature {
                    name: step.who.name.to_owned(),
                    email: step.who.email.to_owned(),
                    when: Some((DAY0 + step.day * 86_400 + 9 * 3600, 120)),
                },
                actions: step
                    .files
                    .iter()
                    .map(|(file, content)| FileAction::Upsert {
                        path: (*file).to_owned(),
                        content: content.as_bytes().to_vec(),
                    })
                    .collect(),
            };
            let committed = writer::commit(&path, &request).await?;
            updates.push((project, committed.update));
        }
    }
    Ok(updates)
}
