//! Content blocks: the unit of prompts and outputs.

use serde::{Deserialize, Serialize};

/// One block of content in a prompt or an answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum ContentBlock {
    /// Plain text.
    Text {
        /// The text itself.
        text: String,
    },
    /// An image, base64-encoded.
    Image {
        /// MIME type such as `image/png`.
        mime_type: String,
        /// Base64 data.
        data: String,
    },
}

impl ContentBlock {
    /// A text block.
    pub fn text(text: impl Into<String>) -> Self {
        ContentBlock::Text { text: text.into() }
    }

    /// The text of a text block.
    pub fn as_text(&self) -> Option<&str> {
        match self {
            ContentBlock::Text { text } => Some(text),
            _ => None,
        }
    }
}

/// The concatenated text of every text block.
///
/// ```
/// use subagents::seam::text_of;
/// use subagents::ContentBlock;
///
/// assert_eq!(text_of(&[ContentBlock::text("six times "), ContentBlock::text("seven")]), "six times seven");
/// ```
pub fn text_of(blocks: &[ContentBlock]) -> String {
    blocks.iter().filter_map(ContentBlock::as_text).collect()
}
