//! Identifiers that come from clients, validated once at the edge.

use std::fmt;

/// The longest session id accepted.
pub const SESSION_ID_MAX_LEN: usize = 128;

/// A client-chosen session id: 1 to 128 characters of `[A-Za-z0-9._:-]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SessionId(String);

/// Why a session id was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SessionIdError {
    #[error("session id must not be empty")]
    Empty,
    #[error("session id is longer than {SESSION_ID_MAX_LEN} characters")]
    TooLong,
    #[error("session id may only contain A-Z, a-z, 0-9, '.', '_', ':' and '-'")]
    BadCharacter,
}

impl SessionId {
    pub fn parse(raw: &str) -> Result<Self, SessionIdError> {
        if raw.is_empty() {
            return Err(SessionIdError::Empty);
        }
        if raw.len() > SESSION_ID_MAX_LEN {
            return Err(SessionIdError::TooLong);
        }
        let allowed = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-');
        if !raw.bytes().all(allowed) {
            return Err(SessionIdError::BadCharacter);
        }
        Ok(Self(raw.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The tenant of everything made without API keys (`HARNESS_AUTH=off`,
/// or before keys were turned on).
pub const DEFAULT_TENANT: &str = "default";

/// The tenant of a request: its key's, or [`DEFAULT_TENANT`] when keys
/// are not required (the HTTP edge puts it into every request).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant(pub String);

/// Who a request is: the name the audit trail gives them (a key's id,
/// `local` with keys off), and whether they may use the admin routes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub actor: String,
    pub admin: bool,
}

/// The stored form of a memory scope (`user:…` or `session:…`) of a
/// tenant: the default tenant's scopes as they are, another's behind
/// `{tenant}/`. Neither a tenant nor a scope holds a `/`, so two tenants'
/// scopes never meet.
pub fn tenant_scope(tenant: &str, scope: &str) -> String {
    if tenant == DEFAULT_TENANT {
        scope.to_owned()
    } else {
        format!("{tenant}/{scope}")
    }
}

/// The scope a client knows, of a stored one (see [`tenant_scope`]).
pub fn client_scope(stored: &str) -> &str {
    stored.split_once('/').map_or(stored, |(_, scope)| scope)
}

/// A tenant's session as the store keys it: the default tenant's under
/// its id, another tenant's under `{tenant}/{id}` (as [`tenant_scope`]).
/// Every tenant has its own ids: the same id in two tenants is two
/// sessions, and nothing a tenant does reaches (or hints at) another's.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct SessionKey(String);

impl SessionKey {
    pub fn new(tenant: &str, id: &SessionId) -> Self {
        Self(tenant_scope(tenant, id.as_str()))
    }

    /// The key of a session as the store holds it.
    pub fn from_stored(stored: &str) -> Self {
        Self(stored.to_owned())
    }

    /// The key of a session as the store holds it, taken.
    pub fn stored(stored: String) -> Self {
        Self(stored)
    }

    /// The stored key (what every table's `session_id` holds).
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The id the session's tenant knows it by.
    pub fn id(&self) -> &str {
        client_session_id(&self.0)
    }

    /// The session's tenant.
    pub fn tenant(&self) -> &str {
        tenant_of(&self.0)
    }
}

/// The tenant of a session's stored key (see [`SessionKey::tenant`]).
pub fn tenant_of(stored: &str) -> &str {
    stored
        .split_once('/')
        .map_or(DEFAULT_TENANT, |(tenant, _)| tenant)
}

/// The key the store holds as `stored`.
impl From<String> for SessionKey {
    fn from(stored: String) -> Self {
        Self(stored)
    }
}

impl From<&str> for SessionKey {
    fn from(stored: &str) -> Self {
        Self(stored.to_owned())
    }
}

/// A key reads as the stored text it is, wherever the store takes one.
impl std::ops::Deref for SessionKey {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SessionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The session id a client knows, of a stored session key: what every
/// answer, event and prompt shows (see [`SessionKey`]).
pub fn client_session_id(stored: &str) -> &str {
    client_scope(stored)
}

/// Serialises a stored key (a session's, `{tenant}/{id}`, or a memory
/// scope's) as the id its tenant knows it by: a record the API answers
/// carries the client's id, whatever the store keyed it by. For
/// `#[serde(serialize_with = "…")]` on a record's key.
pub fn as_client_id<S: serde::Serializer>(stored: &str, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(client_scope(stored))
}

impl SessionKey {
    /// Serialises the key as the client's id (for `serialize_with`).
    pub fn as_client_id<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.id())
    }
}

/// The prefix of a client tool's name as the model sees it: no tool of the
/// service's has it, so a client's tool cannot shadow one.
pub const CLIENT_TOOL_PREFIX: &str = "client__";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_documented_alphabet() {
        let id = SessionId::parse("user-42:chat_7.a").unwrap();
        assert_eq!(id.as_str(), "user-42:chat_7.a");
        assert!(SessionId::parse(&"a".repeat(128)).is_ok());
    }

    #[test]
    fn refuses_empty_long_and_foreign_characters() {
        assert_eq!(SessionId::parse(""), Err(SessionIdError::Empty));
        assert_eq!(
            SessionId::parse(&"a".repeat(129)),
            Err(SessionIdError::TooLong)
        );
        for bad in ["a b", "a/b", "é", "a%2F", "a\n"] {
            assert_eq!(
                SessionId::parse(bad),
                Err(SessionIdError::BadCharacter),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn tenants_scopes_never_meet() {
        assert_eq!(tenant_scope(DEFAULT_TENANT, "user:ann"), "user:ann");
        assert_eq!(tenant_scope("acme", "user:ann"), "acme/user:ann");
        // A tenant named like a scope still cannot reach the default
        // tenant's scopes, nor another tenant's.
        assert_ne!(tenant_scope("user:ann", "session:x"), "user:ann");
        assert_ne!(
            tenant_scope("user", "user:ann"),
            tenant_scope(DEFAULT_TENANT, "user:ann")
        );
        assert_eq!(client_scope("acme/user:ann"), "user:ann");
        assert_eq!(client_scope("user:ann"), "user:ann");
    }

    #[test]
    fn a_session_key_is_its_tenants_alone() {
        let id = SessionId::parse("chat-1").unwrap();
        let default = SessionKey::new(DEFAULT_TENANT, &id);
        let acme = SessionKey::new("acme", &id);
        // The default tenant's sessions keep the keys they always had.
        assert_eq!(default.as_str(), "chat-1");
        assert_eq!(acme.as_str(), "acme/chat-1");
        assert_ne!(default, acme);
        assert_ne!(acme, SessionKey::new("acme2", &id));
        for key in [&default, &acme] {
            assert_eq!(key.id(), "chat-1");
        }
        assert_eq!(default.tenant(), DEFAULT_TENANT);
        assert_eq!(acme.tenant(), "acme");
        assert_eq!(client_session_id("acme/chat-1"), "chat-1");
    }
}
