//! A `tools/call` result as the text a model reads: `structuredContent` as
//! its JSON when the server sent one (servers repeat it as text for older
//! clients, so the text blocks are then left out), otherwise each block in
//! order — text as it is, images, audio and embedded resources as a line
//! naming what they were and how large, resource links by their address.
//! Whatever it is, at most the cap in bytes reaches the model.

use rmcp::model::CallToolResult;
use serde_json::Value;

use crate::agent::ToolOutput;

/// The model's view of `result`, cut to `cap` bytes.
pub(super) fn render(result: &CallToolResult, cap: usize) -> ToolOutput {
    let text = match &result.structured_content {
        Some(structured) => structured.to_string(),
        None => {
            let blocks: Vec<String> = result
                .content
                .iter()
                .map(|block| serde_json::to_value(block).map_or_else(|_| "[unreadable content]".to_owned(), describe))
                .collect();
            blocks.join("\n")
        }
    };
    let text = capped(text, cap);
    if result.is_error == Some(true) {
        ToolOutput::error(text)
    } else {
        ToolOutput::ok(text)
    }
}

/// One content block, as the protocol spells it.
fn describe(block: Value) -> String {
    let field = |name: &str| block.get(name).and_then(Value::as_str).unwrap_or("");
    match field("type") {
        "text" => field("text").to_owned(),
        kind @ ("image" | "audio") => {
            format!("[{kind} {}, {} bytes]", or_unknown(field("mimeType")), decoded_len(field("data")))
        }
        "resource" => {
            let resource = &block["resource"];
            let uri = resource.get("uri").and_then(Value::as_str).unwrap_or("");
            let mime = resource.get("mimeType").and_then(Value::as_str).unwrap_or("");
            let size =
                match (resource.get("text").and_then(Value::as_str), resource.get("blob").and_then(Value::as_str)) {
                    (Some(text), _) => text.len(),
                    (None, Some(blob)) => decoded_len(blob),
                    (None, None) => 0,
                };
            format!("[resource {uri} ({}), {size} bytes]", or_unknown(mime))
        }
        "resource_link" => format!("[resource link {}]", field("uri")),
        other => format!("[{} content]", or_unknown(other)),
    }
}

fn or_unknown(text: &str) -> &str {
    if text.is_empty() {
        "unknown type"
    } else {
        text
    }
}

/// The bytes base64 `data` decodes to.
fn decoded_len(data: &str) -> usize {
    let padding = data.bytes().rev().take_while(|&b| b == b'=').count();
    (data.len() / 4 * 3).saturating_sub(padding)
}

/// `text` cut at a character boundary to at most `cap` bytes, saying so.
fn capped(mut text: String, cap: usize) -> String {
    if text.len() <= cap {
        return text;
    }
    let total = text.len();
    let cut = crate::seam::cut(&text, cap).len();
    text.truncate(cut);
    text.push_str(&format!("\n[result cut: {cut} of {total} bytes shown]"));
    text
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn result(value: Value) -> CallToolResult {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn structured_content_wins_over_its_text_copy() {
        let output = render(
            &result(json!({"content": [{"type": "text", "text": "{\"n\":1}"}], "structuredContent": {"n": 1}})),
            1024,
        );
        assert_eq!(output, ToolOutput::ok("{\"n\":1}"));
    }

    #[test]
    fn images_and_resources_are_summarised_with_their_size() {
        let output = render(
            &result(json!({"content": [
                {"type": "text", "text": "look"},
                {"type": "image", "data": "aGVsbG8=", "mimeType": "image/png"},
                {"type": "resource", "resource": {"uri": "file:///a", "text": "abc"}},
                {"type": "resource_link", "uri": "file:///b", "name": "b"}
            ], "isError": true})),
            1024,
        );
        assert!(output.is_error);
        assert_eq!(
            output.content,
            "look\n[image image/png, 5 bytes]\n[resource file:///a (unknown type), 3 bytes]\n[resource link file:///b]"
        );
    }

    #[test]
    fn a_long_result_is_cut_at_a_character_boundary() {
        let text = capped("é".repeat(10), 5);
        assert!(text.starts_with("éé\n[result cut: 4 of 20 bytes shown]"), "{text}");
    }
}
