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
}
