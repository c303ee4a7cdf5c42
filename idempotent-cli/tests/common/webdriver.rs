//! A headless Chromium driven through chromedriver's W3C WebDriver protocol, and a plain HTTP/1.1
//! client for requests a browser would not send.
//!
//! The dozen WebDriver commands used here are JSON over HTTP; the crates that wrap them pull in a
//! web server framework and ICU data of their own, so this file speaks the protocol itself.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// What a missing browser is told.
const INSTALL: &str = "the dashboard's browser tests need Chromium and its WebDriver: install the \
Debian packages `chromium` and `chromium-driver` (apt-get install chromium chromium-driver; \
scripts/test installs them)";

/// The key W3C WebDriver names an element by.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// A response.
#[derive(Debug)]
pub struct HttpResponse {
    /// The status code.
    pub status: u16,
    /// Header lines, names in lower case.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: String,
}

impl HttpResponse {
    /// A header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Sends one request to `addr` (`host:port`) and reads the whole response.
pub fn http(
    method: &str,
    addr: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> HttpResponse {
    let mut stream =
        TcpStream::connect(addr).unwrap_or_else(|e| panic!("connecting to {addr}: {e}"));
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .expect("a read timeout");
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if !headers
        .iter()
        .any(|(name, _)| name.eq_ignore_ascii_case("host"))
    {
        request.push_str(&format!("Host: {addr}\r\n"));
    }
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(body);
    stream
        .write_all(request.as_bytes())
        .expect("sending a request");
    let raw = read_response(&mut stream);
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, rest) = text
        .split_once("\r\n\r\n")
        .expect("a response with headers");
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .expect("a status line");
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let chunked = headers
        .iter()
        .any(|(n, v)| n == "transfer-encoding" && v.contains("chunked"));
    let body = if chunked {
        dechunk(rest)
    } else {
        rest.to_owned()
    };
    HttpResponse {
        status,
        headers,
        body,
    }
}

/// The bytes of one response: up to its Content-Length, the end of its chunks, or the end of the
/// stream (a server may keep the connection open whatever the request said).
fn read_response(stream: &mut TcpStream) -> Vec<u8> {
    let mut raw = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        if let Some(end) = find(&raw, b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
            let length = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|n| n.trim().parse::<usize>().ok());
            let complete = match length {
                Some(n) => raw.len() >= end + 4 + n,
                None if head.contains("chunked") => raw.ends_with(b"0\r\n\r\n"),
                None => false,
            };
            if complete {
                return raw;
            }
        }
        match stream.read(&mut buf) {
            Ok(0) => return raw,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            Err(e) => panic!("reading a response: {e}"),
        }
    }
}

/// Where `needle` first occurs in `haystack`.
fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// A chunked body, joined.
fn dechunk(mut rest: &str) -> String {
    let mut out = String::new();
    while let Some((size, after)) = rest.split_once("\r\n") {
        let size = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if size == 0 || after.len() < size {
            break;
        }
        out.push_str(&after[..size]);
        rest = after[size..].trim_start_matches("\r\n");
    }
    out
}

/// A free port on the loopback interface.
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("binding a port");
    listener.local_addr().expect("an address").port()
}

/// A file on the search path, or at one of the usual places.
fn find_program(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    for name in names {
        for dir in std::env::split_paths(&path).chain([
            PathBuf::from("/usr/bin"),
            PathBuf::from("/usr/lib/chromium"),
        ]) {
            let candidate = dir.join(name);
            if candidate.is_file() {
                return Some(candidate);
            }
        }
    }
    None
}

/// A headless Chromium under chromedriver, with a profile of its own.
pub struct Browser {
    driver: Child,
    addr: String,
    session: String,
    profile: PathBuf,
}

impl Browser {
    /// Starts chromedriver and a browser window of `width` x `height`; fails, naming the Debian
    /// packages, when either is not installed.
    pub fn start(width: u32, height: u32) -> Self {
        let driver_path =
            find_program(&["chromedriver"]).unwrap_or_else(|| panic!("no chromedriver: {INSTALL}"));
        let chromium = find_program(&["chromium", "chromium-browser"])
            .unwrap_or_else(|| panic!("no chromium: {INSTALL}"));
        let port = free_port();
        let driver = Command::new(&driver_path)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}; {INSTALL}", driver_path.display()));
        let addr = format!("127.0.0.1:{port}");
        let profile = std::env::temp_dir().join(format!("{}-chromium", super::unique_name()));
        let mut browser = Self {
            driver,
            addr,
            session: String::new(),
            profile,
        };
        browser.wait_ready();
        let args = [
            "--headless".to_owned(),
            "--no-sandbox".to_owned(),
            "--disable-gpu".to_owned(),
            "--disable-quic".to_owned(),
            "--no-first-run".to_owned(),
            "--disable-background-networking".to_owned(),
            "--disable-component-update".to_owned(),
            "--disable-sync".to_owned(),
            "--disable-dev-shm-usage".to_owned(),
            format!("--window-size={width},{height}"),
            format!("--user-data-dir={}", browser.profile.display()),
        ];
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": chromium.to_string_lossy(), "args": args}
        }}});
        let created = browser.call("POST", "/session", &capabilities);
        browser.session = created["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("chromedriver created no session: {created}"))
            .to_owned();
        browser
    }

    /// Waits for chromedriver to answer.
    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if TcpStream::connect(&self.addr).is_ok() {
                let status = self.call("GET", "/status", &Value::Null);
                if status["ready"] == true {
                    return;
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "chromedriver did not come up on {} within 30 s; {INSTALL}",
            self.addr
        );
    }

    /// One WebDriver command: its `value`, or a panic with the driver's error.
    fn call(&self, method: &str, path: &str, body: &Value) -> Value {
        self.try_call(method, path, body)
            .unwrap_or_else(|error| panic!("WebDriver {method} {path} failed: {error}"))
    }

    /// One WebDriver command: its `value`, or the driver's error.
    fn try_call(&self, method: &str, path: &str, body: &Value) -> Result<Value, Value> {
        let text = if body.is_null() {
            String::new()
        } else {
            body.to_string()
        };
        let response = http(
            method,
            &self.addr,
            path,
            &[("Content-Type", "application/json")],
            &text,
        );
        let value: Value = serde_json::from_str(&response.body).unwrap_or_else(|e| {
            panic!("chromedriver's answer to {method} {path} is not JSON ({e}): {response:?}")
        });
        if response.status >= 400 {
            return Err(value["value"].clone());
        }
        Ok(value["value"].clone())
    }

    /// Waits until the page that a click or a redirect started has loaded.
    fn settle(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            let state = self.try_call(
                "POST",
                &format!("/session/{}/execute/sync", self.session),
                &json!({"script": "return document.readyState;", "args": []}),
            );
            if state.is_ok_and(|s| s == "complete") {
                return;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// A command on this session.
    fn session_call(&self, method: &str, path: &str, body: &Value) -> Value {
        self.call(method, &format!("/session/{}{path}", self.session), body)
    }

    /// Loads a page.
    pub fn goto(&self, url: &str) {
        self.session_call("POST", "/url", &json!({ "url": url }));
        self.settle();
    }

    /// The page's URL.
    pub fn url(&self) -> String {
        self.session_call("GET", "/url", &Value::Null)
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// The page's HTML.
    pub fn source(&self) -> String {
        self.session_call("GET", "/source", &Value::Null)
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// The element the CSS selector finds first. A click's navigation may not have begun when
    /// `settle` saw the old page complete, and between the old page and the new one there is no
    /// element at all (not even `body`): a selector that finds nothing is tried again, as the
    /// page loads, for up to 15 s.
    fn find(&self, css: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            match self.try_call(
                "POST",
                &format!("/session/{}/element", self.session),
                &json!({"using": "css selector", "value": css}),
            ) {
                Ok(found) => {
                    return found[ELEMENT]
                        .as_str()
                        .unwrap_or_else(|| panic!("no element {css} on {}", self.url()))
                        .to_owned();
                }
                Err(error) if error["error"] == "no such element" && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50));
                    self.settle();
                }
                Err(error) => panic!("finding {css} on {}: {error}", self.url()),
            }
        }
    }

    /// Whether the CSS selector finds anything.
    pub fn has(&self, css: &str) -> bool {
        let found = self.session_call(
            "POST",
            "/elements",
            &json!({"using": "css selector", "value": css}),
        );
        found.as_array().is_some_and(|a| !a.is_empty())
    }

    /// Types `text` into a field, after clearing it.
    pub fn fill(&self, css: &str, text: &str) {
        let id = self.find(css);
        self.session_call("POST", &format!("/element/{id}/clear"), &json!({}));
        self.session_call(
            "POST",
            &format!("/element/{id}/value"),
            &json!({ "text": text }),
        );
    }

    /// Clicks an element (a button submits its form), and waits for the next page to load.
    /// The page is marked before the click, and the wait lasts until a page without the mark
    /// has loaded: `settle` alone may see the old page still complete, before the navigation the
    /// click started has begun (at most 10 s, for a click that loads nothing).
    pub fn click(&self, css: &str) {
        let id = self.find(css);
        self.script("window.__before_click = true; return null;");
        self.session_call("POST", &format!("/element/{id}/click"), &json!({}));
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            let marked = self.try_call(
                "POST",
                &format!("/session/{}/execute/sync", self.session),
                &json!({"script": "return window.__before_click === true;", "args": []}),
            );
            if marked.is_ok_and(|m| m == false) {
                break;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        self.settle();
    }

    /// An element's visible text; found again when the page changed under it.
    pub fn text(&self, css: &str) -> String {
        for _ in 0..100 {
            let id = self.find(css);
            match self.try_call(
                "GET",
                &format!("/session/{}/element/{id}/text", self.session),
                &Value::Null,
            ) {
                Ok(text) => return text.as_str().unwrap_or_default().to_owned(),
                Err(error) if error["error"] == "stale element reference" => {
                    self.settle();
                }
                Err(error) => panic!("reading the text of {css}: {error}"),
            }
        }
        panic!("{css} kept going stale on {}", self.url());
    }

    /// The visible text of the page.
    pub fn page_text(&self) -> String {
        self.text("body")
    }

    /// Runs a script in the page and returns its result.
    pub fn script(&self, script: &str) -> Value {
        self.session_call(
            "POST",
            "/execute/sync",
            &json!({"script": script, "args": []}),
        )
    }

    /// A cookie's value.
    pub fn cookie(&self, name: &str) -> Option<String> {
        let cookies = self.session_call("GET", "/cookie", &Value::Null);
        cookies
            .as_array()?
            .iter()
            .find(|c| c["name"] == name)
            .and_then(|c| c["value"].as_str())
            .map(str::to_owned)
    }

    /// Forgets every cookie.
    pub fn delete_cookies(&self) {
        self.session_call("DELETE", "/cookie", &Value::Null);
    }

    /// Resizes the window.
    pub fn resize(&self, width: u32, height: u32) {
        self.session_call(
            "POST",
            "/window/rect",
            &json!({"width": width, "height": height}),
        );
    }

    /// Saves a PNG screenshot of the viewport.
    pub fn screenshot(&self, path: &Path) {
        let encoded = self.session_call("GET", "/screenshot", &Value::Null);
        let png = base64_decode(encoded.as_str().unwrap_or_default());
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).expect("creating the screenshot directory");
        }
        std::fs::write(path, png).expect("writing a screenshot");
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.call(
                    "DELETE",
                    &format!("/session/{}", self.session),
                    &Value::Null,
                )
            }));
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

/// Standard base64 (screenshots), padding and whitespace ignored.
fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    };
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0);
    for v in text.bytes().filter_map(value) {
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    out
}

#[test]
fn base64_decodes() {
    assert_eq!(base64_decode("aGVsbG8gd29ybGQ="), b"hello world");
}
