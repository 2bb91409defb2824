//! The A2A 1.0 shapes both directions speak: the JSON forms (ProtoJSON,
//! camelCase fields, `TASK_STATE_*` and `ROLE_*` enum names) of the
//! messages in the specification's `a2a.proto`, and the JSON-RPC 2.0
//! envelope around them. Only the fields this crate reads or writes are
//! typed; a field it does not know is ignored on the way in.

// The server side (`serve::a2a`, with `config`) uses the rest.
#![cfg_attr(not(feature = "config"), allow(dead_code))]

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The protocol version both sides send and accept (`A2A-Version`).
pub(crate) const VERSION: &str = "1.0";
/// The header that carries it.
pub(crate) const VERSION_HEADER: &str = "A2A-Version";
/// Where an agent publishes its card, under its base URL.
pub(crate) const CARD_PATH: &str = ".well-known/agent-card.json";
/// The binding names an interface declares.
pub(crate) const JSONRPC: &str = "JSONRPC";
pub(crate) const HTTP_JSON: &str = "HTTP+JSON";

/// The JSON-RPC methods of the 1.0 binding this crate uses or serves.
pub(crate) mod method {
    pub(crate) const SEND_MESSAGE: &str = "SendMessage";
    pub(crate) const SEND_STREAMING_MESSAGE: &str = "SendStreamingMessage";
    pub(crate) const GET_TASK: &str = "GetTask";
    pub(crate) const LIST_TASKS: &str = "ListTasks";
    pub(crate) const CANCEL_TASK: &str = "CancelTask";
    pub(crate) const SUBSCRIBE_TO_TASK: &str = "SubscribeToTask";
}

/// JSON-RPC error codes: the standard ones and A2A's own.
pub(crate) mod code {
    pub(crate) const PARSE_ERROR: i64 = -32700;
    pub(crate) const INVALID_REQUEST: i64 = -32600;
    pub(crate) const METHOD_NOT_FOUND: i64 = -32601;
    pub(crate) const INVALID_PARAMS: i64 = -32602;
    pub(crate) const INTERNAL: i64 = -32603;
    pub(crate) const TASK_NOT_FOUND: i64 = -32001;
    pub(crate) const TASK_NOT_CANCELABLE: i64 = -32002;
    pub(crate) const UNSUPPORTED_OPERATION: i64 = -32004;
    pub(crate) const VERSION_NOT_SUPPORTED: i64 = -32009;
}

/// `TaskState`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum TaskState {
    #[serde(rename = "TASK_STATE_SUBMITTED")]
    Submitted,
    #[serde(rename = "TASK_STATE_WORKING")]
    Working,
    #[serde(rename = "TASK_STATE_COMPLETED")]
    Completed,
    #[serde(rename = "TASK_STATE_FAILED")]
    Failed,
    #[serde(rename = "TASK_STATE_CANCELED")]
    Canceled,
    #[serde(rename = "TASK_STATE_INPUT_REQUIRED")]
    InputRequired,
    #[serde(rename = "TASK_STATE_REJECTED")]
    Rejected,
    #[serde(rename = "TASK_STATE_AUTH_REQUIRED")]
    AuthRequired,
    /// `TASK_STATE_UNSPECIFIED`, or a name this version does not know.
    #[serde(rename = "TASK_STATE_UNSPECIFIED", other)]
    Unspecified,
}

impl TaskState {
    /// Completed, failed, canceled or rejected: nothing follows.
    pub(crate) fn is_terminal(self) -> bool {
        matches!(self, TaskState::Completed | TaskState::Failed | TaskState::Canceled | TaskState::Rejected)
    }

    /// The task waits for its client (input or authentication).
    pub(crate) fn is_interrupted(self) -> bool {
        matches!(self, TaskState::InputRequired | TaskState::AuthRequired)
    }
}

/// `Role`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Role {
    #[serde(rename = "ROLE_USER")]
    User,
    #[serde(rename = "ROLE_AGENT")]
    Agent,
    #[serde(rename = "ROLE_UNSPECIFIED", other)]
    Unspecified,
}

/// `Part`: one of `text`, `raw` (base64), `url` or `data`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Part {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) text: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) raw: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) data: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) media_type: Option<String>,
}

impl Part {
    pub(crate) fn text(text: impl Into<String>) -> Part {
        Part { text: Some(text.into()), ..Part::default() }
    }

    pub(crate) fn data(data: Value) -> Part {
        Part { data: Some(data), media_type: Some("application/json".to_owned()), ..Part::default() }
    }

    /// The bytes its payload holds (text, raw, url, data as JSON): what
    /// the size bounds of both sides count.
    pub(crate) fn bytes(&self) -> usize {
        let text = self.text.as_ref().map_or(0, String::len);
        let raw = self.raw.as_ref().map_or(0, String::len);
        let url = self.url.as_ref().map_or(0, String::len);
        let data = self.data.as_ref().map_or(0, |data| data.to_string().len());
        text + raw + url + data
    }
}

/// The bytes the payloads of `parts` hold ([`Part::bytes`]).
pub(crate) fn parts_bytes(parts: &[Part]) -> usize {
    parts.iter().map(Part::bytes).sum()
}

impl Message {
    /// The bytes its parts and metadata hold.
    pub(crate) fn bytes(&self) -> usize {
        parts_bytes(&self.parts) + self.metadata.as_ref().map_or(0, |metadata| metadata.to_string().len())
    }
}

impl Task {
    /// The bytes its history, artifacts and status message hold.
    pub(crate) fn bytes(&self) -> usize {
        let history: usize = self.history.iter().map(Message::bytes).sum();
        let artifacts: usize = self.artifacts.iter().map(|artifact| parts_bytes(&artifact.parts)).sum();
        history + artifacts + self.status.message.as_ref().map_or(0, Message::bytes)
    }
}

/// `Message`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Message {
    pub(crate) message_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) context_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) task_id: Option<String>,
    pub(crate) role: Role,
    #[serde(default)]
    pub(crate) parts: Vec<Part>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) metadata: Option<Value>,
}

/// `TaskStatus`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct TaskStatus {
    pub(crate) state: TaskState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) message: Option<Message>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) timestamp: Option<String>,
}

/// `Artifact`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Artifact {
    pub(crate) artifact_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) name: Option<String>,
    #[serde(default)]
    pub(crate) parts: Vec<Part>,
}

/// `Task`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Task {
    pub(crate) id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) context_id: Option<String>,
    pub(crate) status: TaskStatus,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) artifacts: Vec<Artifact>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) history: Vec<Message>,
}

/// `TaskStatusUpdateEvent`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct TaskStatusUpdateEvent {
    pub(crate) task_id: String,
    #[serde(default)]
    pub(crate) context_id: String,
    pub(crate) status: TaskStatus,
}

/// `TaskArtifactUpdateEvent`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct TaskArtifactUpdateEvent {
    pub(crate) task_id: String,
    #[serde(default)]
    pub(crate) context_id: String,
    pub(crate) artifact: Artifact,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) append: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) last_chunk: bool,
}

/// `StreamResponse` (and, with only `task` or `message`, `SendMessageResponse`):
/// exactly one field is set.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct StreamResponse {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) task: Option<Task>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) message: Option<Message>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) status_update: Option<TaskStatusUpdateEvent>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) artifact_update: Option<TaskArtifactUpdateEvent>,
}

/// `AgentInterface`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct AgentInterface {
    pub(crate) url: String,
    pub(crate) protocol_binding: String,
    #[serde(default)]
    pub(crate) protocol_version: String,
}

/// `AgentCapabilities`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct AgentCapabilities {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) streaming: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) push_notifications: Option<bool>,
}

/// `AgentSkill`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct AgentSkill {
    pub(crate) id: String,
    pub(crate) name: String,
    #[serde(default)]
    pub(crate) description: String,
    #[serde(default)]
    pub(crate) tags: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) output_modes: Vec<String>,
}

/// `AgentCard`: what this crate reads of one, and writes of its own.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct AgentCard {
    pub(crate) name: String,
    #[serde(default)]
    pub(crate) description: String,
    #[serde(default)]
    pub(crate) supported_interfaces: Vec<AgentInterface>,
    #[serde(default)]
    pub(crate) version: String,
    #[serde(default)]
    pub(crate) capabilities: AgentCapabilities,
    #[serde(default)]
    pub(crate) default_input_modes: Vec<String>,
    #[serde(default)]
    pub(crate) default_output_modes: Vec<String>,
    #[serde(default)]
    pub(crate) skills: Vec<AgentSkill>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) security_schemes: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) security_requirements: Option<Value>,
}

impl AgentCard {
    /// The first interface of `binding` and a 1.x version the card lists.
    pub(crate) fn interface(&self, binding: &str) -> Option<&AgentInterface> {
        self.supported_interfaces.iter().find(|interface| {
            let version = interface.protocol_version.as_str();
            interface.protocol_binding.eq_ignore_ascii_case(binding)
                && (version.is_empty() || version == "1" || version.starts_with("1."))
        })
    }

    /// Whether it may answer with JSON (a data part): its default output
    /// modes, or a skill's, say `application/json`, or say nothing.
    pub(crate) fn answers_json(&self) -> bool {
        let json = |modes: &[String]| modes.iter().any(|mode| mode == "application/json" || mode == "*/*");
        self.default_output_modes.is_empty()
            || json(&self.default_output_modes)
            || self.skills.iter().any(|skill| json(&skill.output_modes))
    }

    pub(crate) fn streams(&self) -> bool {
        self.capabilities.streaming == Some(true)
    }
}

/// A JSON-RPC 2.0 request.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Request {
    pub(crate) jsonrpc: String,
    #[serde(default)]
    pub(crate) id: Value,
    pub(crate) method: String,
    #[serde(default)]
    pub(crate) params: Value,
}

/// A JSON-RPC 2.0 error object.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct RpcError {
    pub(crate) code: i64,
    pub(crate) message: String,
}

/// A JSON-RPC 2.0 response: `result` or `error`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Response {
    pub(crate) jsonrpc: String,
    #[serde(default)]
    pub(crate) id: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) result: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<RpcError>,
}

impl Response {
    pub(crate) fn result(id: Value, result: Value) -> Response {
        Response { jsonrpc: "2.0".to_owned(), id, result: Some(result), error: None }
    }

    pub(crate) fn error(id: Value, code: i64, message: impl Into<String>) -> Response {
        Response {
            jsonrpc: "2.0".to_owned(),
            id,
            result: None,
            error: Some(RpcError { code, message: message.into() }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn stream_responses_read_the_specifications_json_forms() {
        let status: StreamResponse = serde_json::from_value(json!({"statusUpdate": {
            "taskId": "t1", "contextId": "c1",
            "status": {"state": "TASK_STATE_WORKING", "message": {"messageId": "m", "role": "ROLE_AGENT", "parts": [{"text": "on it"}]}}
        }}))
        .unwrap();
        let update = status.status_update.unwrap();
        assert_eq!(update.status.state, TaskState::Working);
        assert_eq!(update.status.message.unwrap().parts[0].text.as_deref(), Some("on it"));
        let artifact: StreamResponse = serde_json::from_value(json!({"artifactUpdate": {
            "taskId": "t1", "contextId": "c1", "append": true, "lastChunk": true,
            "artifact": {"artifactId": "a", "parts": [{"data": {"n": 1}}]}
        }}))
        .unwrap();
        let update = artifact.artifact_update.unwrap();
        assert!(update.append && update.last_chunk);
        assert_eq!(update.artifact.parts[0].data, Some(json!({"n": 1})));
        let unknown: TaskStatus = serde_json::from_value(json!({"state": "TASK_STATE_NEW_IN_2_0"})).unwrap();
        assert_eq!(unknown.state, TaskState::Unspecified);
    }
}
