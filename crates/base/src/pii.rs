//! Masking personal data and secrets in text written for observation
//! (logs, spans, decision records, research observations, judge payloads
//! and judgements) when `HARNESS_REDACT_LOGS` is on. The conversation's
//! history, which the next turn needs, is never masked.
//!
//! What is masked, each replaced by `[redacted]`:
//! - e-mail addresses (`name@host.tld`);
//! - card numbers: 13 to 19 digits, in groups split by spaces or dashes,
//!   that pass the Luhn check;
//! - phone numbers: `+` and 8 to 15 digits (spaces, dashes, dots and
//!   parentheses between them), or the North American `(555) 123-4567`,
//!   `555-123-4567` and `555.123.4567`;
//! - any other run of 9 or more digits standing alone (account numbers);
//! - secrets by their shape: `sk-…`/`sk_…` keys (OpenAI, Anthropic,
//!   Stripe), `pk_`/`rk_` live and test keys, AWS access key ids
//!   (`AKIA…`), GitHub tokens (`ghp_…`, `gho_…`, `ghs_…`, `ghu_…`,
//!   `ghr_…`, `github_pat_…`), Slack tokens (`xox?-…`), Google API keys
//!   (`AIza…`), JSON Web Tokens (`eyJ….….…`), and the token of a
//!   `Bearer` header.
//!
//! Dates, times, UUIDs and hashes are left as they are: their digit runs
//! are short or joined to letters.

use std::{borrow::Cow, sync::LazyLock};

use regex::{Captures, Regex};

/// What a masked span becomes.
pub const MASK: &str = "[redacted]";

/// Every pattern, tried left to right in one pass; the `card` group is
/// masked only when its digits pass the Luhn check.
static PATTERNS: LazyLock<Option<Regex>> = LazyLock::new(|| {
    Regex::new(concat!(
        // Secrets by shape.
        r"(?P<secret>\b(?:sk|rk|pk)[-_][A-Za-z0-9_-]{8,}",
        r"|\bAKIA[0-9A-Z]{16}\b",
        r"|\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})",
        r"|\bxox[abprs]-[A-Za-z0-9-]{10,}",
        r"|\bAIza[0-9A-Za-z_-]{30,}",
        r"|\beyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}",
        r"|(?i:bearer)\s+[A-Za-z0-9._~+/=-]{16,})",
        // E-mail addresses.
        r"|(?P<email>[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,})",
        // Cards: 13-19 digits in groups (checked by Luhn below).
        r"|(?P<card>\b\d(?:[ -]?\d){12,18}\b)",
        // Phones.
        r"|(?P<phone>\+\d(?:[\s().-]*\d){7,14}\b",
        r"|(?:\(\d{3}\)\s?|\b\d{3}[.-])\d{3}[.-]\d{4}\b)",
        // Other long runs of digits.
        r"|(?P<digits>\b\d{9,}\b)",
    ))
    .ok()
});

/// `text` with every match of the patterns above masked.
pub fn redact(text: &str) -> Cow<'_, str> {
    let Some(patterns) = PATTERNS.as_ref() else {
        // The patterns are fixed; a build whose regex refused them masks
        // everything rather than nothing.
        return Cow::Borrowed(MASK);
    };
    patterns.replace_all(text, |caps: &Captures<'_>| match caps.name("card") {
        Some(card) if !luhn(card.as_str()) => {
            // Not a card: a long run of digits is still masked.
            let digits = card.as_str().chars().filter(char::is_ascii_digit).count();
            let plain = card.as_str().chars().all(|c| c.is_ascii_digit());
            if plain && digits >= 9 {
                MASK.to_owned()
            } else {
                card.as_str().to_owned()
            }
        }
        _ => MASK.to_owned(),
    })
}

/// `text` masked when `on` (`HARNESS_REDACT_LOGS`), else as it is.
pub fn redact_if(on: bool, text: &str) -> String {
    if on {
        redact(text).into_owned()
    } else {
        text.to_owned()
    }
}

/// Whether the digits of `number` pass the Luhn check.
fn luhn(number: &str) -> bool {
    let mut sum = 0;
    for (i, digit) in number
        .chars()
        .rev()
        .filter_map(|c| c.to_digit(10))
        .enumerate()
    {
        sum += if i % 2 == 1 {
            let doubled = digit * 2;
            if doubled > 9 { doubled - 9 } else { doubled }
        } else {
            digit
        };
    }
    sum % 10 == 0
}

/// Masks every string in `value` (keys kept).
pub fn redact_json(value: &mut serde_json::Value) {
    use serde_json::Value;
    match value {
        Value::String(text) => {
            if let Cow::Owned(masked) = redact(text) {
                *text = masked;
            }
        }
        Value::Array(items) => items.iter_mut().for_each(redact_json),
        Value::Object(fields) => fields.values_mut().for_each(redact_json),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn personal_data_and_secrets_are_masked() {
        for (text, masked) in [
            ("mail bob.smith+x@example.co.uk now", "mail [redacted] now"),
            ("card 4111 1111 1111 1111.", "card [redacted]."),
            ("card 4111-1111-1111-1111", "card [redacted]"),
            ("card 4111111111111111", "card [redacted]"),
            ("call +1 (555) 123-4567 today", "call [redacted] today"),
            ("call +44 20 7946 0958", "call [redacted]"),
            (
                "call (555) 123-4567 or 555.123.4567",
                "call [redacted] or [redacted]",
            ),
            ("account 123456789012", "account [redacted]"),
            ("key sk-proj-abcDEF123456789", "key [redacted]"),
            ("key sk_live_51Habcdefgh", "key [redacted]"),
            ("aws AKIAIOSFODNN7EXAMPLE", "aws [redacted]"),
            ("gh ghp_0123456789abcdefghijABCDEFGHIJ", "gh [redacted]"),
            ("slack xoxb-1234567890-abcdef", "slack [redacted]"),
            (
                "google AIzaSyA1234567890abcdefghijklmnopqrstu",
                "google [redacted]",
            ),
            ("jwt eyJhbGciOi.eyJzdWIiOi.SflKxwRJSM", "jwt [redacted]"),
            (
                "Authorization: Bearer abcdefghijklmnop1234",
                "Authorization: [redacted]",
            ),
        ] {
            assert_eq!(redact(text), masked, "{text}");
        }
    }

    #[test]
    fn dates_ids_hashes_and_short_numbers_are_kept() {
        for text in [
            "2026-11-24T16:05:51.123456Z",
            "turn 01a20e2f-628f-75a4-9a5f-9174c223c10e ended",
            "hash 1234567890abcdef",
            "port 5432 and 127.0.0.1:8080",
            "555-12! ok",
            "card-like 4111 1111 1111 1112 fails Luhn",
            "{\"seq\":12,\"elapsed_ms\":340}",
        ] {
            assert_eq!(redact(text), text, "{text}");
        }
    }

    #[test]
    fn json_strings_are_masked_in_place() {
        let mut value = serde_json::json!({
            "user_text": "I am bob@example.com",
            "nested": [{"note": "call +1 555 123 4567"}],
            "count": 4111111111111111u64,
        });
        redact_json(&mut value);
        assert_eq!(
            value,
            serde_json::json!({
                "user_text": "I am [redacted]",
                "nested": [{"note": "call [redacted]"}],
                "count": 4111111111111111u64,
            })
        );
    }
}
