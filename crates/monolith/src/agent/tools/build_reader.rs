//! `build_reader`: reads one CI job, named by a link of this instance
//! (`<project path>/-/jobs/<id>`) or the job the user is looking at.

use async_trait::async_trait;
use contracts::{DuoErrorCode, UnitPrimitive};

use super::{Tool, ToolEnv, ToolInput, ToolOutcome};
use crate::policy::Subject;
use crate::work_items::{AiReadError, read_for_ai};

pub struct BuildReader;

/// The job id of a job link of this instance found in `text`.
pub fn job_id_in(text: &str, base: &url::Url) -> Option<i64> {
    text.split_whitespace().find_map(|raw| {
        let token =
            raw.trim_matches(|c: char| matches!(c, ',' | '.' | '?' | '!' | ')' | '(' | '"' | '\''));
        let path = crate::agent::instance_links::path_below(token, base)?;
        let (_, rest) = path.split_once("/-/jobs/")?;
        rest.trim_end_matches('/').parse().ok().filter(|id| *id > 0)
    })
}

#[async_trait]
impl Tool for BuildReader {
    fn name(&self) -> &'static str {
        "build_reader"
    }

    fn unit_primitive(&self) -> UnitPrimitive {
        UnitPrimitive::AskBuild
    }

    async fn execute(&self, env: &ToolEnv<'_>, input: &ToolInput) -> ToolOutcome {
        let id = job_id_in(&input.input, &env.services.external_url).or(match env.ctx.resource {
            Some(Subject::Build(id)) => Some(id),
            _ => None,
        });
        let Some(id) = id else {
            return AiReadError::Refused(DuoErrorCode::M3003).into();
        };
        let db = match env.services.pool.get().await {
            Ok(db) => db,
            Err(e) => return AiReadError::failed(e).into(),
        };
        match read_for_ai(
            &env.services.policy,
            &*db,
            env.ctx.actor,
            Subject::Build(id),
            &env.services.external_url,
        )
        .await
        {
            Ok(context) => ToolOutcome::Observation(format!(
                "Please use this information about the identified CI job: {}",
                context.content
            )),
            Err(e) => e.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_links_of_this_instance_only() {
        let base = url::Url::parse("http://gitlab.test/").unwrap();
        assert_eq!(
            job_id_in("why did http://gitlab.test/g/p/-/jobs/42 fail?", &base),
            Some(42)
        );
        assert_eq!(job_id_in("http://evil.test/g/p/-/jobs/42", &base), None);
        assert_eq!(job_id_in("job 42", &base), None);
    }
}
