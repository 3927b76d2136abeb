//! Admin keys and their routes: a tenant erased whole (its keys revoked),
//! and the audit trail of who did what to whose data.

use harness_store::store::TenantLimits;
use serde_json::{Value, json};

use crate::{
    edge::erase::{a_full_session, app_with},
    edge::tenants::client_with_key,
    helpers::{TestApp, png_of, vault_of},
    on_both_backends,
    support::Backend,
};

fn hash(key: &str) -> String {
    hex::encode(<sha2::Sha256 as sha2::Digest>::digest(key.as_bytes()))
}

/// An app with keys on: Acme's, Globex's, and an operator's admin key.
pub(crate) async fn keyed_app(backend: Backend, vault: &std::path::Path) -> TestApp {
    let app = app_with(backend, vault, |settings| {
        settings.server.auth = harness_core::config::AuthMode::On;
    })
    .await;
    let store = app.db.open().await;
    for (id, tenant, key, admin) in [
        ("key_acme", "acme", "ah_acme", false),
        ("key_globex", "globex", "ah_globex", false),
        ("key_ops", "ops", "ah_ops", true),
    ] {
        store
            .create_api_key(id, tenant, &hash(key), admin, chrono::Utc::now())
            .await
            .unwrap();
    }
    app
}

async fn delete(client: &reqwest::Client, app: &TestApp, path: &str) -> (u16, Value) {
    let response = client.delete(app.url(path)).send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

async fn get(client: &reqwest::Client, app: &TestApp, path: &str) -> (u16, Value) {
    let response = client.get(app.url(path)).send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// `DELETE /tenants/{tenant}` with an admin key: the tenant's keys are
/// revoked, and no table of the schema (read from the catalogue) holds a
/// row naming it, but the revoked keys and the audit trail; its vault
/// folder is gone. Another tenant's data stays whole; a tenant's key may
/// not erase a tenant.
async fn a_tenant_is_erased_whole_and_its_keys_revoked(backend: Backend) {
    let vault = vault_of(&[("notes/a.md", "# A\n")]);
    let mut app = keyed_app(backend, vault.path()).await;
    let acme = client_with_key("ah_acme");
    let globex = client_with_key("ah_globex");
    let ops = client_with_key("ah_ops");
    app.client = globex.clone();
    a_full_session(&app, "globex", "s-g1").await;
    a_full_session(&app, "globex", "s-g2").await;
    let (status, file) = app.upload("g.png", "image/png", &png_of(300 * 1024)).await;
    assert_eq!(status, 201, "{file}");
    app.client = acme.clone();
    a_full_session(&app, "acme", "s-a1").await;
    let store = app.db.open().await;
    let limits = TenantLimits {
        max_running_turns: Some(3),
        ..TenantLimits::default()
    };
    store
        .set_tenant_limits("globex", &limits, chrono::Utc::now())
        .await
        .unwrap();
    assert!(vault.path().join(".tenants/globex/notes/a.md").exists());

    let needles = ["globex".to_owned()];
    let before = app.db.rows_naming(&needles).await;
    for table in [
        "sessions",
        "turns",
        "events",
        "approvals",
        "memories",
        "webhooks",
        "webhook_deliveries",
        "tenants",
        "tenant_usage",
        "api_keys",
        "files",
        "file_blobs",
        "file_chunks",
    ] {
        assert!(before[table] > 0, "{table}: {before:?}");
    }

    let (status, body) = delete(&acme, &app, "/tenants/globex").await;
    assert_eq!(
        (status, body["code"].as_str()),
        (403, Some("admin_required"))
    );
    assert_eq!(app.db.rows_naming(&needles).await, before);

    let (status, body) = delete(&ops, &app, "/tenants/globex").await;
    assert_eq!(status, 204, "{body}");
    let after = app.db.rows_naming(&needles).await;
    let left: Vec<(&String, &i64)> = after
        .iter()
        .filter(|(table, count)| **count > 0 && !["api_keys", "audit"].contains(&table.as_str()))
        .collect();
    assert!(left.is_empty(), "rows left: {left:?}");
    let keys = store.list_api_keys().await.unwrap();
    let globex_keys: Vec<_> = keys.iter().filter(|k| k.1 == "globex").collect();
    assert_eq!(globex_keys.len(), 1);
    assert!(globex_keys.iter().all(|k| k.4.is_some()), "{globex_keys:?}");
    assert!(!vault.path().join(".tenants/globex").exists());
    assert!(vault.path().join(".tenants/acme/notes/a.md").exists());

    // The key is refused at once; Acme's data is whole.
    let (status, _) = get(&globex, &app, "/sessions/s-g1").await;
    assert_eq!(status, 401);
    let (status, body) = get(&acme, &app, "/sessions/s-a1").await;
    assert_eq!(status, 200, "{body}");
    let acme_rows = app.db.rows_naming(&["acme".to_owned()]).await;
    for table in ["sessions", "turns", "events", "memories", "webhooks"] {
        assert!(acme_rows[table] > 0, "{table}: {acme_rows:?}");
    }

    // The trail names the erase and the keys it revoked.
    let (status, body) = get(&ops, &app, "/audit?tenant=globex").await;
    assert_eq!(status, 200, "{body}");
    let kinds: Vec<&str> = body["audit"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| row["kind"].as_str().unwrap())
        .collect();
    assert!(kinds.contains(&"key.revoked"), "{kinds:?}");
    assert_eq!(kinds.last(), Some(&"tenant.erased"), "{kinds:?}");

    // Nothing is left: erasing again is done at once.
    let (status, _) = delete(&ops, &app, "/tenants/globex").await;
    assert_eq!(status, 204);
    let (status, body) = delete(&ops, &app, "/tenants/no%20spaces").await;
    assert_eq!(
        (status, body["code"].as_str()),
        (400, Some("invalid_tenant"))
    );
}

/// The trail records approvals decided, erases, webhook endpoints, a
/// refusal of another tenant's session and failed authentications (one
/// row per address and minute, counted), by whom, and never what was
/// said; only an admin key reads it, by tenant, kind and time, a page at
/// a time; no route changes it.
async fn the_audit_trail_records_who_did_what(backend: Backend) {
    let vault = vault_of(&[("notes/a.md", "# A\n")]);
    let mut app = keyed_app(backend, vault.path()).await;
    let acme = client_with_key("ah_acme");
    let globex = client_with_key("ah_globex");
    let ops = client_with_key("ah_ops");
    app.client = acme.clone();
    let turns = a_full_session(&app, "acme", "s-a1").await;

    // Globex reaches for Acme's session and turn: the never-made 404.
    let (status, body) = delete(&globex, &app, "/sessions/s-a1").await;
    assert_eq!(
        (status, body["code"].as_str()),
        (404, Some("session_not_found"))
    );
    let path = format!("/sessions/s-g/turns/{}", turns[0]);
    let (status, _) = get(&globex, &app, &path).await;
    assert_eq!(status, 404);
    // Three failed authentications from one address: one row.
    let stranger = client_with_key("ah_wrong");
    for _ in 0..3 {
        assert_eq!(get(&stranger, &app, "/sessions/s-a1").await.0, 401);
    }
    let (_, hooks) = get(&acme, &app, "/webhooks").await;
    let hook = hooks["webhooks"][0]["id"].as_str().unwrap().to_owned();
    let (status, body) = get(&globex, &app, &format!("/webhooks/{hook}")).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (404, Some("webhook_not_found"))
    );
    let export = acme
        .get(app.url("/sessions/s-a1/export"))
        .send()
        .await
        .unwrap();
    let export = export.text().await.unwrap();
    let artifact = export
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).unwrap())
        .find(|line| line["type"] == "artifact")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let path = format!("/sessions/s-g/artifacts/{artifact}");
    assert_eq!(get(&globex, &app, &path).await.0, 404);
    assert_eq!(
        delete(&acme, &app, &format!("/webhooks/{hook}")).await.0,
        204
    );
    assert_eq!(delete(&acme, &app, "/sessions/s-a1").await.0, 204);

    let (status, body) = get(&acme, &app, "/audit").await;
    assert_eq!(
        (status, body["code"].as_str()),
        (403, Some("admin_required"))
    );
    let (status, body) = get(&ops, &app, "/audit?limit=1000").await;
    assert_eq!(status, 200, "{body}");
    let rows = body["audit"].as_array().unwrap().clone();
    let find =
        |kind: &str| -> Vec<Value> { rows.iter().filter(|r| r["kind"] == kind).cloned().collect() };
    let decided = find("approval.decided");
    assert_eq!(decided.len(), 1, "{rows:?}");
    assert_eq!(decided[0]["tenant"], "acme");
    assert_eq!(decided[0]["actor"], "key_acme");
    assert_eq!(decided[0]["subject"], format!("{}/call_e1", turns[0]));
    assert_eq!(decided[0]["outcome"], "approved");
    // Globex's four refusals are one row of Acme's trail per minute, with
    // their count and the first one's id and method (issue 63: a row
    // each). (Two rows when the requests straddle a minute.)
    let refused = find("refused.other_tenant");
    assert!((1..=2).contains(&refused.len()), "{rows:?}");
    assert!(
        refused
            .iter()
            .all(|r| r["tenant"] == "acme" && r["actor"] == "key_globex")
    );
    let counted: i64 = refused.iter().map(|r| r["count"].as_i64().unwrap()).sum();
    assert_eq!(counted, 4, "{refused:?}");
    assert_eq!(refused[0]["subject"], "s-a1");
    assert_eq!(refused[0]["outcome"], "DELETE by tenant globex");
    let failed = find("auth.failed");
    assert_eq!(failed.len(), 1, "{rows:?}");
    assert_eq!(failed[0]["count"], 3);
    assert_eq!(failed[0]["address"], "127.0.0.1");
    assert_eq!(failed[0]["tenant"], Value::Null);
    for kind in ["webhook.created", "webhook.deleted", "session.erased"] {
        let found = find(kind);
        assert_eq!(found.len(), 1, "{kind}: {rows:?}");
        assert_eq!(found[0]["actor"], "key_acme", "{kind}");
    }
    assert_eq!(find("session.erased")[0]["subject"], "s-a1");
    // Ids and outcomes only: nothing that was said or asked.
    let text = body.to_string();
    for said in ["Change my note", "changed", "Lyon", "Where am I"] {
        assert!(!text.contains(said), "{said}: {text}");
    }

    // Filters: kind, tenant, time; pages.
    let (_, page) = get(&ops, &app, "/audit?kind=approval.decided&tenant=acme").await;
    assert_eq!(page["audit"].as_array().map(Vec::len), Some(1), "{page}");
    let (_, page) = get(&ops, &app, "/audit?tenant=globex").await;
    assert_eq!(page["audit"], json!([]), "{page}");
    let (_, first) = get(&ops, &app, "/audit?limit=2").await;
    let next = first["next_after"].as_i64().unwrap();
    let (_, second) = get(&ops, &app, &format!("/audit?limit=2&after={next}")).await;
    assert_eq!(second["audit"][0], rows[2], "{second}");
    let later = (chrono::Utc::now() + chrono::Duration::hours(1)).to_rfc3339();
    let (_, none) = get(
        &ops,
        &app,
        &format!("/audit?since={}", later.replace('+', "%2B")),
    )
    .await;
    assert_eq!(none["audit"], json!([]), "{none}");
    let (_, all) = get(
        &ops,
        &app,
        &format!("/audit?limit=1000&until={}", later.replace('+', "%2B")),
    )
    .await;
    assert_eq!(all["audit"].as_array().map(Vec::len), Some(rows.len()));
    for bad in [
        "kind=nope",
        "limit=0",
        "after=-1",
        "tenant=a%20b",
        "since=yesterday",
    ] {
        let (status, body) = get(&ops, &app, &format!("/audit?{bad}")).await;
        assert_eq!(status, 400, "{bad}: {body}");
    }
    // No route changes or removes a row.
    for method in [
        reqwest::Method::DELETE,
        reqwest::Method::POST,
        reqwest::Method::PUT,
    ] {
        let response = ops.request(method, app.url("/audit")).send().await.unwrap();
        assert_eq!(response.status(), 405);
    }
    let store = app.db.open().await;
    let stored = store
        .audit_rows(&harness_store::store::AuditFilter {
            limit: 1000,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(stored.len(), rows.len());
}

/// With keys off, the admin routes are refused unless
/// `HARNESS_ALLOW_LOCAL_ADMIN=true`.
async fn without_keys_admin_routes_need_local_admin(backend: Backend) {
    let vault = vault_of(&[]);
    let app = app_with(backend, vault.path(), |_| {}).await;
    let (status, body) = app.get_json("/audit").await;
    assert_eq!(
        (status, body["code"].as_str()),
        (403, Some("admin_required"))
    );
    let (status, _) = delete(&app.client, &app, "/tenants/default").await;
    assert_eq!(status, 403);

    let local = app_with(backend, vault.path(), |settings| {
        settings.server.allow_local_admin = true;
    })
    .await;
    assert_eq!(
        local
            .post_turn("s-1", json!({"message": "Hi."}))
            .await
            .status(),
        200
    );
    let (status, body) = local.get_json("/audit").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(delete(&local.client, &local, "/sessions/s-1").await.0, 204);
    let (_, body) = local.get_json("/audit?kind=session.erased").await;
    assert_eq!(body["audit"][0]["actor"], "local", "{body}");
    assert_eq!(body["audit"][0]["tenant"], "default", "{body}");
}

on_both_backends!(
    a_tenant_is_erased_whole_and_its_keys_revoked,
    the_audit_trail_records_who_did_what,
    without_keys_admin_routes_need_local_admin,
);
