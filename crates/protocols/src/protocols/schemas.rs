//! Schemas of fields whose shape a derive cannot say, for the OpenAPI
//! document: what the server takes, no more and no less.

use utoipa::openapi::{ObjectBuilder, OneOfBuilder, RefOr, Schema, Type, schema::ArrayBuilder};

/// A message's `content`: text, an array of parts (objects), or null.
pub fn text_or_parts() -> RefOr<Schema> {
    OneOfBuilder::new()
        .item(ObjectBuilder::new().schema_type(Type::String))
        .item(
            ArrayBuilder::new()
                .items(ObjectBuilder::new().schema_type(Type::Object))
                .build(),
        )
        .item(ObjectBuilder::new().schema_type(Type::Null))
        .description(Some("Text, or an array of parts (`text` parts are read)"))
        .into()
}

/// A JSON-RPC `id` the service echoes: text of at most 128 characters, a
/// number, or null.
pub fn jsonrpc_id() -> RefOr<Schema> {
    OneOfBuilder::new()
        .item(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .max_length(Some(128)),
        )
        .item(ObjectBuilder::new().schema_type(Type::Number))
        .item(ObjectBuilder::new().schema_type(Type::Null))
        .into()
}

/// Responses' `input`: text, or an array of input items (objects).
pub fn text_or_items() -> RefOr<Schema> {
    OneOfBuilder::new()
        .item(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .min_length(Some(1)),
        )
        .item(
            ArrayBuilder::new()
                .items(ObjectBuilder::new().schema_type(Type::Object))
                .build(),
        )
        .into()
}

/// Responses' `conversation`: a session id, or `{"id": …}` naming one.
pub fn conversation() -> RefOr<Schema> {
    let id = || {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .pattern(Some("^[A-Za-z0-9._:-]{1,128}$"))
    };
    OneOfBuilder::new()
        .item(id())
        .item(
            ObjectBuilder::new()
                .schema_type(Type::Object)
                .property("id", id())
                .required("id"),
        )
        .item(ObjectBuilder::new().schema_type(Type::Null))
        .into()
}

/// A UI message's `parts`: each an object with its `type`.
pub fn typed_parts() -> RefOr<Schema> {
    let part = ObjectBuilder::new()
        .schema_type(Type::Object)
        .property(
            "type",
            ObjectBuilder::new()
                .schema_type(Type::String)
                .min_length(Some(1)),
        )
        .required("type");
    ArrayBuilder::new().items(part).build().into()
}
