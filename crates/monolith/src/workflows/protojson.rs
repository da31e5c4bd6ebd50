//! protojson, as GitLab's WebSocket clients speak it: each text frame of the
//! executor socket is one `ClientEvent` (up) or `Action` (down) in protobuf's
//! canonical JSON mapping (lowerCamelCase names, oneof members by name, 64-bit
//! integers as strings). The translation is driven by the descriptors of
//! `proto/duo_workflow.proto`, compiled at build time, so it follows the
//! proto file exactly; unknown fields are ignored, as newer clients send them.

use std::sync::LazyLock;

use contracts::duo_workflow::{Action, ClientEvent, ListToolsResponse, Message};
use prost_reflect::{DescriptorPool, DeserializeOptions, DynamicMessage, MessageDescriptor};

const DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/duo_workflow_descriptor.bin"));

static POOL: LazyLock<Result<DescriptorPool, String>> =
    LazyLock::new(|| DescriptorPool::decode(DESCRIPTOR_SET).map_err(|e| e.to_string()));

/// Why a frame could not be translated.
#[derive(Debug, thiserror::Error)]
pub enum ProtoJsonError {
    /// The text is not a protojson message of the expected type.
    #[error("{0}")]
    Invalid(String),
    /// The built-in descriptors are unusable (a build problem).
    #[error("protobuf descriptors unavailable: {0}")]
    Descriptors(String),
}

fn descriptor(name: &str) -> Result<MessageDescriptor, ProtoJsonError> {
    let pool = POOL
        .as_ref()
        .map_err(|e| ProtoJsonError::Descriptors(e.clone()))?;
    pool.get_message_by_name(name)
        .ok_or_else(|| ProtoJsonError::Descriptors(format!("no message {name}")))
}

fn from_json<M: Message + Default>(name: &str, text: &str) -> Result<M, ProtoJsonError> {
    let desc = descriptor(name)?;
    let mut de = serde_json::Deserializer::from_str(text);
    let dynamic = DynamicMessage::deserialize_with_options(
        desc,
        &mut de,
        &DeserializeOptions::new().deny_unknown_fields(false),
    )
    .map_err(|e| ProtoJsonError::Invalid(e.to_string()))?;
    de.end()
        .map_err(|e| ProtoJsonError::Invalid(e.to_string()))?;
    M::decode(dynamic.encode_to_vec().as_slice())
        .map_err(|e| ProtoJsonError::Invalid(e.to_string()))
}

fn to_json<M: Message>(name: &str, message: &M) -> Result<String, ProtoJsonError> {
    let desc = descriptor(name)?;
    let dynamic = DynamicMessage::decode(desc, message.encode_to_vec().as_slice())
        .map_err(|e| ProtoJsonError::Invalid(e.to_string()))?;
    serde_json::to_string(&dynamic).map_err(|e| ProtoJsonError::Invalid(e.to_string()))
}

/// One `ClientEvent` from a protojson text frame.
pub fn client_event_from_json(text: &str) -> Result<ClientEvent, ProtoJsonError> {
    from_json("ClientEvent", text)
}

/// One `Action` as a protojson text frame.
pub fn action_to_json(action: &Action) -> Result<String, ProtoJsonError> {
    to_json("Action", action)
}

/// The `tools` of a `ListTools` answer as plain JSON.
pub fn list_tools_to_json(
    response: &ListToolsResponse,
) -> Result<serde_json::Value, ProtoJsonError> {
    let text = to_json("ListToolsResponse", response)?;
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| ProtoJsonError::Invalid(e.to_string()))?;
    Ok(value
        .get("tools")
        .cloned()
        .unwrap_or_else(|| serde_json::json!([])))
}

/// One `Action` from protojson (tests and tools playing the service).
pub fn action_from_json(text: &str) -> Result<Action, ProtoJsonError> {
    from_json("Action", text)
}

/// One `ClientEvent` as protojson (tests and tools playing the client).
pub fn client_event_to_json(event: &ClientEvent) -> Result<String, ProtoJsonError> {
    to_json("ClientEvent", event)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_requests_parse_with_gitlabs_names() {
        let event = client_event_from_json(
            r#"{"startRequest":{"workflowID":"7","goal":"fix it","clientCapabilities":["shell_command"],"somethingNew":1}}"#,
        )
        .unwrap();
        let back = client_event_to_json(&event).unwrap();
        assert!(back.contains(r#""workflowID":"7""#), "{back}");
        assert!(back.contains(r#""goal":"fix it""#), "{back}");
        assert!(client_event_from_json("not json").is_err());
        assert!(client_event_from_json(r#"{"startRequest":{"goal":5}}"#).is_err());
    }

    #[test]
    fn actions_render_as_protojson() {
        let action = action_from_json(
            r#"{"requestID":"r1","runHTTPRequest":{"method":"GET","path":"/api/v4/x"}}"#,
        )
        .unwrap();
        let text = action_to_json(&action).unwrap();
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&text).unwrap(),
            serde_json::json!({"requestID":"r1","runHTTPRequest":{"method":"GET","path":"/api/v4/x"}})
        );
    }
}
