//! The monolith's chat tool box and the gateway's tool catalogue name the
//! same tools, each with the same unit primitive. A tool the gateway offers
//! that the monolith cannot run ends answers with A9999; one the monolith
//! runs under another unit primitive would be offered to seats that may not
//! use it (or refused with M3005 to seats that may); one the gateway never
//! offers is dead.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;

use contracts::UnitPrimitive;
use gateway::chat::tools_registry::DuoChatToolsRegistry;
use monolith::agent::tools::ToolBox;

#[test]
fn the_tool_box_runs_exactly_the_tools_the_gateway_offers() {
    let catalogue: BTreeMap<&str, UnitPrimitive> = DuoChatToolsRegistry
        .all()
        .iter()
        .map(|tool| (tool.name, tool.unit_primitive))
        .collect();
    let tool_box = ToolBox::standard();
    let names = tool_box.names();
    let runs: BTreeMap<&str, UnitPrimitive> = names
        .iter()
        .map(|name| (*name, tool_box.find(name).unwrap().unit_primitive()))
        .collect();
    assert_eq!(
        runs.len(),
        names.len(),
        "a tool twice in the tool box: {names:?}"
    );
    assert_eq!(
        catalogue.len(),
        DuoChatToolsRegistry.all().len(),
        "a tool twice in the gateway's catalogue"
    );
    assert_eq!(
        runs, catalogue,
        "the monolith's ToolBox::standard() (left) and the gateway's TOOLS (right) differ"
    );
}
