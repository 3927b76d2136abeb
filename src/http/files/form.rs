//! What the document says an upload's form is.

use utoipa::ToSchema;

use crate::files;

/// An upload (`multipart/form-data`): its `file`, and optionally its
/// `purpose` and `user_id`.
pub enum NewFileForm {}

impl utoipa::PartialSchema for NewFileForm {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{KnownFormat, ObjectBuilder, SchemaFormat, Type};
        let text = |about: &str| {
            ObjectBuilder::new()
                .schema_type(Type::String)
                .description(Some(about.to_owned()))
        };
        let file = text(
            "The file: at most `HARNESS_FILE_MAX_BYTES` (20 MiB by default), a PNG, JPEG, \
             WebP or GIF image, a PDF, or UTF-8 text (plain, Markdown, CSV or JSON), as its \
             bytes say.",
        )
        .format(Some(SchemaFormat::KnownFormat(KnownFormat::Binary)))
        .min_length(Some(1));
        let purpose = text("What it is for (default `user_data`).")
            .enum_values(Some(files::PURPOSES.iter().copied()));
        let user_id = text("Who uploads it: `DELETE /users/{user_id}` erases it.")
            .pattern(Some("^[A-Za-z0-9._:-]{1,128}$"));
        ObjectBuilder::new()
            .property("file", file)
            .required("file")
            .property("purpose", purpose)
            .property("user_id", user_id)
            .additional_properties(Some(
                utoipa::openapi::schema::AdditionalProperties::FreeForm(false),
            ))
            .into()
    }
}

impl ToSchema for NewFileForm {}
