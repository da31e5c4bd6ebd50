//! `gitlab_documentation` end to end: the real gateway searches the bundled
//! documentation, its `chat/documentation_search` prompt has the fake model
//! write the answer, and a failing prompt still leaves the passages.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail loudly on setup errors"
)]

use fake_provider::Failure;
use monolith::agent::tools::gitlab_documentation::SUMMARY_UNAVAILABLE;

use crate::agent_support::{Answered, Bench};

const QUESTION: &str = "What does error M3003 mean?";

async fn ask_the_documentation(bench: &Bench, then: impl FnOnce(&Bench)) -> Answered {
    let world = bench.world().await;
    bench.fake.push_text(
        " This is about GitLab itself.\nAction: gitlab_documentation\nAction Input: error code M3003",
    );
    then(bench);
    let answered = bench.ask(world.user, QUESTION, None).await;
    assert_eq!(answered.answer.error, None, "{:?}", answered.answer);
    answered
}

/// The `source_url` of each source in the answer's extras.
fn source_urls(answered: &Answered) -> Vec<String> {
    let sources = answered.answer.extras["sources"].as_array().unwrap();
    assert!(!sources.is_empty(), "{:?}", answered.answer.extras);
    sources
        .iter()
        .filter_map(|s| s["source_url"].as_str().map(str::to_owned))
        .collect()
}

#[tokio::test]
async fn the_answer_is_the_models_written_from_the_passages_and_their_links() {
    let bench = Bench::start().await;
    let written =
        "MODEL_WRITTEN: M3003 means not found. See [the docs](https://docs.example/m3003).";

    let answered = ask_the_documentation(&bench, |bench| bench.fake.push_text(written)).await;

    assert_eq!(answered.answer.content, written);
    assert_eq!(answered.chunks.concat().trim_end(), written);
    let urls = source_urls(&answered);
    assert!(!urls.is_empty(), "{:?}", answered.answer.extras);
    let bodies = bench.provider_bodies();
    assert_eq!(bodies.len(), 2);
    let prompt = &bodies[1];
    // The prompt has the user's question, every passage's link and title.
    assert!(prompt.contains(QUESTION), "{prompt}");
    for url in &urls {
        assert!(prompt.contains(url.as_str()), "{url}: {prompt}");
    }
    for source in answered.answer.extras["sources"].as_array().unwrap() {
        let title = source["title"].as_str().unwrap();
        assert!(prompt.contains(title), "{title}: {prompt}");
    }
    assert!(prompt.contains("<document>"), "{prompt}");
}

#[tokio::test]
async fn a_failing_prompt_leaves_the_passages_and_says_the_summary_is_unavailable() {
    let bench = Bench::start().await;

    let answered = ask_the_documentation(&bench, |bench| {
        bench.fake.push_failure(Failure::Status {
            status: 400,
            kind: "invalid_request_error".into(),
            message: "the model refused".into(),
        });
    })
    .await;

    let content = &answered.answer.content;
    assert!(content.starts_with(SUMMARY_UNAVAILABLE), "{content}");
    for url in source_urls(&answered) {
        assert!(content.contains(&format!("]({url})")), "{url}: {content}");
    }
    assert_eq!(answered.chunks.concat().trim_end(), content.as_str());
}
