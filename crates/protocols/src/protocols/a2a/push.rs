//! A2A push notifications (A2A 1.0 §3.1.7-3.1.10, §4.3): a task's
//! configurations (`CreateTaskPushNotificationConfig` and the rest), and
//! what a task's log pushes to them ([`fold`]).
//!
//! Delivery is the outbox's ([`crate::outbox::pushes`]): at least once,
//! in order per task and configuration. The task's log is the outbox:
//! each configuration keeps, in the database, the last event its URL
//! acknowledged (`sent_seq`). Every replica leases due configurations,
//! folds the task's log into the `StreamResponse`s after the cursor (its
//! status updates; the answer as one artifact before the end; text
//! deltas are not pushed), POSTs them one by one and moves the cursor
//! after each event. A failed POST is tried again with backoff, for
//! [`crate::outbox::GIVE_UP_AFTER`]; a replica that dies mid-delivery
//! leaves the cursor where it was and its lease runs out (30 s): another
//! replica goes on from there.
//!
//! Every URL goes through the outbound guard: only public addresses
//! unless `HARNESS_OUTBOUND_ALLOW_PRIVATE=true` (checked when the
//! configuration is made, and on every address its host resolves to when
//! a push is sent; redirects are not followed).

pub mod fold;

use chrono::Utc;
use uuid::Uuid;

use super::{
    Caller, RpcError, TASK_NOT_FOUND,
    wire::{
        AuthenticationIn, AuthenticationOut, ConfigQuery, PushConfigIn, PushConfigList,
        PushConfigOut,
    },
};
use crate::{
    ids::SessionKey,
    protocols::Shared,
    protocols::jsonrpc::{Empty, INVALID_PARAMS},
    service::{PUSH_CONFIGS_PER_TASK, PushAuth, PushConfig},
};

// Bounds of what a configuration holds.
const URL_MAX: usize = 2048;
const ID_MAX: usize = 128;
const TOKEN_MAX: usize = 512;
const CREDENTIALS_MAX: usize = 4096;

fn invalid(message: impl Into<String>) -> RpcError {
    RpcError::new(INVALID_PARAMS, message)
}

/// A text field of a config: absent, or a string of at most `max` bytes
/// that a header can carry.
fn header_text(given: Option<&str>, field: &str, max: usize) -> Result<Option<String>, RpcError> {
    match given {
        None | Some("") => Ok(None),
        Some(s) if s.len() <= max && axum::http::HeaderValue::from_str(s).is_ok() => {
            Ok(Some(s.to_owned()))
        }
        Some(_) => Err(invalid(format!(
            "`{field}` must be text of at most {max} bytes that a header can carry"
        ))),
    }
}

/// A configuration's URL, checked: http(s), no credentials in it, and an
/// address written in it public (unless private ones are allowed).
fn checked_url(app: &Shared, raw: &str) -> Result<String, RpcError> {
    let raw = Some(raw)
        .filter(|u| !u.is_empty() && u.len() <= URL_MAX)
        .ok_or_else(|| invalid(format!("`url` is required: at most {URL_MAX} bytes")))?;
    let url = reqwest::Url::parse(raw).map_err(|e| invalid(format!("`url`: {e}")))?;
    crate::outbox::check(app.settings.server.outbound_allow_private, &url)
        .map_err(|refused| invalid(format!("`url` refused: {refused}")))?;
    Ok(url.to_string())
}

/// A configuration as the protocol says it.
fn config_out(config: &PushConfig) -> PushConfigOut {
    PushConfigOut {
        id: config.id.clone(),
        task_id: config.task_id.to_string(),
        url: config.url.clone(),
        token: config.token.clone(),
        authentication: config.auth.as_ref().map(|auth| AuthenticationOut {
            scheme: auth.scheme.clone(),
            credentials: auth.credentials.clone(),
        }),
    }
}

/// An `authentication` read and checked.
fn checked_auth(auth: &AuthenticationIn) -> Result<PushAuth, RpcError> {
    let scheme = auth
        .scheme
        .as_deref()
        .filter(|s| {
            !s.is_empty()
                && s.len() <= 64
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        })
        .ok_or_else(|| {
            invalid("`authentication.scheme` must be an HTTP scheme (`Bearer`, `Basic`)")
        })?
        .to_owned();
    let credentials = header_text(auth.credentials.as_deref(), "credentials", CREDENTIALS_MAX)?;
    Ok(PushAuth {
        scheme,
        credentials,
    })
}

/// A `TaskPushNotificationConfig` checked, for `task_id`.
pub(super) fn parse_config(
    app: &Shared,
    task_id: Uuid,
    given: &PushConfigIn,
) -> Result<PushConfig, RpcError> {
    let id = match given.id.as_deref() {
        None | Some("") => Uuid::now_v7().to_string(),
        Some(id)
            if id.len() <= ID_MAX
                && id
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._:-".contains(&b)) =>
        {
            id.to_owned()
        }
        Some(_) => {
            return Err(invalid(format!(
                "`id` must be 1-{ID_MAX} characters of [A-Za-z0-9._:-]"
            )));
        }
    };
    Ok(PushConfig {
        task_id,
        id,
        url: checked_url(app, &given.url)?,
        token: header_text(given.token.as_deref(), "token", TOKEN_MAX)?,
        auth: given
            .authentication
            .as_ref()
            .map(checked_auth)
            .transpose()?,
        created_at: Utc::now(),
    })
}

/// The id of a config's task, as a method's params name it (`taskId`,
/// or the `id` of the REST path).
fn task_of(task_id: Option<&str>) -> Result<Uuid, RpcError> {
    let raw = task_id.ok_or_else(|| invalid("`taskId` is required"))?;
    Uuid::try_parse(raw).map_err(|_| RpcError::new(TASK_NOT_FOUND, "task not found"))
}

fn config_id(params: &ConfigQuery) -> Result<&str, RpcError> {
    params
        .id
        .as_deref()
        .filter(|id| !id.is_empty())
        .ok_or_else(|| invalid("`id` (the configuration's) is required"))
}

fn config_not_found() -> RpcError {
    // A2A names no error of its own for a missing configuration.
    RpcError::new(TASK_NOT_FOUND, "push notification config not found")
}

impl Caller {
    /// Registers `config` for the caller's task in `session`: its updates
    /// after `after` (a seq of the log) go to the URL.
    pub(super) async fn register_push(
        &self,
        session: &SessionKey,
        config: &PushConfig,
        after: i64,
    ) -> Result<(), RpcError> {
        let stored = self
            .app
            .turns
            .put_push_config(config, session, after)
            .await?;
        if !stored {
            return Err(invalid(format!(
                "a task holds at most {PUSH_CONFIGS_PER_TASK} push notification configs"
            )));
        }
        // Its first update goes out now, not at the next look.
        self.app.pushes_due.notify_one();
        Ok(())
    }

    /// Registers a `SendMessage`'s configuration, if it gave one, for the
    /// task `turn_id` in `session`: its updates after `after`.
    pub(super) async fn push_to(
        &self,
        given: Option<&PushConfig>,
        session: &SessionKey,
        turn_id: Uuid,
        after: i64,
    ) -> Result<(), RpcError> {
        let Some(config) = given else {
            return Ok(());
        };
        let config = PushConfig {
            task_id: turn_id,
            ..config.clone()
        };
        self.register_push(session, &config, after).await
    }

    /// `CreateTaskPushNotificationConfig`: the task's updates from now on.
    pub(super) async fn create_push(
        &self,
        params: &PushConfigIn,
    ) -> Result<PushConfigOut, RpcError> {
        let record = self.turn(task_of(params.task_id.as_deref())?).await?;
        let config = parse_config(&self.app, record.id, params)?;
        let now = self
            .app
            .turns
            .get_session(&record.session_id)
            .await?
            .map_or(0, |s| s.last_seq);
        self.register_push(&record.session_id, &config, now).await?;
        Ok(config_out(&config))
    }

    pub(super) async fn get_push(&self, params: &ConfigQuery) -> Result<PushConfigOut, RpcError> {
        let record = self.turn(task_of(params.task_id.as_deref())?).await?;
        let config = self
            .app
            .turns
            .push_config(record.id, config_id(params)?)
            .await?
            .ok_or_else(config_not_found)?;
        Ok(config_out(&config))
    }

    /// `ListTaskPushNotificationConfigs`: all of them, on one page (a task
    /// holds at most ten).
    pub(super) async fn list_pushes(
        &self,
        params: &ConfigQuery,
    ) -> Result<PushConfigList, RpcError> {
        let record = self.turn(task_of(params.task_id.as_deref())?).await?;
        let configs = self.app.turns.push_configs(record.id).await?;
        Ok(PushConfigList {
            configs: configs.iter().map(config_out).collect(),
            next_page_token: String::new(),
        })
    }

    pub(super) async fn delete_push(&self, params: &ConfigQuery) -> Result<Empty, RpcError> {
        let record = self.turn(task_of(params.task_id.as_deref())?).await?;
        if !self
            .app
            .turns
            .delete_push_config(record.id, config_id(params)?)
            .await?
        {
            return Err(config_not_found());
        }
        Ok(Empty {})
    }
}
