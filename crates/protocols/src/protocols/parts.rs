//! What the protocols' messages share: the client's tools they declare,
//! a message's text, and what a finished call shows.

/// A tool the client runs, as AG-UI and the AI SDK declare one.
#[derive(Debug, serde::Deserialize, utoipa::ToSchema)]
pub struct ToolDeclaration {
    #[schema(pattern = "^[A-Za-z0-9_-]{1,56}$")]
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// JSON schema of the arguments (an object schema; none: any object).
    #[schema(value_type = Option<Object>)]
    pub parameters: Option<serde_json::Value>,
}

/// The client tools a format's request declares, checked: at most 32,
/// each named once (`field` names the request's list). A tool without a
/// description is described by its name.
pub fn declared_tools(
    field: &str,
    tools: impl IntoIterator<Item = ToolDeclaration>,
) -> Result<Vec<crate::turn::ClientTool>, crate::protocols::error::ApiError> {
    let invalid = |detail: String| crate::protocols::error::ApiError::InvalidField {
        field: field.to_owned(),
        detail,
    };
    let mut declared: Vec<crate::turn::ClientTool> = Vec::new();
    for (at, tool) in tools.into_iter().enumerate() {
        if at == crate::turn::CLIENT_TOOLS_MAX {
            return Err(invalid(format!("`{field}` has more than 32 tools")));
        }
        let ToolDeclaration {
            name,
            description,
            parameters,
        } = tool;
        let description = if description.trim().is_empty() {
            format!("The client's tool {name}.")
        } else {
            description
        };
        let parameters = parameters.filter(|p| !p.is_null());
        let tool = crate::turn::ClientTool::checked(name, description, parameters, None)
            .map_err(|e| invalid(format!("{field}[{at}]: {e}")))?;
        if declared.iter().any(|other| other.name == tool.name) {
            return Err(invalid(format!("{:?} is named twice", tool.name)));
        }
        declared.push(tool);
    }
    Ok(declared)
}

/// What a finished call shows: the output of a completed one (its first
/// 2,000 characters, and where the whole is), else its status and why.
pub type CallResult<'a> = Result<String, (crate::events::ToolStatus, Option<&'a str>)>;

/// The call a `tool.finished` ends and what it shows; `None` for any
/// other event.
pub fn finished_call(event: &crate::events::TurnEvent) -> Option<(&str, CallResult<'_>)> {
    let crate::events::TurnEvent::ToolFinished {
        call_id,
        status,
        reason,
        error,
        output,
        artifact_id,
        ..
    } = event
    else {
        return None;
    };
    let shown = if *status == crate::events::ToolStatus::Completed {
        Ok(crate::protocols::parts::shown_tool_output(
            output.clone(),
            artifact_id.as_deref(),
        ))
    } else {
        Err((*status, error.as_deref().or(reason.as_deref())))
    };
    Some((call_id, shown))
}

/// A chat message's `content`: text, or parts.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(untagged, expecting = "a string or content parts")]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

/// A content part: text, or an image or a file in the shape of chat
/// completions (`image_url`, `file`) or of AG-UI (`image`, `document`
/// with a `source`; the draft's `binary`).
#[derive(Debug, Clone, serde::Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub text: Option<String>,
    /// Chat completions' image: `{url, detail}` (or the URL alone).
    pub image_url: Option<ImageUrl>,
    /// Chat completions' file: `{file_id | file_data, filename}`.
    pub file: Option<FileIn>,
    /// AG-UI's source of an image or a document.
    pub source: Option<SourceIn>,
    /// AG-UI's metadata of a part (an image's `detail`).
    pub metadata: Option<PartMetadata>,
    /// The AG-UI draft's `binary` part.
    #[serde(rename = "mimeType")]
    pub mime_type: Option<String>,
    pub url: Option<String>,
    pub data: Option<String>,
    pub id: Option<String>,
    pub filename: Option<String>,
}

/// An `image_url`: an object, or (older clients) its URL alone.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(untagged)]
pub enum ImageUrl {
    Url(String),
    Object { url: String, detail: Option<String> },
}

/// A chat completions `file` part's file.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct FileIn {
    pub file_id: Option<String>,
    /// A `data:` URL, or base64 alone.
    pub file_data: Option<String>,
    pub filename: Option<String>,
}

/// An AG-UI part's source: inline base64 `data` with its type, or a
/// `url` (`https` or `data:`).
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SourceIn {
    #[serde(rename = "type")]
    pub kind: String,
    pub value: String,
    pub mime_type: Option<String>,
}

#[derive(Debug, Clone, serde::Deserialize)]
pub struct PartMetadata {
    pub detail: Option<String>,
    pub filename: Option<String>,
}

/// A chat message's text: its `content` string, or the `text` of each of
/// its parts, a line each, and where an image or a file stood, a note
/// that the user sent one (an earlier message's: the model is not sent
/// its bytes again, and is told so).
pub(crate) fn content_text(content: Option<&Content>) -> String {
    match content {
        Some(Content::Text(text)) => text.clone(),
        Some(Content::Parts(parts)) => parts
            .iter()
            .filter_map(|p| match p.text.as_deref() {
                Some(text) => Some(text),
                None if p.kind.as_deref().is_some_and(|k| k != "text") => {
                    Some("[the user attached a file here]")
                }
                None => None,
            })
            .collect::<Vec<_>>()
            .join("\n"),
        None => String::new(),
    }
}

/// A chat message's text and its images and files, in order (`field`
/// names the message in an error); a part of a kind the service does not
/// read (audio, video) is refused, never dropped.
pub(crate) fn content_joined(
    content: Option<&Content>,
    field: &str,
) -> Result<crate::turn::Joined, crate::protocols::error::ApiError> {
    use crate::protocols::error::ApiError;
    let mut joined = crate::turn::Joined::default();
    let parts = match content {
        None => return Ok(joined),
        Some(Content::Text(text)) => {
            joined.text(text);
            return Ok(joined);
        }
        Some(Content::Parts(parts)) => parts,
    };
    if parts.len() > crate::turn::PARTS_MAX {
        return Err(ApiError::InvalidField {
            field: field.to_owned(),
            detail: format!("a message has at most {} parts", crate::turn::PARTS_MAX),
        });
    }
    for (i, part) in parts.iter().enumerate() {
        add_part(&mut joined, part, &format!("{field}[{i}]"))?;
    }
    Ok(joined)
}

/// A conversation as a turn takes it: each message's role and text, and
/// the images and files of the last one when it is the user's (earlier
/// ones are named in their text: see [`content_text`]).
pub(crate) type Said<'m> = (Vec<(&'m str, String)>, Vec<crate::turn::Asked>);

/// The [`Said`] of `messages` (`field` names the list in an error).
pub(crate) fn said<'m>(
    messages: impl ExactSizeIterator<Item = (&'m str, Option<&'m Content>)>,
    field: &str,
) -> Result<Said<'m>, crate::protocols::error::ApiError> {
    let last = messages.len().checked_sub(1);
    let mut texts = Vec::with_capacity(messages.len());
    let mut attachments = Vec::new();
    for (i, (role, content)) in messages.enumerate() {
        if Some(i) == last && role == "user" {
            let joined = content_joined(content, &format!("{field}[{i}].content"))?;
            attachments = joined.attachments;
            texts.push((role, joined.text));
        } else {
            texts.push((role, content_text(content)));
        }
    }
    Ok((texts, attachments))
}

/// Adds one part of a chat message to what it says.
fn add_part(
    joined: &mut crate::turn::Joined,
    part: &ContentPart,
    field: &str,
) -> Result<(), crate::protocols::error::ApiError> {
    use crate::protocols::error::ApiError;
    use crate::turn::AskedKind::{File, Image};
    let field = field.to_owned();
    let detail = part.metadata.as_ref().and_then(|m| m.detail.clone());
    let filename =
        (part.filename.clone()).or_else(|| part.metadata.as_ref().and_then(|m| m.filename.clone()));
    match part.kind.as_deref().unwrap_or("text") {
        "text" | "input_text" => joined.text(part.text.as_deref().unwrap_or_default()),
        "image_url" => {
            let (url, detail) = match &part.image_url {
                Some(ImageUrl::Url(url)) => (url.clone(), None),
                Some(ImageUrl::Object { url, detail }) => (url.clone(), detail.clone()),
                None => {
                    return Err(invalid(&field, "an `image_url` part needs its `image_url`"));
                }
            };
            joined.attach(&field, Image, from_url(&field, url, None)?, None, detail);
        }
        "file" => {
            let Some(file) = &part.file else {
                return Err(invalid(&field, "a `file` part needs its `file`"));
            };
            let data = file.file_data.clone().map(|data| file_data(&field, data));
            let source = source(&field, file.file_id.clone(), data, None)?;
            joined.attach(&field, File, source, file.filename.clone(), None);
        }
        kind @ ("image" | "document") => {
            let Some(given) = &part.source else {
                return Err(invalid(
                    &field,
                    "an `image` or `document` part needs its `source`",
                ));
            };
            let source = match given.kind.as_str() {
                "data" => source(
                    &field,
                    None,
                    Some((given.value.clone(), given.mime_type.clone())),
                    None,
                )?,
                "url" => from_url(&field, given.value.clone(), given.mime_type.as_deref())?,
                _ => return Err(invalid(&field, "a `source` is of type `data` or `url`")),
            };
            let kind = if kind == "image" { Image } else { File };
            joined.attach(&field, kind, source, filename, detail);
        }
        "binary" => {
            let data = part.data.clone().map(|d| (d, part.mime_type.clone()));
            let source = source(&field, part.id.clone(), data, part.url.clone())?;
            let kind = match &part.mime_type {
                Some(t) if t.starts_with("image/") => Image,
                _ => File,
            };
            joined.attach(&field, kind, source, filename, detail);
        }
        other => {
            return Err(ApiError::UnsupportedContent(format!(
                "{field}: a part of type `{}` is not read here: send text, images or files",
                other.chars().take(40).collect::<String>()
            )));
        }
    }
    Ok(())
}

fn invalid(field: &str, detail: &str) -> crate::protocols::error::ApiError {
    crate::protocols::error::ApiError::InvalidField {
        field: field.to_owned(),
        detail: detail.to_owned(),
    }
}

/// A completed tool call's output as the wire formats carry it (one text):
/// its first 2,000 characters, and where the whole is when it is longer.
pub(crate) fn shown_tool_output(output: Option<String>, artifact_id: Option<&str>) -> String {
    let mut text = output.unwrap_or_default();
    if let Some(id) = artifact_id {
        text.push_str(&format!(
            "\n[the output goes on: the whole is artifact {id} of this session]"
        ));
    }
    text
}

/// Where an image's or a file's bytes are, from the fields a part names
/// (exactly one: a file's id, base64 data with its media type, or an
/// `https` URL); `field` names the part in an error.
pub fn source(
    field: &str,
    file_id: Option<String>,
    data: Option<(String, Option<String>)>,
    url: Option<String>,
) -> Result<crate::turn::Source, crate::protocols::error::ApiError> {
    use crate::turn::Source;
    let invalid = |detail: String| crate::protocols::error::ApiError::InvalidField {
        field: field.to_owned(),
        detail,
    };
    match (file_id, data, url) {
        (Some(id), None, None) if !id.is_empty() && id.len() <= 64 => Ok(Source::FileId(id)),
        (Some(_), None, None) => Err(invalid("a `file_id` is 1-64 characters".into())),
        (None, Some((data, Some(media_type))), None) => Ok(Source::Data { media_type, data }),
        (None, Some((_, None)), None) => Err(invalid("`data` needs its `media_type`".into())),
        (None, None, Some(url)) => from_url(field, url, None),
        _ => Err(invalid(
            "give one of `file_id`, `data` (with `media_type`) or `url`".into(),
        )),
    }
}

/// OpenAI's `file_data`: a `data:` URL's bytes and type, or base64 alone
/// (its bytes say what it is).
pub fn file_data(field: &str, data: String) -> (String, Option<String>) {
    match from_url(field, data.clone(), None) {
        Ok(crate::turn::Source::Data { media_type, data }) => (data, Some(media_type)),
        _ => (data, Some("application/octet-stream".to_owned())),
    }
}

/// A URL's source: a `data:` URL's bytes (of its own media type, else
/// `given`), or an `https` URL to fetch.
pub fn from_url(
    field: &str,
    url: String,
    given: Option<&str>,
) -> Result<crate::turn::Source, crate::protocols::error::ApiError> {
    use crate::turn::Source;
    let invalid = |detail: &str| crate::protocols::error::ApiError::InvalidField {
        field: field.to_owned(),
        detail: detail.to_owned(),
    };
    if let Some(rest) = url.strip_prefix("data:") {
        let Some((head, data)) = rest.split_once(',') else {
            return Err(invalid("a data URL is `data:{media type};base64,{bytes}`"));
        };
        let Some(media_type) = head.strip_suffix(";base64") else {
            return Err(invalid("a data URL's bytes are base64 (`;base64,`)"));
        };
        let media_type = match (media_type, given) {
            ("", Some(given)) => given,
            (own, _) => own,
        };
        return Ok(Source::Data {
            media_type: media_type.to_owned(),
            data: data.to_owned(),
        });
    }
    if url.len() > 2048 || !url.starts_with("https://") {
        return Err(invalid(
            "a URL is `https://…` (at most 2,048 bytes) or a `data:` URL",
        ));
    }
    Ok(Source::Url(url))
}

/// An OpenAI `response_format` (chat completions) or `text.format`
/// (Responses, whose `json_schema` fields sit beside its `type`).
#[derive(Debug, Clone, serde::Deserialize, utoipa::ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ResponseFormatIn {
    /// Prose (the default).
    Text,
    /// Any JSON object.
    JsonObject,
    /// An instance of a JSON Schema.
    JsonSchema {
        /// Chat completions' fields.
        json_schema: Option<JsonSchemaIn>,
        /// Responses' fields.
        #[serde(flatten)]
        beside: JsonSchemaIn,
    },
}

/// A `json_schema` format's schema.
#[derive(Debug, Clone, Default, serde::Deserialize, utoipa::ToSchema)]
pub struct JsonSchemaIn {
    pub name: Option<String>,
    #[schema(value_type = Option<Object>)]
    pub schema: Option<serde_json::Value>,
    pub strict: Option<bool>,
    pub description: Option<String>,
}

impl ResponseFormatIn {
    /// The output format it asks for (`field` names it in an error).
    pub fn output(
        self,
        field: &str,
    ) -> Result<Option<crate::turn::OutputFormat>, crate::protocols::error::ApiError> {
        let invalid = |detail: String| crate::protocols::error::ApiError::InvalidField {
            field: field.to_owned(),
            detail,
        };
        let (name, schema, strict) = match self {
            Self::Text => return Ok(None),
            Self::JsonObject => (None, None, false),
            Self::JsonSchema {
                json_schema,
                beside,
            } => {
                let given = json_schema.unwrap_or(beside);
                let Some(schema) = given.schema else {
                    return Err(invalid("a `json_schema` format needs its `schema`".into()));
                };
                (given.name, Some(schema), given.strict.unwrap_or(false))
            }
        };
        crate::turn::OutputFormat::checked(name, schema, strict)
            .map(Some)
            .map_err(invalid)
    }
}
