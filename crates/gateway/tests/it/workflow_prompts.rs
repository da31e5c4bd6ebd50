//! The workflow prompts render for both families with the inputs the engine
//! passes, and name no input it does not pass.

use gateway::Config;
use gateway::prompts::{PromptRegistry, TemplateRole};
use serde_json::json;

#[test]
fn every_workflow_prompt_renders_for_both_families() {
    let config = Config::for_tests(&[]).unwrap();
    let registry = PromptRegistry::load(&config.prompts.dir).unwrap();
    let ids: Vec<&str> = registry
        .prompt_ids()
        .filter(|id| id.starts_with("workflow/") && !id.starts_with("workflow/small_model/"))
        .collect();
    assert_eq!(ids.len(), 4, "{ids:?}");
    let inputs = json!({
        "goal": "Add a greeting",
        "agent": "chat",
        "project_id": 7,
        "tool_names": ["read_file", "edit_file"],
        "additional_context": "",
        "context": "README.md has one line",
        "plan": ["Edit README.md", "Run the tests"],
    });
    for id in ids {
        for family in ["base", "openai"] {
            let prompt = registry.resolve(id, family, None).unwrap();
            let messages = prompt.render(&registry, &inputs).unwrap();
            let content = |role: TemplateRole| {
                &messages
                    .iter()
                    .find(|m| m.role == role)
                    .unwrap_or_else(|| panic!("{id}/{family}: no {role:?} message"))
                    .content
            };
            let (system, user) = (content(TemplateRole::System), content(TemplateRole::User));
            assert!(user.contains("Add a greeting"), "{id}/{family}: {user}");
            assert!(
                !system.contains("{{") && !user.contains("{{"),
                "{id}/{family}"
            );
            if id.ends_with("executor") {
                assert!(
                    user.contains("1. Edit README.md\n2. Run the tests"),
                    "{user}"
                );
            }
        }
    }
}
