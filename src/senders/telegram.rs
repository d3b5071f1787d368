//! Telegram: `X-Telegram-Bot-Api-Secret-Token` equals the `secret_token` given to
//! setWebhook (1-256 of `A-Za-z0-9_-`). No HMAC, no timestamp.

use super::{Delivery, Rejection, ct_eq};
use crate::secret::Secret;

pub(crate) fn check_token(secret: &Secret) -> Result<(), String> {
    let s = secret.expose();
    if (1..=256).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') {
        Ok(())
    } else {
        Err("must be Telegram's secret_token: 1-256 characters of A-Z, a-z, 0-9, _ and -".to_owned())
    }
}

pub(crate) fn verify(secret: &Secret, d: &Delivery<'_>) -> Result<(), Rejection> {
    let token = d.header("x-telegram-bot-api-secret-token")?;
    if ct_eq(token.as_bytes(), secret.expose().as_bytes()) {
        Ok(())
    } else {
        Err(Rejection::Mismatch("X-Telegram-Bot-Api-Secret-Token"))
    }
}
