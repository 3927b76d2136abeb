//! The body of `POST /sessions/{session_id}/turns` and the [`TurnRequest`]
//! it asks: checked as far as the body alone can say (`TryFrom`), then
//! against the service's settings ([`admit`]).

use serde::Deserialize;
use utoipa::ToSchema;

use crate::{
    protocols::{Shared, error::ApiError},
    providers::{ChatMessage, Role},
    turn::{TurnRequest, WebMode},
};

/// Largest `top_k`.
const TOP_K_MAX: u32 = 100;
/// Longest `runtime_provider` / `runtime_model`.
const NAME_MAX: usize = 200;
/// Most `history` messages in a request.
const HISTORY_MAX: usize = 1000;

mod repeat;

/// Body of `POST /sessions/{session_id}/turns`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TurnBody {
    /// The user message (required): its text (not blank, without
    /// U+0000), or its parts in order: `{"type": "text", "text"}`,
    /// `{"type": "image", "file_id" | "data" + "media_type" | "url",
    /// "detail"?}`, `{"type": "file", "file_id" | "data" + "media_type" |
    /// "url", "filename"?}` (at most 64 parts, 32 of them images and
    /// files).
    #[schema(required = true, value_type = MessageSchema)]
    message: Option<MessageIn>,
    /// Number of vault facts to retrieve (1-100, default 8).
    #[schema(minimum = 1, maximum = 100, default = 8)]
    #[serde(default, deserialize_with = "whole_number")]
    #[schema(value_type = Option<u32>)]
    top_k: Option<u32>,
    /// `off` (default) or `on`.
    web_mode: Option<WebMode>,
    /// Append citation lists to the answer (default false).
    show_citations: Option<bool>,
    /// Provider to use, by name: one of the configured chain (default: the
    /// chain's order). At most 200 characters, no control characters.
    #[schema(max_length = 200, pattern = r"^[^\u0000-\u001F\u007F-\u009F]*$")]
    runtime_provider: Option<String>,
    /// Model to use (default: the provider's configured model). At most
    /// 200 characters, no control characters.
    #[schema(max_length = 200, pattern = r"^[^\u0000-\u001F\u007F-\u009F]*$")]
    runtime_model: Option<String>,
    /// An extra system message for an active skill (without U+0000).
    #[schema(pattern = r"^[^\u0000]*$")]
    skill_context: Option<String>,
    /// History to use instead of the session's stored messages (at most
    /// 1,000 messages).
    #[schema(max_items = 1000)]
    history: Option<Vec<HistoryMessage>>,
    /// The turn this one continues: a turn of the session (its answer is
    /// the last this turn's history holds: an edit of a later message
    /// goes on from there), or `root` (a new first message). Default: the
    /// session's newest turn. The session's turns form a tree; a turn's
    /// history is its own branch (docs/conversation-trees.md).
    #[schema(
        pattern = r"^(root|[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})$"
    )]
    parent_turn_id: Option<String>,
    /// What to do when the session already has a running turn: `reject`
    /// (409, the default), `enqueue` (wait for it to end, then run) or
    /// `interrupt` (cancel it, then run).
    pub(super) multitask: Option<Multitask>,
    /// Whose memories the turn reads and adds to (1-128 characters of
    /// `[A-Za-z0-9._:-]`); without it, the session's own.
    #[schema(
        min_length = 1,
        max_length = 128,
        pattern = r"^[A-Za-z0-9._:-]{1,128}$"
    )]
    user_id: Option<String>,
    /// Tools the client runs itself, offered to the model for this turn
    /// (as `client__{name}`; at most 32). A call of one pauses the turn
    /// (`tool.requested`) until the client posts its result to `POST
    /// /sessions/{session_id}/turns/{turn_id}/tool-results/{call_id}`.
    #[schema(max_items = 32)]
    client_tools: Option<Vec<ClientToolBody>>,
    /// The JSON the final answer must be: `{name?, schema?, strict?}`, a
    /// JSON Schema (at most 64 KB, 10 `$ref`s; none: any JSON object).
    /// The result's `output` is the parsed answer; an answer that never
    /// fits ends the turn with `stop_reason: "output_invalid"`.
    output_schema: Option<OutputSchemaBody>,
}

impl OutputSchemaBody {
    fn checked(self) -> Result<crate::turn::OutputFormat, ApiError> {
        crate::turn::OutputFormat::checked(self.name, self.schema, self.strict).map_err(|detail| {
            ApiError::InvalidField {
                field: "output_schema".into(),
                detail,
            }
        })
    }
}

/// An output schema, as the native body gives it.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OutputSchemaBody {
    #[schema(pattern = "^[A-Za-z0-9_-]{1,64}$")]
    name: Option<String>,
    #[schema(value_type = Option<Object>)]
    schema: Option<serde_json::Value>,
    #[serde(default)]
    strict: bool,
}

/// A message: its text, or its parts.
#[derive(Debug)]
pub enum MessageIn {
    Text(String),
    Parts(Vec<PartIn>),
}

impl<'de> Deserialize<'de> for MessageIn {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = MessageIn;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string, or an array of parts")
            }
            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<MessageIn, E> {
                Ok(MessageIn::Text(text.to_owned()))
            }
            fn visit_string<E: serde::de::Error>(self, text: String) -> Result<MessageIn, E> {
                Ok(MessageIn::Text(text))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<MessageIn, A::Error> {
                let mut parts = Vec::new();
                while let Some(part) = seq.next_element::<PartIn>()? {
                    if parts.len() == crate::turn::PARTS_MAX {
                        return Err(serde::de::Error::custom(format!(
                            "a message has at most {} parts",
                            crate::turn::PARTS_MAX
                        )));
                    }
                    parts.push(part);
                }
                Ok(MessageIn::Parts(parts))
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

/// A count given as a JSON number that is whole: `21` or `21.0` (JSON
/// Schema's `integer` is both), in `u32`.
fn whole_number<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<u32>, D::Error> {
    let Some(number) = Option::<serde_json::Number>::deserialize(deserializer)? else {
        return Ok(None);
    };
    let whole = number.as_u64().or_else(|| {
        number
            .as_f64()
            .filter(|n| n.fract() == 0.0 && *n >= 0.0 && *n <= f64::from(u32::MAX))
            .map(|n| n as u64)
    });
    whole
        .and_then(|n| u32::try_from(n).ok())
        .map(Some)
        .ok_or_else(|| serde::de::Error::custom(format!("expected a whole number, not {number}")))
}

/// What the document says a message is.
pub enum MessageSchema {}

impl utoipa::PartialSchema for MessageSchema {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, OneOfBuilder, Type};
        let text = ObjectBuilder::new()
            .schema_type(Type::String)
            .min_length(Some(1))
            .pattern(Some(r"^[^\u0000]*[^\s\u0000][^\u0000]*$"));
        let parts = ArrayBuilder::new()
            .items(<PartIn as utoipa::PartialSchema>::schema())
            .min_items(Some(1))
            .max_items(Some(crate::turn::PARTS_MAX));
        OneOfBuilder::new().item(text).item(parts).into()
    }
}

impl ToSchema for MessageSchema {
    fn name() -> std::borrow::Cow<'static, str> {
        std::borrow::Cow::Borrowed("TurnMessage")
    }

    fn schemas(
        schemas: &mut Vec<(
            String,
            utoipa::openapi::RefOr<utoipa::openapi::schema::Schema>,
        )>,
    ) {
        <PartIn as ToSchema>::schemas(schemas);
    }
}

/// A part of a message.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "lowercase", deny_unknown_fields)]
pub enum PartIn {
    /// Text (without U+0000).
    Text { text: String },
    /// An image (PNG, JPEG, WebP, GIF): one of `file_id`, `data` (base64,
    /// with `media_type`) or `url` (`https`, or a `data:` URL).
    Image {
        #[schema(max_length = 64)]
        file_id: Option<String>,
        data: Option<String>,
        media_type: Option<String>,
        url: Option<String>,
        /// `low`, `high` or `auto`.
        detail: Option<String>,
    },
    /// A file (a PDF, a text file, an image): as an image's, with its
    /// `filename`.
    File {
        #[schema(max_length = 64)]
        file_id: Option<String>,
        data: Option<String>,
        media_type: Option<String>,
        url: Option<String>,
        filename: Option<String>,
    },
}

/// A message's parts joined: its text and its attachments.
fn joined(parts: Vec<PartIn>) -> Result<crate::turn::Joined, ApiError> {
    use crate::protocols::parts::source;
    use crate::turn::AskedKind;
    let mut joined = crate::turn::Joined::default();
    for (i, part) in parts.into_iter().enumerate() {
        let field = format!("message[{i}]");
        match part {
            PartIn::Text { text } => joined.text(&text),
            PartIn::Image {
                file_id,
                data,
                media_type,
                url,
                detail,
            } => {
                let source = source(&field, file_id, data.map(|d| (d, media_type)), url)?;
                joined.attach(&field, AskedKind::Image, source, None, detail);
            }
            PartIn::File {
                file_id,
                data,
                media_type,
                url,
                filename,
            } => {
                let source = source(&field, file_id, data.map(|d| (d, media_type)), url)?;
                joined.attach(&field, AskedKind::File, source, filename, None);
            }
        }
    }
    Ok(joined)
}

/// A tool the client runs itself.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClientToolBody {
    /// 1-56 letters, digits, `_` or `-`.
    #[schema(pattern = r"^[A-Za-z0-9_-]{1,56}$")]
    name: String,
    /// What it does, for the model (1-2,000 characters).
    #[schema(min_length = 1, max_length = 2000)]
    description: String,
    /// JSON schema of its arguments (an object schema; default: any
    /// object).
    #[schema(value_type = Option<Object>)]
    parameters: Option<serde_json::Value>,
    /// What it does to the world, as the service's gates see it (default
    /// `LOCAL_WRITE`).
    effect: Option<crate::tools::EffectClass>,
}

pub use crate::protocols::multitask::Multitask;

/// One history message of a request.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HistoryMessage {
    role: HistoryRole,
    /// Without U+0000.
    #[schema(pattern = r"^[^\u0000]*$")]
    content: String,
}

#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum HistoryRole {
    System,
    User,
    Assistant,
}

/// The request a body asks, checked as far as the body alone can say.
/// What depends on the service's settings (the provider's name, system
/// messages from clients) is [`admit`]ted after.
impl TryFrom<TurnBody> for TurnRequest {
    type Error = ApiError;

    fn try_from(mut body: TurnBody) -> Result<Self, ApiError> {
        let (message, attachments) = match body.message.take() {
            None => (None, Vec::new()),
            Some(MessageIn::Text(text)) => (Some(text), Vec::new()),
            Some(MessageIn::Parts(parts)) => {
                let joined = joined(parts)?;
                (Some(joined.text), joined.attachments)
            }
        };
        let (message, attachments) = checked_content(message, attachments)?;
        let follows = match body.parent_turn_id.take() {
            None => None,
            Some(parent) if parent == "root" => Some(uuid::Uuid::nil()),
            Some(parent) => Some(
                uuid::Uuid::parse_str(&parent)
                    .ok()
                    .filter(|id| !id.is_nil())
                    .ok_or_else(|| ApiError::InvalidField {
                        field: "parent_turn_id".into(),
                        detail: "`parent_turn_id` must be a turn id or `root`".into(),
                    })?,
            ),
        };
        if follows.is_some() && body.history.is_some() {
            return Err(ApiError::InvalidField {
                field: "parent_turn_id".into(),
                detail: "`history` replaces the session's stored history: give \
                         `parent_turn_id` or `history`, not both"
                    .into(),
            });
        }
        Ok(TurnRequest {
            message,
            attachments,
            follows,
            ..body.options()?
        })
    }
}

impl TurnBody {
    /// The turn's options, all but its message (and where it goes on).
    pub(super) fn options(self) -> Result<TurnRequest, ApiError> {
        let body = self;
        if let Some(skill) = &body.skill_context {
            no_nul("skill_context", skill)?;
        }
        for item in body.history.iter().flatten() {
            no_nul("history", &item.content)?;
        }
        let top_k = body.top_k.unwrap_or(crate::turn::DEFAULT_TOP_K);
        if !(1..=TOP_K_MAX).contains(&top_k) {
            return Err(ApiError::InvalidField {
                field: "top_k".into(),
                detail: format!("`top_k` must be between 1 and {TOP_K_MAX}"),
            });
        }
        let name = |field: &str, value: Option<String>| -> Result<Option<String>, ApiError> {
            match value {
                Some(v) if v.trim().is_empty() => Ok(None),
                Some(v) if v.len() > NAME_MAX => Err(ApiError::InvalidField {
                    field: field.into(),
                    detail: format!("`{field}` is longer than {NAME_MAX} characters"),
                }),
                // The name goes into the prompt's trusted runtime metadata:
                // a line break there would let a request write its own lines.
                Some(v) if v.chars().any(char::is_control) => Err(ApiError::InvalidField {
                    field: field.into(),
                    detail: format!("`{field}` contains a control character"),
                }),
                other => Ok(other),
            }
        };
        let runtime_provider = name("runtime_provider", body.runtime_provider)?;
        let history = match body.history {
            Some(items) if items.len() > HISTORY_MAX => {
                return Err(ApiError::InvalidField {
                    field: "history".into(),
                    detail: format!("`history` has more than {HISTORY_MAX} messages"),
                });
            }
            Some(items) => Some(
                items
                    .into_iter()
                    .map(|m| {
                        let role = match m.role {
                            HistoryRole::System => Role::System,
                            HistoryRole::User => Role::User,
                            HistoryRole::Assistant => Role::Assistant,
                        };
                        ChatMessage::new(role, m.content)
                    })
                    .collect(),
            ),
            None => None,
        };
        let client_tools = checked_client_tools(body.client_tools.unwrap_or_default())?;
        let user_id = checked_user_id(body.user_id)?;
        Ok(TurnRequest {
            user_id,
            top_k,
            web_mode: body.web_mode.unwrap_or_default(),
            show_citations: body.show_citations.unwrap_or(false),
            runtime_provider,
            runtime_model: name("runtime_model", body.runtime_model)?,
            skill_context: body.skill_context.filter(|s| !s.is_empty()),
            history,
            client_tools,
            output: body
                .output_schema
                .map(OutputSchemaBody::checked)
                .transpose()?,
            ..TurnRequest::new(String::new())
        })
    }
}

/// U+0000 is valid JSON but no chat text needs it, and Postgres text
/// cannot hold it: refused the same way on both backends.
fn no_nul(field: &str, text: &str) -> Result<(), ApiError> {
    if text.contains('\0') {
        return Err(ApiError::InvalidField {
            field: field.into(),
            detail: format!("`{field}` contains U+0000, which is not accepted"),
        });
    }
    Ok(())
}

/// A turn's user message, as every protocol takes it: there, not blank,
/// without U+0000.
pub fn checked_message(message: Option<String>) -> Result<String, ApiError> {
    let message = message
        .filter(|m| !m.trim().is_empty())
        .ok_or(ApiError::MessageRequired)?;
    no_nul("message", &message)?;
    Ok(message)
}

/// A turn's message with its images and files, as every protocol takes
/// it: text without U+0000, not blank unless the message carries an
/// image or a file; at most 32 of those.
pub fn checked_content(
    message: Option<String>,
    attachments: Vec<crate::turn::Asked>,
) -> Result<(String, Vec<crate::turn::Asked>), ApiError> {
    if attachments.is_empty() {
        return Ok((checked_message(message)?, attachments));
    }
    if attachments.len() > crate::turn::ATTACHMENTS_MAX {
        return Err(ApiError::InvalidField {
            field: "message".into(),
            detail: format!(
                "a message carries at most {} images and files",
                crate::turn::ATTACHMENTS_MAX
            ),
        });
    }
    let message = message.unwrap_or_default();
    no_nul("message", &message)?;
    Ok((message, attachments))
}

/// Whose memories a turn reads: an id of the session id's alphabet.
pub fn checked_user_id(user_id: Option<String>) -> Result<Option<String>, ApiError> {
    let Some(user) = user_id else {
        return Ok(None);
    };
    let id = crate::ids::SessionId::parse(&user).map_err(|e| ApiError::InvalidField {
        field: "user_id".into(),
        detail: format!("`user_id` is not valid: {e}"),
    })?;
    Ok(Some(id.as_str().to_owned()))
}

/// The tools a client declares for a turn: at most 32, each checked and
/// named once.
pub fn checked_client_tools(
    declared: Vec<ClientToolBody>,
) -> Result<Vec<crate::turn::ClientTool>, ApiError> {
    if declared.len() > crate::turn::CLIENT_TOOLS_MAX {
        return Err(ApiError::InvalidField {
            field: "client_tools".into(),
            detail: "`client_tools` has more than 32 tools".into(),
        });
    }
    let mut client_tools: Vec<crate::turn::ClientTool> = Vec::new();
    for (i, t) in declared.into_iter().enumerate() {
        let tool = crate::turn::ClientTool::checked(t.name, t.description, t.parameters, t.effect)
            .map_err(|detail| ApiError::InvalidField {
                field: format!("client_tools[{i}]"),
                detail,
            })?;
        if client_tools.iter().any(|other| other.name == tool.name) {
            return Err(ApiError::InvalidField {
                field: format!("client_tools[{i}]"),
                detail: format!("two client tools are named {:?}", tool.name),
            });
        }
        client_tools.push(tool);
    }
    Ok(client_tools)
}

/// Whether this service takes `request`: its provider is one of the
/// chain's, and it brings system messages only where the operator allows
/// them (see [`crate::protocols::endpoint::refuse_client_system`]).
pub(super) fn admit(request: &TurnRequest, app: &Shared) -> Result<(), ApiError> {
    if let Some(provider) = &request.runtime_provider
        && !app.provider_names.iter().any(|p| p == provider)
    {
        return Err(ApiError::InvalidField {
            field: "runtime_provider".into(),
            detail: format!(
                "unknown provider {provider:?}; configured: {}",
                app.provider_names.join(", ")
            ),
        });
    }
    if request
        .history
        .iter()
        .flatten()
        .any(|m| m.role == Role::System)
    {
        crate::protocols::endpoint::refuse_client_system(
            app.settings.harness.allow_client_system_messages,
        )?;
    }
    Ok(())
}
