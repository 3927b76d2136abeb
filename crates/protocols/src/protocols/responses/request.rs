//! What `POST /v1/responses` reads, and the turn it asks for.

mod input;

use input::input_message;
use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;
use utoipa::ToSchema;
use uuid::Uuid;

use crate::{
    protocols::Shared,
    protocols::responses::{
        fold::APPROVAL_PREFIX,
        wire::{FunctionTool, InputItem, ShownPart},
    },
    protocols::{
        approvals::ClientDecision,
        client_calls::{ClientAnswer, Replies},
        error::ApiError,
        parts::{ToolDeclaration, declared_tools},
    },
    providers::{ChatMessage, Role, ThinkLevel},
    service::MessageRecord,
    turn::{ClientTool, TurnRequest},
};

/// Labels a response may carry, as OpenAI bounds them.
const METADATA_MAX: usize = 16;
const METADATA_KEY_MAX: usize = 64;
const METADATA_VALUE_MAX: usize = 512;

/// A Responses request (the fields the service reads; the others, such as
/// `temperature`, `top_p`, `truncation` or `include`, are accepted and
/// ignored).
#[derive(Debug, Deserialize, ToSchema)]
pub struct CreateResponse {
    /// A model the service is configured with (the chain's, `HARNESS_MODEL`,
    /// or one of `[providers.models]`) runs the turn; any other name (or
    /// none) runs the configured chain.
    model: Option<String>,
    /// The user's message: a string, or message items (`role`, `content`
    /// as a string or `input_text` parts), the user's new one last.
    #[schema(schema_with = crate::protocols::schemas::text_or_items)]
    input: Value,
    /// Instructions for this response: added to the prompt as the
    /// client's (untrusted) context, beneath the operator's system prompt.
    instructions: Option<String>,
    /// Continue that response's conversation (its session); not with
    /// `conversation`.
    #[schema(pattern = "^resp_[0-9a-f]{32}(_[0-9]+)?$")]
    pub(super) previous_response_id: Option<String>,
    /// The conversation (a session id, or `{"id": …}`) to add to.
    #[schema(schema_with = crate::protocols::schemas::conversation)]
    conversation: Option<Value>,
    #[serde(default)]
    pub(super) stream: bool,
    /// Answer at once (`in_progress`); read it later with
    /// `GET /v1/responses/{id}`.
    #[serde(default)]
    pub(super) background: bool,
    /// Every response is stored (the turn's log is what it is made of).
    #[serde(default)]
    #[expect(dead_code, reason = "accepted; every response is stored")]
    store: Option<bool>,
    /// Up to 16 labels (keys up to 64 characters, values up to 512).
    metadata: Option<BTreeMap<String, String>>,
    /// The longest answer the model may write in one step.
    #[schema(minimum = 1)]
    max_output_tokens: Option<u32>,
    /// Tools the client runs itself: `function` tools (`name`,
    /// `description`, `parameters`), at most 32. A call of one ends the
    /// response with a `function_call` item; the next request answers it
    /// with a `function_call_output` input item and `previous_response_id`,
    /// and its response goes on with the same turn. Other tool types are
    /// refused (`unsupported_parameter`): the service's own tools run
    /// without being named.
    #[schema(value_type = Option<Vec<Object>>)]
    tools: Option<Vec<Value>>,
    /// `reasoning.effort`: `none`/`minimal`, `low`, `medium`, `high`
    /// (`xhigh` reads as `high`): the model's think level for this turn.
    reasoning: Option<Reasoning>,
    /// The user whose memories the turn reads and keeps
    /// (`[A-Za-z0-9._:-]`, 1-128).
    user: Option<String>,
    /// `text.format`: `json_schema` (`name`, `schema`, `strict`) or
    /// `json_object` makes the answer JSON, checked (and repaired) by the
    /// service; an answer that never fits ends `incomplete`
    /// (`output_invalid`).
    text: Option<TextIn>,
}

/// A request's `text` options.
#[derive(Debug, Deserialize, ToSchema)]
pub struct TextIn {
    format: Option<crate::protocols::parts::ResponseFormatIn>,
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct Reasoning {
    effort: Option<String>,
}

fn invalid(field: &str, detail: impl Into<String>) -> ApiError {
    ApiError::InvalidField {
        field: field.into(),
        detail: detail.into(),
    }
}

/// The name `reasoning.effort` shows for a think level.
pub fn effort_name(level: ThinkLevel) -> String {
    match level {
        ThinkLevel::Off => "none",
        ThinkLevel::Low => "low",
        ThinkLevel::Medium => "medium",
        ThinkLevel::High => "high",
    }
    .to_owned()
}

/// An input item as read: the fields of every kind this service takes
/// (`message`, `function_call_output`, `mcp_approval_response`); which
/// apply depends on `type`.
#[derive(Debug, Deserialize)]
struct ItemIn {
    #[serde(rename = "type")]
    kind: Option<String>,
    role: Option<String>,
    content: Option<Content>,
    call_id: Option<String>,
    output: Option<Content>,
    approval_request_id: Option<String>,
    approve: Option<bool>,
    reason: Option<String>,
}

/// A message's `content` (or a call's `output`): text, or parts.
#[derive(Debug, Deserialize)]
#[serde(untagged, expecting = "a string or text parts")]
enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

/// A content part: text, `input_image` (`image_url`: an `https` or
/// `data:` URL, or `file_id`; `detail`) or `input_file` (`file_id`,
/// `file_data`, `file_url`; `filename`).
#[derive(Debug, Deserialize)]
struct ContentPart {
    #[serde(rename = "type")]
    kind: Option<String>,
    text: Option<String>,
    image_url: Option<String>,
    file_id: Option<String>,
    detail: Option<String>,
    file_data: Option<String>,
    file_url: Option<String>,
    filename: Option<String>,
}

/// A `function` tool as read.
#[derive(Debug, Deserialize)]
struct ToolIn {
    #[serde(rename = "type")]
    kind: Option<String>,
    #[serde(default)]
    name: String,
    #[serde(default)]
    description: String,
    #[serde(default)]
    parameters: Value,
}

/// `given`, read as the `T` at `field`; a failure names the field within.
fn read<'a, T: Deserialize<'a>>(field: &str, given: &'a Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(given).map_err(|e| {
        let within = e.path().to_string();
        let field = match within.as_str() {
            "." => field.to_owned(),
            within => format!("{field}.{within}"),
        };
        let detail = format!("`{field}`: {}", e.into_inner());
        invalid(&field, detail)
    })
}

/// Input item `at`, read.
fn item(at: usize, given: &Value) -> Result<ItemIn, ApiError> {
    read(&format!("input[{at}]"), given)
}

impl CreateResponse {
    /// The session `conversation` names, if it names one.
    pub fn conversation_id(&self) -> Result<Option<&str>, ApiError> {
        match &self.conversation {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(id)) => Ok(Some(id)),
            Some(Value::Object(fields)) => match fields.get("id") {
                Some(Value::String(id)) => Ok(Some(id)),
                _ => Err(invalid(
                    "conversation",
                    "`conversation.id` must be a string",
                )),
            },
            Some(_) => Err(invalid(
                "conversation",
                "`conversation` must be an id or `{\"id\": …}`",
            )),
        }
    }

    /// The model and provider `model` names, when the service is
    /// configured with it; any other name but `agent-harness` (the
    /// service's default) is kept, for the runner to refuse
    /// (`model_not_allowed`).
    fn configured(&self, app: &Shared) -> Option<(Option<String>, String)> {
        let model = self
            .model
            .as_deref()
            .map(str::trim)
            .filter(|m| !m.is_empty() && *m != "agent-harness")?;
        let providers = &app.settings.providers;
        if let Some(chain) = &providers.chain {
            if let Some(entry) = chain.0.iter().find(|entry| entry.model == model) {
                return Some((Some(entry.kind.name().to_owned()), model.to_owned()));
            }
        } else if providers.model == model {
            return Some((None, model.to_owned()));
        }
        Some((None, model.to_owned()))
    }

    /// The turn this request asks for (its session is the caller's
    /// business: see `previous_response_id` and `conversation`).
    #[expect(
        clippy::too_many_lines,
        reason = "the request's fields mapped in order, a few lines each"
    )]
    pub fn turn_request(&self, app: &Shared) -> Result<TurnRequest, ApiError> {
        let client_tools = self.client_tools()?;
        let messages: Vec<(String, crate::turn::Joined)> = match &self.input {
            Value::String(text) => {
                let mut joined = crate::turn::Joined::default();
                joined.text(text);
                vec![("user".to_owned(), joined)]
            }
            Value::Array(items) => items
                .iter()
                .enumerate()
                .map(|(at, given)| input_message(&item(at, given)?, at))
                .collect::<Result<_, _>>()?,
            _ => {
                return Err(invalid(
                    "input",
                    "`input` must be a string or message items",
                ));
            }
        };
        let continues = self.previous_response_id.is_some() || self.conversation.is_some();
        if continues && messages.len() > 1 {
            return Err(invalid(
                "input",
                "a response that continues a conversation takes one user message: the \
                 conversation is the rest",
            ));
        }
        let roles = ["system", "developer", "user", "assistant"];
        if let Some((role, _)) = messages.iter().find(|(r, _)| !roles.contains(&r.as_str())) {
            return Err(invalid("input", format!("unknown role {role:?}")));
        }
        // The last message's images and files go to the model; an earlier
        // message's are named in its text.
        let last = messages.len().checked_sub(1);
        let mut attachments = Vec::new();
        let mut pairs: Vec<(&str, String)> = Vec::with_capacity(messages.len());
        for (i, (role, joined)) in messages.into_iter().enumerate() {
            let mut text = joined.text;
            if Some(i) == last {
                attachments = joined.attachments;
            } else if !joined.attachments.is_empty() {
                text.push_str("\n[the user attached files to this message]");
            }
            let role = roles
                .iter()
                .find(|r| **r == role)
                .copied()
                .unwrap_or("user");
            pairs.push((role, text));
        }
        let mut asked = crate::protocols::endpoint::conversation_turn(
            &pairs,
            attachments,
            app.settings.harness.allow_client_system_messages,
        )
        .map_err(|e| match e {
            ApiError::InvalidField { detail, .. } => invalid("input", detail),
            other => other,
        })?;
        if continues {
            asked.history = None;
        }
        if let Some(instructions) = &self.instructions {
            if instructions.contains('\0') {
                return Err(invalid("instructions", "`instructions` contains U+0000"));
            }
            asked.skill_context = Some(instructions.clone()).filter(|s| !s.trim().is_empty());
        }
        if let Some(format) = self.text.as_ref().and_then(|t| t.format.clone()) {
            asked.output = format.output("text.format")?;
        }
        if let Some((provider, model)) = self.configured(app) {
            asked.runtime_provider = provider;
            asked.runtime_model = Some(model);
        }
        let metadata = self.metadata.clone().unwrap_or_default();
        if metadata.len() > METADATA_MAX
            || metadata.iter().any(|(k, v)| {
                k.chars().count() > METADATA_KEY_MAX
                    || v.chars().count() > METADATA_VALUE_MAX
                    || k.contains('\0')
                    || v.contains('\0')
            })
        {
            return Err(invalid(
                "metadata",
                "`metadata` takes up to 16 keys of up to 64 characters, values up to 512",
            ));
        }
        asked.metadata = metadata;
        if self.max_output_tokens == Some(0) {
            return Err(invalid(
                "max_output_tokens",
                "`max_output_tokens` must be at least 1",
            ));
        }
        asked.max_output_tokens = self.max_output_tokens;
        asked.client_tools = client_tools;
        asked.background = self.background;
        asked.think_level = match self.reasoning.as_ref().and_then(|r| r.effort.as_deref()) {
            None => None,
            Some("none" | "minimal") => Some(ThinkLevel::Off),
            Some("low") => Some(ThinkLevel::Low),
            Some("medium") => Some(ThinkLevel::Medium),
            Some("high" | "xhigh") => Some(ThinkLevel::High),
            Some(other) => {
                return Err(invalid(
                    "reasoning.effort",
                    format!("unknown effort {other:?} (none, minimal, low, medium, high, xhigh)"),
                ));
            }
        };
        if let Some(user) = &self.user {
            let user = crate::ids::SessionId::parse(user)
                .map_err(|e| invalid("user", format!("`user` is not valid: {e}")))?;
            asked.user_id = Some(user.as_str().to_owned());
        }
        Ok(asked)
    }
}

impl CreateResponse {
    /// The `function` tools of the request, as tools the client runs.
    fn client_tools(&self) -> Result<Vec<ClientTool>, ApiError> {
        let tools = self
            .tools
            .iter()
            .flatten()
            .enumerate()
            .map(|(at, tool)| {
                let tool: ToolIn = read(&format!("tools[{at}]"), tool)?;
                if tool.kind.as_deref() != Some("function") {
                    return Err(ApiError::Unsupported {
                        field: format!("tools[{at}]"),
                        detail: format!(
                            "tools of type {:?} are not taken: `function` tools are the \
                             client's, and the service's own tools run without being named",
                            tool.kind.unwrap_or_default()
                        ),
                    });
                }
                Ok(ToolDeclaration {
                    name: tool.name,
                    description: tool.description,
                    parameters: Some(tool.parameters),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        declared_tools("tools", tools)
    }

    /// What the input brings for the turn of `previous_response_id`: the
    /// results of the client's calls (`function_call_output` items) and
    /// decisions on calls that wait for a person (`mcp_approval_response`
    /// items); empty when it carries none. Input that has them has
    /// nothing else.
    pub fn replies(&self) -> Result<Replies, ApiError> {
        let Value::Array(given) = &self.input else {
            return Ok(Replies::default());
        };
        let items: Vec<ItemIn> = given
            .iter()
            .enumerate()
            .map(|(at, given)| item(at, given))
            .collect::<Result<_, _>>()?;
        let replies = items
            .iter()
            .filter(|item| REPLY_ITEMS.contains(&item.kind.as_deref().unwrap_or_default()))
            .count();
        if replies == 0 {
            return Ok(Replies::default());
        }
        if replies < items.len() {
            return Err(ApiError::Unsupported {
                field: "input".into(),
                detail: "input that answers function calls or approval requests has only \
                         `function_call_output` and `mcp_approval_response` items: the turn \
                         that asked goes on"
                    .into(),
            });
        }
        if self.previous_response_id.is_none() {
            return Err(invalid(
                "previous_response_id",
                "`function_call_output` and `mcp_approval_response` answer the response that \
                 asked: name it in `previous_response_id`",
            ));
        }
        let mut replies = Replies::default();
        for (at, item) in items.into_iter().enumerate() {
            if item.kind.as_deref() == Some("mcp_approval_response") {
                replies.decisions.push(decision(at, item)?);
            } else {
                replies.answers.push(function_output(at, item)?);
            }
        }
        Ok(replies)
    }
}

/// The input items that answer the response named by
/// `previous_response_id`.
const REPLY_ITEMS: [&str; 2] = ["function_call_output", "mcp_approval_response"];

fn function_output(at: usize, item: ItemIn) -> Result<ClientAnswer, ApiError> {
    let call_id = item
        .call_id
        .filter(|id| !id.is_empty())
        .ok_or_else(|| invalid(&format!("input[{at}].call_id"), "a call id is needed"))?;
    let output = match item.output {
        Some(Content::Text(text)) => text,
        Some(Content::Parts(parts)) => parts
            .into_iter()
            .filter_map(|p| p.text)
            .collect::<Vec<_>>()
            .join("\n"),
        None => {
            return Err(invalid(
                &format!("input[{at}].output"),
                "`output` must be a string or text parts",
            ));
        }
    };
    Ok(ClientAnswer::text(&call_id, output, false))
}

/// An `mcp_approval_response`: `approval_request_id` names the
/// `mcp_approval_request` item (`mcpr_<call id>`).
fn decision(at: usize, item: ItemIn) -> Result<ClientDecision, ApiError> {
    let call_id = item
        .approval_request_id
        .as_deref()
        .and_then(|id| id.strip_prefix(APPROVAL_PREFIX))
        .filter(|id| !id.is_empty())
        .ok_or_else(|| {
            invalid(
                &format!("input[{at}].approval_request_id"),
                "the id of an `mcp_approval_request` item (`mcpr_…`) is needed",
            )
        })?;
    let approve = item.approve.ok_or_else(|| {
        invalid(
            &format!("input[{at}].approve"),
            "`approve` must be true or false",
        )
    })?;
    ClientDecision::new(
        call_id,
        approve,
        item.reason,
        &format!("input[{at}].reason"),
    )
}

/// The request's tools as a response shows them.
pub fn shown_tools(asked: &TurnRequest) -> Vec<FunctionTool> {
    asked
        .client_tools
        .iter()
        .map(|tool| FunctionTool {
            name: tool.name.clone(),
            description: tool.description.clone(),
            parameters: tool.parameters.clone(),
            strict: false,
        })
        .collect()
}

/// Most messages of a response's branch its input items list.
pub const EARLIER_ITEMS_MAX: u32 = 1000;

/// The input items of a turn, oldest first: the messages of its branch
/// before it (`earlier`: those of the responses it follows), its history
/// (when it brought one) and its message.
pub fn input_items(
    turn_id: Uuid,
    asked: &TurnRequest,
    earlier: &[MessageRecord],
) -> Vec<InputItem> {
    let item = |id: String, role: Role, text: String| {
        let part = if role == Role::Assistant {
            ShownPart::OutputText {
                text,
                annotations: [],
            }
        } else {
            ShownPart::InputText { text }
        };
        InputItem {
            id,
            role: role.as_str(),
            status: "completed",
            content: [part],
        }
    };
    let branch = earlier.iter().map(|m| {
        let role = if m.role == "assistant" {
            Role::Assistant
        } else {
            Role::User
        };
        let id = match m.message_id {
            Some(id) => format!("msg_{}", id.simple()),
            None => format!("msg_{}_h{}", m.turn_id.simple(), m.id),
        };
        item(id, role, m.content.clone())
    });
    let history = asked.history.iter().flatten();
    let last = ChatMessage::new(Role::User, asked.message.clone());
    let own = history
        .chain(std::iter::once(&last))
        .enumerate()
        .map(|(i, message)| {
            item(
                format!("msg_{}_in{}", turn_id.simple(), i + 1),
                message.role,
                message.content.clone(),
            )
        });
    branch.chain(own).collect()
}
