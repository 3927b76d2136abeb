//! An input message of a Responses request: its role, its text, and its
//! images and files (`input_image`, `input_file`).

use super::{Content, ItemIn, invalid};
use crate::protocols::error::ApiError;

/// One input message: its role, its text and its images and files.
pub(super) fn input_message(
    item: &ItemIn,
    at: usize,
) -> Result<(String, crate::turn::Joined), ApiError> {
    use crate::protocols::parts::{file_data, from_url, source};
    use crate::turn::AskedKind;
    let field = format!("input[{at}]");
    if let Some(kind) = item.kind.as_deref()
        && kind != "message"
    {
        return Err(ApiError::Unsupported {
            field,
            detail: format!("input items of type {kind:?} are not taken"),
        });
    }
    let role = item
        .role
        .as_deref()
        .ok_or_else(|| invalid(&field, "an input message needs a `role`"))?;
    let mut joined = crate::turn::Joined::default();
    match &item.content {
        Some(Content::Text(text)) => joined.text(text),
        Some(Content::Parts(parts)) => {
            if parts.len() > crate::turn::PARTS_MAX {
                return Err(invalid(&field, "a message has at most 64 parts"));
            }
            for (i, part) in parts.iter().enumerate() {
                let field = format!("{field}.content[{i}]");
                match (part.kind.as_deref(), part.text.as_deref()) {
                    (Some("input_text" | "output_text" | "text"), Some(text)) => joined.text(text),
                    (Some("input_image"), _) => {
                        let source = match (&part.image_url, &part.file_id) {
                            (Some(url), None) => from_url(&field, url.clone(), None)?,
                            (None, file_id @ Some(_)) => {
                                source(&field, file_id.clone(), None, None)?
                            }
                            _ => {
                                return Err(invalid(
                                    &field,
                                    "an `input_image` has an `image_url` or a `file_id`",
                                ));
                            }
                        };
                        joined.attach(&field, AskedKind::Image, source, None, part.detail.clone());
                    }
                    (Some("input_file"), _) => {
                        let data = part.file_data.clone().map(|data| file_data(&field, data));
                        let source =
                            source(&field, part.file_id.clone(), data, part.file_url.clone())?;
                        joined.attach(&field, AskedKind::File, source, part.filename.clone(), None);
                    }
                    (kind, _) => {
                        return Err(ApiError::UnsupportedContent(format!(
                            "{field}: content parts of type {:?} are not read here: send \
                             `input_text`, `input_image` or `input_file`",
                            kind.unwrap_or("?")
                        )));
                    }
                }
            }
        }
        None => return Err(invalid(&field, "`content` must be a string or parts")),
    }
    Ok((role.to_owned(), joined))
}
