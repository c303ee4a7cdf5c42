//! Who may use the dashboard, and which requests are refused before any handler runs.
//!
//! * Every page but the login form and the style sheet needs the token: as `Authorization: Bearer
//!   TOKEN`, or through a session that the login form opens (a random id in an `HttpOnly`,
//!   `SameSite=Strict` cookie). The token is compared as SHA-256 digests in constant time, and
//!   never printed.
//! * A request whose `Host` is not the address the server listens on (or one `--allowed-host`
//!   names) is refused: a DNS-rebinding page cannot reach a dashboard bound to 127.0.0.1.
//! * Every `POST` is refused when the browser says it comes from another origin (`Origin`,
//!   `Sec-Fetch-Site`), and, when it rides on a session cookie, unless its form carries the
//!   session's CSRF token.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, header};
use sha2::{Digest as _, Sha256};

/// How long a session lasts after the login.
const SESSION_LIFETIME: Duration = Duration::from_secs(12 * 3600);
/// The session cookie's name.
pub const COOKIE: &str = "idempotent_session";

/// How a request was let in.
#[derive(Debug, Clone)]
pub enum Auth {
    /// `Authorization: Bearer TOKEN`: no cookie involved, so no CSRF token needed.
    Bearer,
    /// A session from the login form.
    Session {
        /// The session's CSRF token, for the forms of the page.
        csrf: String,
        /// A short, non-secret name of the session for the audit log.
        tag: String,
    },
}

impl Auth {
    /// The CSRF token to put in forms (none for bearer requests).
    pub fn csrf(&self) -> Option<&str> {
        match self {
            Auth::Bearer => None,
            Auth::Session { csrf, .. } => Some(csrf),
        }
    }

    /// Who did it, for the audit log.
    pub fn who(&self) -> String {
        match self {
            Auth::Bearer => "bearer token".to_owned(),
            Auth::Session { tag, .. } => format!("session {tag}"),
        }
    }
}

/// One logged-in browser.
struct Session {
    csrf: String,
    tag: String,
    since: Instant,
}

/// The token's digest and the open sessions.
pub struct Gate {
    token: [u8; 32],
    sessions: Mutex<HashMap<[u8; 32], Session>>,
}

impl Gate {
    /// A gate for this token.
    pub fn new(token: &str) -> Self {
        Self {
            token: Sha256::digest(token.as_bytes()).into(),
            sessions: Mutex::new(HashMap::new()),
        }
    }

    /// Whether `candidate` is the token, in time that does not depend on where they differ.
    pub fn is_token(&self, candidate: &str) -> bool {
        let digest: [u8; 32] = Sha256::digest(candidate.as_bytes()).into();
        constant_time_eq(&digest, &self.token)
    }

    /// Opens a session; returns the cookie's value.
    pub fn open_session(&self) -> Result<String, getrandom::Error> {
        let id = random_hex()?;
        let session = Session {
            csrf: random_hex()?,
            tag: id[..8].to_owned(),
            since: Instant::now(),
        };
        let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        sessions.retain(|_, s| s.since.elapsed() < SESSION_LIFETIME);
        sessions.insert(Sha256::digest(id.as_bytes()).into(), session);
        Ok(id)
    }

    /// Closes the session with this cookie value.
    pub fn close_session(&self, id: &str) {
        let key: [u8; 32] = Sha256::digest(id.as_bytes()).into();
        let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        sessions.remove(&key);
    }

    /// How the request is authenticated, if it is.
    pub fn authenticate(&self, headers: &HeaderMap) -> Option<Auth> {
        self.admit(headers).ok()
    }

    /// How the request is authenticated, or why it is not (for the audit log).
    pub fn admit(&self, headers: &HeaderMap) -> Result<Auth, Denied> {
        // Another scheme (a proxy's `Basic`) is not the dashboard's: the session decides.
        if let Some(token) = bearer(headers) {
            return match self.is_token(token) {
                true => Ok(Auth::Bearer),
                false => Err(Denied::WrongToken),
            };
        }
        let id = cookie(headers, COOKIE).ok_or(Denied::NoToken)?;
        let key: [u8; 32] = Sha256::digest(id.as_bytes()).into();
        let sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        let session = sessions.get(&key).ok_or(Denied::UnknownSession)?;
        if session.since.elapsed() >= SESSION_LIFETIME {
            return Err(Denied::UnknownSession);
        }
        Ok(Auth::Session {
            csrf: session.csrf.clone(),
            tag: session.tag.clone(),
        })
    }
}

/// Why a request is not let in: what the audit log says of it (never the token it carried).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denied {
    /// No `Authorization` header and no session cookie.
    NoToken,
    /// `Authorization: Bearer` with a token that is not the dashboard's.
    WrongToken,
    /// A session cookie of no open session: unknown, closed, or older than 12 hours.
    UnknownSession,
}

impl Denied {
    /// The reason, for the audit log.
    pub fn reason(self) -> &'static str {
        match self {
            Denied::NoToken => "no token (no bearer token, no session cookie)",
            Denied::WrongToken => "a wrong bearer token",
            Denied::UnknownSession => "an unknown or expired session cookie",
        }
    }
}

/// The token of an `Authorization: Bearer` header.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then_some(token.trim())
}

/// A cookie's value.
pub fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(n, _)| *n == name)
        .map(|(_, v)| v)
}

/// Whether two byte strings are equal, looking at every byte whatever the first difference.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// 32 random bytes from the operating system, in hex.
pub(crate) fn random_hex() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Why a request from a browser is refused as coming from another origin, if it is: `Origin`
/// must be this server's (`http://HOST` or, behind a TLS proxy, `https://HOST`), and
/// `Sec-Fetch-Site`, when the browser sends it, `same-origin` or `none`.
pub fn cross_origin(headers: &HeaderMap) -> Option<String> {
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or_default();
    if let Some(site) = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok())
        && !matches!(site, "same-origin" | "none")
    {
        return Some(format!("the browser sent it from another site ({site})"));
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or_default();
        if origin != format!("http://{host}") && origin != format!("https://{host}") {
            return Some("it comes from a page of another origin".to_owned());
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn tokens_and_sessions() {
        let gate = Gate::new("a-long-enough-token");
        assert!(gate.is_token("a-long-enough-token"));
        assert!(!gate.is_token("a-long-enough-tokem"));
        let mut headers = HeaderMap::new();
        assert!(gate.authenticate(&headers).is_none());
        headers.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer a-long-enough-token"),
        );
        assert!(matches!(gate.authenticate(&headers), Some(Auth::Bearer)));
        let id = gate.open_session().expect("randomness");
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            HeaderValue::from_str(&format!("a=b; {COOKIE}={id}")).expect("a header"),
        );
        assert!(matches!(
            gate.authenticate(&headers),
            Some(Auth::Session { .. })
        ));
        gate.close_session(&id);
        assert!(gate.authenticate(&headers).is_none());
    }

    #[test]
    fn other_origins_are_told() {
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, HeaderValue::from_static("127.0.0.1:8080"));
        assert_eq!(cross_origin(&headers), None);
        headers.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://127.0.0.1:8080"),
        );
        headers.insert("sec-fetch-site", HeaderValue::from_static("same-origin"));
        assert_eq!(cross_origin(&headers), None);
        headers.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://127.0.0.1:9999"),
        );
        assert!(cross_origin(&headers).is_some());
        headers.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://127.0.0.1:8080"),
        );
        headers.insert("sec-fetch-site", HeaderValue::from_static("same-site"));
        assert!(cross_origin(&headers).is_some());
    }
}
