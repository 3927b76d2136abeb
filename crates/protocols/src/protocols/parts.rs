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

/// A content part: its text, when it has one.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub text: Option<String>,
}

/// A chat message's text: its `content` string, or the `text` of each of
/// its parts, a line each.
pub(crate) fn content_text(content: Option<&Content>) -> String {
    match content {
        Some(Content::Text(text)) => text.clone(),
        Some(Content::Parts(parts)) => parts
            .iter()
            .filter_map(|p| p.text.as_deref())
            .collect::<Vec<_>>()
            .join("\n"),
        None => String::new(),
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
