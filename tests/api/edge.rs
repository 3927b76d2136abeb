//! The HTTP edge: keys and tenants, limits, CORS, errors, the OpenAPI document, admin routes, export and erase, webhooks, files.

pub(crate) mod admin;
pub(crate) mod auth;
pub(crate) mod connections;
pub(crate) mod cors;
pub(crate) mod erase;
pub(crate) mod errors;
pub(crate) mod export;
pub(crate) mod files;
pub(crate) mod openapi;
pub(crate) mod quickstart;
pub(crate) mod tenant_limits;
pub(crate) mod tenants;
pub(crate) mod webhooks;
