//! What a message carries besides its text (its images and files, by
//! their files), and the JSON an answer must be.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::ChatMessage;

/// An image or a document a user's message carries: its file, where it
/// stands among the message's text, and its bytes once loaded. A record
/// of the message keeps the file's id and type, never the bytes: they
/// are loaded from the file for each call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attachment {
    pub file_id: String,
    /// `image/png`, `image/jpeg`, `image/webp`, `image/gif` or
    /// `application/pdf` (text files reach the model as text).
    pub media_type: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub filename: String,
    /// OpenAI's `detail` of an image: `low`, `high` or `auto`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// It stands after this many bytes of the message's text.
    pub at: usize,
    /// The `https` URL it came from, sent instead of its bytes where the
    /// provider takes a URL (`HARNESS_FILE_URLS=pass`; OpenAI-compatible
    /// providers' images).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(skip)]
    pub data: Option<Arc<[u8]>>,
}

impl Attachment {
    pub fn is_image(&self) -> bool {
        self.media_type.starts_with("image/")
    }

    /// Its bytes as base64, for a request's body (an error of the
    /// serializer when they were not loaded: never sent without them).
    pub fn base64<E: serde::ser::Error>(&self) -> Result<Base64<'_>, E> {
        match &self.data {
            Some(data) => Ok(Base64(data)),
            None => Err(E::custom(format!(
                "the bytes of {} were not loaded",
                self.file_id
            ))),
        }
    }
}

/// Bytes written as base64 where a serializer takes text, without
/// building the text first.
pub struct Base64<'a>(pub &'a [u8]);

impl std::fmt::Display for Base64<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use base64::display::Base64Display;
        write!(
            f,
            "{}",
            Base64Display::new(self.0, &base64::engine::general_purpose::STANDARD)
        )
    }
}

/// A piece of a message in order: its text between attachments, or one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Piece<'a> {
    Text(&'a str),
    Attachment(&'a Attachment),
}

/// The JSON a final answer must be: any JSON object (`schema` none), or
/// an instance of `schema` (a JSON Schema, checked at the edge).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct OutputFormat {
    /// What the schema is called (`[A-Za-z0-9_-]`, 1-64), as providers
    /// take it.
    pub name: String,
    /// The JSON Schema; none: any JSON object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub schema: Option<serde_json::Value>,
    /// Ask the provider to hold the model to the schema exactly (OpenAI's
    /// `strict`); the service checks the answer either way.
    #[serde(default)]
    pub strict: bool,
}

/// Bytes an output schema has at most.
pub const OUTPUT_SCHEMA_MAX_BYTES: usize = 64 * 1024;

/// `$ref`s an output schema has at most.
pub const OUTPUT_SCHEMA_MAX_REFS: usize = 10;

impl OutputFormat {
    /// The format, checked: its name, its size, its `$ref`s, and that
    /// its schema is a JSON Schema (the reason when it is not).
    pub fn checked(
        name: Option<String>,
        schema: Option<serde_json::Value>,
        strict: bool,
    ) -> Result<Self, String> {
        let name = name.unwrap_or_else(|| "output".to_owned());
        let named = (1..=64).contains(&name.len())
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !named {
            return Err("an output schema's `name` is 1-64 letters, digits, `_` or `-`".into());
        }
        if let Some(schema) = &schema {
            let text = schema.to_string();
            if text.len() > OUTPUT_SCHEMA_MAX_BYTES {
                return Err(format!(
                    "an output schema has at most {OUTPUT_SCHEMA_MAX_BYTES} bytes"
                ));
            }
            if text.matches("\"$ref\"").count() > OUTPUT_SCHEMA_MAX_REFS {
                return Err(format!(
                    "an output schema has at most {OUTPUT_SCHEMA_MAX_REFS} `$ref`s"
                ));
            }
            if value_has_nul(schema) {
                return Err("an output schema contains U+0000".into());
            }
            if !schema.is_object() {
                return Err("an output schema is a JSON Schema object".into());
            }
        }
        Ok(Self {
            name,
            schema,
            strict,
        })
    }
}

/// Whether a JSON value holds U+0000 in a string or a key, at any depth.
pub fn value_has_nul(value: &serde_json::Value) -> bool {
    // Iterative: a schema's depth is the client's to choose.
    let mut stack = vec![value];
    while let Some(value) = stack.pop() {
        match value {
            serde_json::Value::String(s) if s.contains('\0') => return true,
            serde_json::Value::Array(items) => stack.extend(items),
            serde_json::Value::Object(map) => {
                if map.keys().any(|k| k.contains('\0')) {
                    return true;
                }
                stack.extend(map.values());
            }
            _ => {}
        }
    }
    false
}

impl ChatMessage {
    /// Its text and attachments in order (empty texts left out).
    pub fn pieces(&self) -> Vec<Piece<'_>> {
        let mut pieces = Vec::with_capacity(self.attachments.len() * 2 + 1);
        let mut from = 0;
        for attachment in &self.attachments {
            let mut at = attachment.at.clamp(from, self.content.len());
            while !self.content.is_char_boundary(at) {
                at += 1;
            }
            if at > from {
                pieces.push(Piece::Text(&self.content[from..at]));
            }
            pieces.push(Piece::Attachment(attachment));
            from = at;
        }
        if from < self.content.len() {
            pieces.push(Piece::Text(&self.content[from..]));
        }
        pieces
    }
}
