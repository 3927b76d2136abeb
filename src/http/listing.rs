//! One page type for the list routes: a list's items under their name
//! (`messages`, `jobs`), and for a list read a page at a time, where the
//! next page starts (`next_after`, null on the last page). One query
//! type for how many, and one for where a page starts.

use std::borrow::Cow;

use serde::{Deserialize, Serialize, ser::SerializeMap};
use utoipa::{
    IntoParams, PartialSchema, ToSchema,
    openapi::{
        ArrayBuilder, ObjectBuilder, Ref, RefOr, Schema,
        schema::{SchemaType, Type},
    },
};

use crate::protocols::error::ApiError;

/// What a list holds: the name of its field and of its page's schema.
pub trait Listed: ToSchema + Serialize {
    /// The field the items are under.
    const FIELD: &'static str;
    /// The name of the page's schema in the OpenAPI document.
    const PAGE: &'static str;
    /// What the page is, for the document.
    const ABOUT: &'static str;
}

/// Where a page starts: the cursor's type, or [`Whole`] for a list that
/// is given whole (it has no `next_after`).
pub trait Cursor: Serialize {
    const PAGED: bool;
    fn schema() -> Schema;
}

/// The cursor of a list given whole.
#[derive(Debug, Clone, Copy, Serialize)]
pub enum Whole {}

impl Cursor for Whole {
    const PAGED: bool = false;
    fn schema() -> Schema {
        Schema::default()
    }
}

impl Cursor for i64 {
    const PAGED: bool = true;
    fn schema() -> Schema {
        ObjectBuilder::new()
            .schema_type(SchemaType::from_iter([Type::Integer, Type::Null]))
            .format(Some(utoipa::openapi::SchemaFormat::KnownFormat(
                utoipa::openapi::KnownFormat::Int64,
            )))
            .description(Some(NEXT_AFTER))
            .into()
    }
}

impl Cursor for String {
    const PAGED: bool = true;
    fn schema() -> Schema {
        ObjectBuilder::new()
            .schema_type(SchemaType::from_iter([Type::String, Type::Null]))
            .description(Some(NEXT_AFTER))
            .into()
    }
}

const NEXT_AFTER: &str = "Cursor for the next page; absent on the last one.";

/// A list, or a page of one.
#[derive(Debug)]
pub struct Page<T, C = Whole> {
    pub items: Vec<T>,
    pub next_after: Option<C>,
}

impl<T> Page<T, Whole> {
    /// The whole list.
    pub fn whole(items: Vec<T>) -> Self {
        Self {
            items,
            next_after: None,
        }
    }
}

impl<T, C> Page<T, C> {
    /// A page of at most `limit` items: when it is full, the next starts
    /// after its last item (`cursor`).
    pub fn of(items: Vec<T>, limit: u32, cursor: impl FnOnce(&T) -> C) -> Self {
        let next_after = (items.len() == limit as usize)
            .then(|| items.last().map(cursor))
            .flatten();
        Self { items, next_after }
    }
}

impl<T: Listed, C: Cursor> Serialize for Page<T, C> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(1 + usize::from(C::PAGED)))?;
        map.serialize_entry(T::FIELD, &self.items)?;
        if C::PAGED {
            map.serialize_entry("next_after", &self.next_after)?;
        }
        map.end()
    }
}

impl<T: Listed, C: Cursor> PartialSchema for Page<T, C> {
    fn schema() -> RefOr<Schema> {
        let items = ArrayBuilder::new().items(Ref::from_schema_name(T::name()));
        let mut page = ObjectBuilder::new()
            .description(Some(T::ABOUT))
            .property(T::FIELD, items)
            .required(T::FIELD);
        if C::PAGED {
            page = page.property("next_after", C::schema());
        }
        page.into()
    }
}

impl<T: Listed, C: Cursor> ToSchema for Page<T, C> {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed(T::PAGE)
    }

    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        schemas.push((T::name().into_owned(), <T as PartialSchema>::schema()));
        T::schemas(schemas);
    }
}

/// How many of the newest records (a list's `limit`, 1-1000, 100 when
/// not given).
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct LimitQuery {
    /// How many of the newest records, 1-1000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<u32>,
}

impl LimitQuery {
    pub fn limit(&self) -> Result<u32, ApiError> {
        page_limit(self.limit)
    }
}

/// A page's size: 1-1000, 100 when not given.
pub fn page_limit(limit: Option<u32>) -> Result<u32, ApiError> {
    let limit = limit.unwrap_or(100);
    if !(1..=1000).contains(&limit) {
        return Err(ApiError::InvalidQuery(
            "`limit` must be between 1 and 1000".into(),
        ));
    }
    Ok(limit)
}

/// Where a page of a list read in order starts, and its size.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct PageQuery {
    /// Return items after this cursor (a message id or an event seq).
    #[param(minimum = 0)]
    pub after: Option<i64>,
    /// Items per page, 1-1000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<u32>,
}

impl PageQuery {
    /// The cursor (0: from the start) and the page's size.
    pub fn parse(&self) -> Result<(i64, u32), ApiError> {
        let after = self.after.unwrap_or(0);
        if after < 0 {
            return Err(ApiError::InvalidQuery(
                "`after` must not be negative".into(),
            ));
        }
        Ok((after, page_limit(self.limit)?))
    }
}

/// The lists the routes answer: each record type, the field it is under
/// and its page's schema.
macro_rules! listed {
    ($($item:ty => $field:literal as $page:literal, $about:literal;)*) => {$(
        impl Listed for $item {
            const FIELD: &'static str = $field;
            const PAGE: &'static str = $page;
            const ABOUT: &'static str = $about;
        }
    )*};
}

listed! {
    crate::store::MessageRecord => "messages" as "MessagePage", "A page of a session's history.";
    crate::events::EventEnvelope => "events" as "EventPage", "A page of a session's event log.";
    crate::store::DecisionRecord => "decisions" as "DecisionList", "A page of a session's decision records.";
    crate::store::CheckpointRecord => "checkpoints" as "CheckpointList", "A session's checkpoints.";
    crate::store::MemoryRecord => "memories" as "MemoryList", "A scope's memories.";
    crate::store::JudgementRecord => "judgements" as "JudgementList", "A turn's judgements.";
    crate::store::JobSummary => "jobs" as "JobList", "A session's background jobs.";
    crate::store::ObservationRecord => "observations" as "ObservationList", "A session's research observations.";
    crate::store::AuditRow => "audit" as "AuditPage", "A page of the audit trail.";
}

/// A route that reads one of a session's lists (`GET
/// /sessions/{session_id}/…`): its doc, name, path, query and page type,
/// and the block that reads the page (given the state, the session and
/// the query). The session is the caller's or 404, as on every session
/// route.
macro_rules! session_list {
    ($(#[$doc:meta])* $name:ident: $path:tt, $query:ident => $page:ident,
     |$app:ident, $session:ident, $q:ident| $read:block) => {
        $(#[$doc])*
        #[utoipa::path(
            get,
            path = $path,
            tag = "sessions",
            params(SessionPath, $query),
            responses(
                (status = 200, description = "Success", body = $page),
                BadRequest,
                NotFound,
            )
        )]
        async fn $name(
            axum::extract::State($app): axum::extract::State<crate::app::AppState>,
            SessionPath { session_id: $session }: SessionPath,
            ApiQuery($q): ApiQuery<$query>,
        ) -> Result<axum::Json<$page>, ApiError> {
            let page: Result<$page, ApiError> = async { $read }.await;
            page.map(axum::Json)
        }
    };
}
