//! Standard Webhooks signatures (the scheme OpenAI's webhooks use, and
//! the `openai` SDK's `webhooks.unwrap` checks): a secret is `whsec_` and
//! a key, base64; a message's signature is `v1,` and the base64 of
//! HMAC-SHA256, under the key, of `{webhook-id}.{webhook-timestamp}.{body}`.

use base64::{Engine, engine::general_purpose::STANDARD};
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

const PREFIX: &str = "whsec_";
/// Bytes a secret's key holds at least.
const KEY_MIN: usize = 24;

/// The key of a secret, if it is one.
fn key(secret: &str) -> Option<Vec<u8>> {
    let key = STANDARD.decode(secret.strip_prefix(PREFIX)?).ok()?;
    (key.len() >= KEY_MIN).then_some(key)
}

/// Whether `secret` is `whsec_` and at least 24 bytes, base64.
pub fn secret_is_valid(secret: &str) -> bool {
    key(secret).is_some()
}

/// A new secret: 32 random bytes (the thread's CSPRNG).
pub fn new_secret() -> String {
    let mut bytes = [0u8; 32];
    rand::fill(&mut bytes);
    format!("{PREFIX}{}", STANDARD.encode(bytes))
}

/// HMAC-SHA256 (RFC 2104) of the parts of `message`, in order.
fn hmac(key: &[u8], message: &[&[u8]]) -> [u8; 32] {
    // Any key length is valid for HMAC: the error cannot happen.
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(key) else {
        return [0; 32];
    };
    for part in message {
        mac.update(part);
    }
    mac.finalize().into_bytes().into()
}

/// The `webhook-signature` of a message; `None`: not a secret.
pub fn sign(secret: &str, id: &str, timestamp: i64, body: &[u8]) -> Option<String> {
    let key = key(secret)?;
    let timestamp = timestamp.to_string();
    let mac = hmac(
        &key,
        &[id.as_bytes(), b".", timestamp.as_bytes(), b".", body],
    );
    Some(format!("v1,{}", STANDARD.encode(mac)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_matches_rfc_4231() {
        // Test case 2 of RFC 4231.
        let mac = hmac(b"Jefe", &[b"what do ya want ", b"for nothing?"]);
        assert_eq!(
            hex::encode(mac),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        // Test case 6: a key longer than the block.
        let mac = hmac(
            &[0xaa; 131],
            &[b"Test Using Larger Than Block-Size Key - Hash Key First"],
        );
        assert_eq!(
            hex::encode(mac),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }

    #[test]
    fn a_message_is_signed_as_standard_webhooks_says() {
        // The example of the Standard Webhooks specification.
        let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
        let body = br#"{"test": 2432232314}"#;
        assert_eq!(
            sign(secret, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body).as_deref(),
            Some("v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=")
        );
        assert!(sign("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "m", 1, b"").is_none());
        assert!(!secret_is_valid("whsec_c2hvcnQ="), "too short a key");
        assert!(secret_is_valid(&new_secret()));
        assert_ne!(new_secret(), new_secret());
    }
}
