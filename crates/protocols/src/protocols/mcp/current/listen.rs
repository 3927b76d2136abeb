//! `subscriptions/listen` (MCP 2026-07-28): one long-lived request whose
//! stream says when a resource the client named changes
//! (`notifications/resources/updated`) and when the caller's list of
//! notes changes (`notifications/resources/list_changed`). No state
//! outlives the request, so any replica serves it: each look reads the
//! version of each resource (a note's modification time and size, a
//! transcript's last event: see `resources::version`), for the caller's
//! tenant only (a note path and a session id name the caller's own), and
//! compares it with the look before. A tenant holds at most
//! `MCP_LISTENS_PER_TENANT` listens in a process, each at most
//! [`URIS_MAX`] resources, each once. It ends when the client ends it, or when the
//! service shuts down (the final result says so).

use std::{
    collections::BTreeMap,
    hash::{DefaultHasher, Hash, Hasher},
    time::Duration,
};

use rmcp::{
    ErrorData as McpError,
    model::{
        Notification, ResourceListChangedNotification, ResourceUpdatedNotificationParam,
        ServerNotification, SubscriptionFilter,
    },
    service::SubscriptionContext,
};

use super::{Current, tenant_of};
use crate::{ids::Tenant, protocols::Shared, protocols::mcp::resources};

/// How often a listen looks for changes.
const LOOK_EVERY: Duration = Duration::from_secs(1);
/// Resources one listen follows at most.
const URIS_MAX: usize = 100;

/// What a listen takes of what the client asks: the resources of this
/// server's schemes (at most [`URIS_MAX`]) and the list of notes; the
/// tools and prompts never change while the service runs.
pub(super) fn accepted(requested: &SubscriptionFilter) -> Option<SubscriptionFilter> {
    // Each once: a URI named again is the same resource.
    let mut uris: Vec<String> = Vec::new();
    for uri in requested.resource_subscriptions.iter().flatten() {
        if uris.len() == URIS_MAX {
            break;
        }
        if resources::is_ours(uri) && !uris.contains(uri) {
            uris.push(uri.clone());
        }
    }
    Some(
        SubscriptionFilter::builder()
            .resources_list_changed()
            .resource_subscriptions(uris)
            .build(),
    )
}

async fn list_fingerprint(app: &Shared, tenant: &Tenant) -> Option<u64> {
    let listed = resources::list(app, tenant).await.ok()?;
    let mut hasher = DefaultHasher::new();
    serde_json::to_string(&listed).ok()?.hash(&mut hasher);
    Some(hasher.finish())
}

impl Current {
    /// Runs one listen until the client ends it.
    pub(super) async fn listen_until_cancelled(
        &self,
        context: SubscriptionContext,
    ) -> Result<(), McpError> {
        let tenant = tenant_of(context.request_context())?;
        let Some(_place) = self.app.mcp.listens.enter(&tenant.0) else {
            return Err(McpError::invalid_request(
                format!(
                    "this tenant holds {} listens here, as many as it may",
                    crate::protocols::mcp::state::MCP_LISTENS_PER_TENANT
                ),
                None,
            ));
        };
        let accepted = context.accepted().clone();
        // Each once, at most URIS_MAX: what rmcp accepts keeps the
        // client's repeats of a URI this server took.
        let mut uris: Vec<String> = Vec::new();
        for uri in accepted.resource_subscriptions.unwrap_or_default() {
            if uris.len() == URIS_MAX {
                break;
            }
            if !uris.contains(&uri) {
                uris.push(uri);
            }
        }
        let lists = accepted.resources_list_changed == Some(true);
        let mut seen = BTreeMap::new();
        for uri in &uris {
            seen.insert(
                uri.clone(),
                resources::version(&self.app, &tenant, uri).await,
            );
        }
        let mut list = if lists {
            list_fingerprint(&self.app, &tenant).await
        } else {
            None
        };
        // The service's shutdown ends it as it ends every stream.
        let closing = self.app.turns.streams_closed();
        loop {
            tokio::select! {
                () = context.cancelled() => return Ok(()),
                () = closing.cancelled() => return Ok(()),
                () = tokio::time::sleep(LOOK_EVERY) => {}
            }
            for uri in &uris {
                let now = resources::version(&self.app, &tenant, uri).await;
                let before = seen.get(uri).copied().flatten();
                if now.is_some() && now != before {
                    seen.insert(uri.clone(), now);
                    if before.is_some() {
                        let updated = ServerNotification::ResourceUpdatedNotification(
                            Notification::new(ResourceUpdatedNotificationParam::new(uri.clone())),
                        );
                        if context.sink().send(updated).await.is_err() {
                            return Ok(());
                        }
                    }
                }
            }
            if lists {
                let now = list_fingerprint(&self.app, &tenant).await;
                if now.is_some() && now != list {
                    let changed = list.is_some();
                    list = now;
                    let note = ServerNotification::ResourceListChangedNotification(
                        ResourceListChangedNotification::default(),
                    );
                    if changed && context.sink().send(note).await.is_err() {
                        return Ok(());
                    }
                }
            }
        }
    }
}
