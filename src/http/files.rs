//! `/files` (and `/v1/files`, OpenAI's files API): a tenant's files. An
//! upload is read a piece at a time into a spooled copy (its hash, size
//! and type told as it comes), then stored in the database in chunks
//! (`store::files`); a read streams the chunks back one at a time. So a
//! 20 MiB upload or download holds one piece in memory, not the file.

mod form;

use axum::{
    Extension,
    body::{Body, Bytes},
    extract::{DefaultBodyLimit, Multipart, Path, State, multipart::MultipartError},
    http::{StatusCode, header},
    response::{IntoResponse, Response},
};
pub use form::NewFileForm;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::{router::OpenApiRouter, routes};

use super::ApiQuery;
use crate::ids::Tenant;
use crate::protocols::error::ApiError;
use crate::{
    app::AppState,
    files::{self, NewFile, Spool},
    protocols::{error::BadRequest, native::checked_user_id},
    store::{
        FileRecord,
        audit::{AuditEntry, kinds},
    },
};

/// Bytes of an upload's body besides its file (the other fields, the
/// boundaries and the parts' heads) at most.
pub const UPLOAD_OVERHEAD: u64 = 64 * 1024;

/// Fields an upload's body has at most.
const FIELDS_MAX: usize = 8;

/// Bytes a field other than the file has at most.
const FIELD_MAX: usize = 1024;

/// How many body timeouts an upload has to arrive whole (each piece of
/// it has one).
const UPLOAD_TIMEOUTS: u32 = 10;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_file, list_files))
        .routes(routes!(get_file, delete_file))
        .routes(routes!(file_content))
        .routes(routes!(openai_create_file, openai_list_files))
        .routes(routes!(openai_get_file, openai_delete_file))
        .routes(routes!(openai_file_content))
        // An upload's size is the file limit's (`upload`), not the body
        // limit's.
        .layer(DefaultBodyLimit::disable())
}

/// Whether a request is an upload (its body limited by the file limit).
pub fn is_upload(method: &axum::http::Method, path: &str) -> bool {
    method == axum::http::Method::POST && (path == "/files" || path == "/v1/files")
}

/// A file, as OpenAI's files API shows one.
#[derive(Debug, Serialize, ToSchema)]
pub struct FileView {
    /// `file-…`
    id: String,
    /// Always `file`.
    #[schema(value_type = String, example = "file")]
    object: &'static str,
    bytes: i64,
    /// Unix seconds.
    created_at: i64,
    filename: String,
    purpose: String,
    /// What its bytes are: `image/png`, `image/jpeg`, `image/webp`,
    /// `image/gif`, `application/pdf`, `text/plain`, `text/markdown`,
    /// `text/csv` or `application/json`.
    media_type: String,
    /// Always `processed`: a file is usable once stored.
    #[schema(value_type = String, example = "processed")]
    status: &'static str,
}

impl FileView {
    fn of(file: FileRecord) -> Self {
        Self {
            id: file.id,
            object: "file",
            bytes: file.bytes,
            created_at: file.created_at.timestamp(),
            filename: file.filename,
            purpose: file.purpose,
            media_type: file.media_type,
            status: "processed",
        }
    }
}

/// A page of the caller's files, newest first.
pub type FileList = super::listing::Page<FileView, String>;

impl super::listing::Listed for FileView {
    const FIELD: &'static str = "files";
    const PAGE: &'static str = "FileList";
    const ABOUT: &'static str = "A page of the caller's files, newest first.";
}

/// The caller's files as OpenAI's list shows them.
#[derive(Debug, Serialize, ToSchema)]
pub struct OpenAiFileList {
    #[schema(value_type = String, example = "list")]
    object: &'static str,
    data: Vec<FileView>,
    first_id: Option<String>,
    last_id: Option<String>,
    has_more: bool,
}

/// A file deleted, as OpenAI says it.
#[derive(Debug, Serialize, ToSchema)]
pub struct FileDeleted {
    id: String,
    #[schema(value_type = String, example = "file")]
    object: &'static str,
    deleted: bool,
}

/// Which page of files.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct FileQuery {
    /// Files older than this one (a `file-…` id: the last of the page
    /// before).
    #[param(max_length = 64)]
    after: Option<String>,
    /// Files a page, 1-1000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u32>,
    /// Only `desc` (newest first), as OpenAI's default.
    #[param(pattern = "^desc$")]
    order: Option<String>,
}

/// A route's `{file_id}`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct FilePath {
    /// `file-…`
    #[param(max_length = 64)]
    file_id: String,
}

/// Uploads a file of the caller's tenant: the same bytes twice are
/// stored once (each file its own id).
#[utoipa::path(
    post,
    path = "/files",
    tag = "files",
    request_body(content = NewFileForm, content_type = "multipart/form-data"),
    responses(
        (status = 201, description = "Stored", body = FileView),
        BadRequest,
        (status = 413, description = "Over `HARNESS_FILE_MAX_BYTES` (`file_too_large`)"),
        (status = 415, description = "Not multipart, or bytes of a type files may not be (`unsupported_media_type`)"),
        (status = 422, description = "An empty file, an unknown purpose, a field that is not one (`invalid_field`)"),
        (status = 429, description = "The tenant's files would take more than `HARNESS_TENANT_FILE_BYTES` (`quota_exceeded`)"),
    )
)]
async fn create_file(
    State(app): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    multipart: Result<Multipart, axum::extract::multipart::MultipartRejection>,
) -> Result<Response, ApiError> {
    let file = upload(&app, &tenant, multipart).await?;
    Ok((StatusCode::CREATED, axum::Json(FileView::of(file))).into_response())
}

/// `POST /files` as OpenAI's `client.files.create` calls it (200).
#[utoipa::path(
    post,
    path = "/v1/files",
    tag = "files",
    request_body(content = NewFileForm, content_type = "multipart/form-data"),
    responses(
        (status = 200, description = "Stored", body = FileView),
        BadRequest,
        (status = 413, description = "Over `HARNESS_FILE_MAX_BYTES` (`file_too_large`)"),
        (status = 415, description = "Not multipart, or bytes of a type files may not be (`unsupported_media_type`)"),
        (status = 422, description = "An empty file, an unknown purpose (`invalid_field`)"),
        (status = 429, description = "Over the tenant's file bytes (`quota_exceeded`)"),
    )
)]
async fn openai_create_file(
    State(app): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    multipart: Result<Multipart, axum::extract::multipart::MultipartRejection>,
) -> Result<axum::Json<FileView>, ApiError> {
    let file = upload(&app, &tenant, multipart).await?;
    Ok(axum::Json(FileView::of(file)))
}

/// Reads the upload's fields, spools its file and stores it.
async fn upload(
    app: &AppState,
    tenant: &Tenant,
    multipart: Result<Multipart, axum::extract::multipart::MultipartRejection>,
) -> Result<FileRecord, ApiError> {
    let mut multipart = multipart.map_err(|_| {
        ApiError::UnsupportedFile(
            "an upload's body is multipart/form-data with a `file` field".into(),
        )
    })?;
    let limits = app.settings.server.file_limits();
    let piece = std::time::Duration::from_secs(app.settings.server.body_read_timeout_s);
    let whole = piece * UPLOAD_TIMEOUTS;
    let read = async {
        let mut fields = 0;
        let (mut purpose, mut user_id, mut spooled) = (None, None, None);
        while let Some(mut field) = within(piece, multipart.next_field()).await? {
            fields += 1;
            if fields > FIELDS_MAX {
                return Err(invalid(
                    "file",
                    format!("an upload has at most {FIELDS_MAX} fields"),
                ));
            }
            match field.name().unwrap_or("") {
                "file" if spooled.is_none() => {
                    let filename = files::clean_filename(field.file_name().unwrap_or("file"));
                    let declared = field.content_type().map(str::to_owned);
                    let mut spool = Spool::new(limits.max_bytes)?;
                    while let Some(chunk) = within(piece, field.chunk()).await? {
                        spool.write(&chunk).await?;
                    }
                    spooled = Some((spool.finish().await?, filename, declared));
                }
                "file" => return Err(invalid("file", "an upload has one `file`".into())),
                "purpose" => purpose = Some(small_field(piece, field).await?),
                "user_id" => user_id = Some(small_field(piece, field).await?),
                other => {
                    let other = other.chars().take(64).collect::<String>();
                    return Err(invalid(
                        "file",
                        format!(
                            "`{other}` is not a field of an upload: `file`, `purpose`, `user_id`"
                        ),
                    ));
                }
            }
        }
        Ok((purpose, user_id, spooled))
    };
    let (purpose, user_id, spooled) = tokio::time::timeout(whole, read)
        .await
        .map_err(|_| ApiError::RequestTimeout(whole.as_secs()))??;
    let Some((spooled, filename, declared)) = spooled else {
        return Err(invalid("file", "an upload needs a `file` field".into()));
    };
    let purpose = purpose.unwrap_or_else(|| "user_data".to_owned());
    let Some(purpose) = files::PURPOSES.iter().find(|p| **p == purpose) else {
        return Err(invalid(
            "purpose",
            format!("`purpose` is one of {}", files::PURPOSES.join(", ")),
        ));
    };
    let user_id = checked_user_id(user_id)?;
    let new = NewFile {
        tenant: &tenant.0,
        filename,
        purpose,
        declared: declared.as_deref(),
        session_id: None,
        user_id,
    };
    let file = files::put(app.store.as_ref(), limits, new, &spooled).await?;
    let entry = AuditEntry::new(&tenant.0, kinds::FILE_CREATED)
        .subject(&file.id)
        .outcome(format!("{} bytes, {}", file.bytes, file.media_type));
    app.store.record(entry).await;
    Ok(file)
}

fn invalid(field: &str, detail: String) -> ApiError {
    ApiError::InvalidField {
        field: field.to_owned(),
        detail,
    }
}

/// `call`, given `limit` to answer.
async fn within<T>(
    limit: std::time::Duration,
    call: impl Future<Output = Result<T, MultipartError>>,
) -> Result<T, ApiError> {
    tokio::time::timeout(limit, call)
        .await
        .map_err(|_| ApiError::RequestTimeout(limit.as_secs()))?
        .map_err(|e| ApiError::MalformedRequest(format!("the upload's body: {}", e.body_text())))
}

/// A field other than the file: short UTF-8 text.
async fn small_field(
    piece: std::time::Duration,
    mut field: axum::extract::multipart::Field<'_>,
) -> Result<String, ApiError> {
    let name = field.name().unwrap_or("").to_owned();
    let mut value = Vec::new();
    while let Some(chunk) = within(piece, field.chunk()).await? {
        if value.len() + chunk.len() > FIELD_MAX {
            return Err(invalid(
                &name,
                format!("`{name}` has at most {FIELD_MAX} bytes"),
            ));
        }
        value.extend_from_slice(&chunk);
    }
    String::from_utf8(value).map_err(|_| invalid(&name, format!("`{name}` is not UTF-8")))
}

/// The caller's files, newest first, a page at a time.
#[utoipa::path(
    get,
    path = "/files",
    tag = "files",
    params(FileQuery),
    responses(
        (status = 200, description = "A page of files", body = FileList),
        BadRequest,
    )
)]
async fn list_files(
    State(app): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    ApiQuery(query): ApiQuery<FileQuery>,
) -> Result<axum::Json<FileList>, ApiError> {
    let (items, limit) = page(&app, &tenant, &query).await?;
    let views = items.into_iter().map(FileView::of).collect();
    Ok(axum::Json(FileList::of(views, limit, |f| f.id.clone())))
}

/// `GET /files` as OpenAI's list says it.
#[utoipa::path(
    get,
    path = "/v1/files",
    tag = "files",
    params(FileQuery),
    responses(
        (status = 200, description = "A page of files", body = OpenAiFileList),
        BadRequest,
    )
)]
async fn openai_list_files(
    State(app): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    ApiQuery(query): ApiQuery<FileQuery>,
) -> Result<axum::Json<OpenAiFileList>, ApiError> {
    let (items, limit) = page(&app, &tenant, &query).await?;
    let data: Vec<FileView> = items.into_iter().map(FileView::of).collect();
    Ok(axum::Json(OpenAiFileList {
        object: "list",
        first_id: data.first().map(|f| f.id.clone()),
        last_id: data.last().map(|f| f.id.clone()),
        has_more: data.len() == limit as usize,
        data,
    }))
}

async fn page(
    app: &AppState,
    tenant: &Tenant,
    query: &FileQuery,
) -> Result<(Vec<FileRecord>, u32), ApiError> {
    let limit = super::listing::page_limit(query.limit)?;
    if query.order.as_deref().is_some_and(|o| o != "desc") {
        return Err(ApiError::InvalidQuery(
            "`order` is `desc`: files are listed newest first".into(),
        ));
    }
    let after = query.after.as_deref();
    if after.is_some_and(|a| a.chars().count() > 64) {
        return Err(ApiError::InvalidQuery(
            "`after` is a file's id (at most 64 characters)".into(),
        ));
    }
    Ok((app.store.files(&tenant.0, after, limit).await?, limit))
}

/// One of the caller's files: another tenant's is not found, as one never
/// made.
async fn own(app: &AppState, tenant: &Tenant, id: &str) -> Result<FileRecord, ApiError> {
    app.store
        .file(&tenant.0, id)
        .await?
        .ok_or(ApiError::FileNotFound)
}

/// One of the caller's files.
#[utoipa::path(
    get,
    path = "/files/{file_id}",
    tag = "files",
    params(FilePath),
    responses(
        (status = 200, description = "The file", body = FileView),
        (status = 404, description = "No such file of the caller's (`file_not_found`)"),
    )
)]
async fn get_file(
    State(app): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Path(FilePath { file_id }): Path<FilePath>,
) -> Result<axum::Json<FileView>, ApiError> {
    Ok(axum::Json(FileView::of(
        own(&app, &tenant, &file_id).await?,
    )))
}

/// `GET /files/{file_id}` under `/v1`.
#[utoipa::path(
    get,
    path = "/v1/files/{file_id}",
    tag = "files",
    params(FilePath),
    responses(
        (status = 200, description = "The file", body = FileView),
        (status = 404, description = "No such file of the caller's (`file_not_found`)"),
    )
)]
async fn openai_get_file(
    app: State<AppState>,
    tenant: Extension<Tenant>,
    path: Path<FilePath>,
) -> Result<axum::Json<FileView>, ApiError> {
    get_file(app, tenant, path).await
}

/// A file's bytes, streamed: its own media type, to be saved rather than
/// shown (`Content-Disposition: attachment`, no sniffing, sandboxed).
#[utoipa::path(
    get,
    path = "/files/{file_id}/content",
    tag = "files",
    params(FilePath),
    responses(
        (status = 200, description = "The bytes, as their own media type", content(
            (Vec<u8> = "image/png"), (Vec<u8> = "image/jpeg"), (Vec<u8> = "image/webp"),
            (Vec<u8> = "image/gif"), (Vec<u8> = "application/pdf"), (Vec<u8> = "text/plain"),
            (Vec<u8> = "text/markdown"), (Vec<u8> = "text/csv"), (Vec<u8> = "application/json"),
        )),
        (status = 404, description = "No such file of the caller's (`file_not_found`)"),
    )
)]
async fn file_content(
    State(app): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Path(FilePath { file_id }): Path<FilePath>,
) -> Result<Response, ApiError> {
    let file = own(&app, &tenant, &file_id).await?;
    let (store, chunks) = (app.store.clone(), file.chunks());
    let (tenant, sha256) = (file.tenant.clone(), file.sha256.clone());
    // One chunk read at a time, as the client takes them.
    let body = futures::stream::try_unfold(0i64, move |index| {
        let (store, tenant, sha256) = (store.clone(), tenant.clone(), sha256.clone());
        async move {
            if index >= chunks {
                return Ok(None);
            }
            match store.file_chunk(&tenant, &sha256, index).await {
                Ok(Some(data)) => Ok(Some((Bytes::from(data), index + 1))),
                Ok(None) => Err(std::io::Error::other("the file was deleted while read")),
                Err(e) => Err(std::io::Error::other(e.to_string())),
            }
        }
    });
    let headers = [
        (header::CONTENT_TYPE, file.media_type.clone()),
        (header::CONTENT_LENGTH, file.bytes.to_string()),
        (header::CONTENT_DISPOSITION, attachment(&file.filename)),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff".to_owned()),
        (
            header::CONTENT_SECURITY_POLICY,
            "sandbox; default-src 'none'".to_owned(),
        ),
        (header::CACHE_CONTROL, "private, no-store".to_owned()),
    ];
    Ok((headers, Body::from_stream(body)).into_response())
}

/// `GET /files/{file_id}/content` under `/v1`.
#[utoipa::path(
    get,
    path = "/v1/files/{file_id}/content",
    tag = "files",
    params(FilePath),
    responses(
        (status = 200, description = "The bytes, as their own media type", content(
            (Vec<u8> = "image/png"), (Vec<u8> = "image/jpeg"), (Vec<u8> = "image/webp"),
            (Vec<u8> = "image/gif"), (Vec<u8> = "application/pdf"), (Vec<u8> = "text/plain"),
            (Vec<u8> = "text/markdown"), (Vec<u8> = "text/csv"), (Vec<u8> = "application/json"),
        )),
        (status = 404, description = "No such file of the caller's (`file_not_found`)"),
    )
)]
async fn openai_file_content(
    app: State<AppState>,
    tenant: Extension<Tenant>,
    path: Path<FilePath>,
) -> Result<Response, ApiError> {
    file_content(app, tenant, path).await
}

/// `attachment` with the name, encoded as RFC 8187 says (nothing of it
/// can end the header or start another).
fn attachment(filename: &str) -> String {
    let mut encoded = String::with_capacity(filename.len());
    for byte in filename.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            encoded.push(char::from(byte));
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    format!("attachment; filename*=UTF-8''{encoded}")
}

async fn delete(app: &AppState, tenant: &Tenant, id: &str) -> Result<(), ApiError> {
    if !app.store.delete_file(&tenant.0, id).await? {
        return Err(ApiError::FileNotFound);
    }
    let entry = AuditEntry::new(&tenant.0, kinds::FILE_DELETED).subject(id);
    app.store.record(entry).await;
    Ok(())
}

/// Deletes one of the caller's files (its bytes too, unless another of
/// its files holds the same).
#[utoipa::path(
    delete,
    path = "/files/{file_id}",
    tag = "files",
    params(FilePath),
    responses(
        (status = 204, description = "Deleted"),
        (status = 404, description = "No such file of the caller's (`file_not_found`)"),
    )
)]
async fn delete_file(
    State(app): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Path(FilePath { file_id }): Path<FilePath>,
) -> Result<StatusCode, ApiError> {
    delete(&app, &tenant, &file_id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `DELETE /files/{file_id}` as OpenAI answers it.
#[utoipa::path(
    delete,
    path = "/v1/files/{file_id}",
    tag = "files",
    params(FilePath),
    responses(
        (status = 200, description = "Deleted", body = FileDeleted),
        (status = 404, description = "No such file of the caller's (`file_not_found`)"),
    )
)]
async fn openai_delete_file(
    State(app): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Path(FilePath { file_id }): Path<FilePath>,
) -> Result<axum::Json<FileDeleted>, ApiError> {
    delete(&app, &tenant, &file_id).await?;
    Ok(axum::Json(FileDeleted {
        id: file_id,
        object: "file",
        deleted: true,
    }))
}
