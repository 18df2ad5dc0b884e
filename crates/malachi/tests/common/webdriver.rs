//! Just enough W3C WebDriver to walk the console as a person would: `chromedriver` drives a
//! headless Chromium, both from Debian's packages (`.ci/run` installs them). Every command is one
//! HTTP request to chromedriver over the tests' own HTTP client.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{Value, json};

use super::free_port;
use super::http;

/// The key under which WebDriver names an element (fixed by the W3C specification).
const ELEMENT_KEY: &str = "element-6066-11e4-a52e-4f735466cecf";
/// How long a wait for the page gives up after: the console polls every 2 s, and a loaded CI
/// machine starts Chromium slowly.
pub const WAIT: Duration = Duration::from_secs(30);
/// A laptop screen.
const WINDOW: &str = "--window-size=1440,900";

pub struct Browser {
    driver: Child,
    address: String,
    session: String,
    /// Where screenshots go.
    pub screenshots: PathBuf,
    _profile: tempfile::TempDir,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

fn binary(variable: &str, default: &str) -> String {
    std::env::var(variable).unwrap_or_else(|_| default.to_string())
}

impl Browser {
    /// Starts chromedriver and one headless Chromium session. `CHROMEDRIVER` and `CHROMIUM`
    /// name other binaries than Debian's.
    pub async fn start(screenshots: &Path) -> Browser {
        let port = free_port();
        let driver = Command::new(binary("CHROMEDRIVER", "chromedriver"))
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver is needed (Debian: apt-get install chromium chromium-driver)");
        let profile = tempfile::tempdir().unwrap();
        let mut browser = Browser {
            driver,
            address: format!("127.0.0.1:{port}"),
            session: String::new(),
            screenshots: screenshots.to_path_buf(),
            _profile: profile,
        };
        browser.wait_for_driver().await;
        let options = json!({
            "binary": binary("CHROMIUM", "/usr/bin/chromium"),
            "args": [
                "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--no-first-run", WINDOW,
                format!("--user-data-dir={}", browser._profile.path().display()),
            ],
        });
        let capabilities = json!({ "capabilities": { "alwaysMatch": {
            "browserName": "chrome", "goog:chromeOptions": options,
        }}});
        let created = browser.command("POST", "/session", Some(capabilities)).await;
        browser.session = created["sessionId"].as_str().expect("a session id").to_string();
        // Only this run's pictures: a stale failure.png would mislead.
        let _ = std::fs::remove_dir_all(&browser.screenshots);
        std::fs::create_dir_all(&browser.screenshots).unwrap();
        browser
    }

    async fn wait_for_driver(&self) {
        let deadline = Instant::now() + WAIT;
        while tokio::net::TcpStream::connect(&self.address).await.is_err() {
            assert!(Instant::now() < deadline, "chromedriver never listened on {}", self.address);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// One WebDriver command; its `value`, or the driver's error.
    async fn try_command(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, String> {
        let body = body.map(|body| body.to_string());
        let headers = [("content-type", "application/json; charset=utf-8")];
        let answer = http::call(&self.address, method, path, &headers, body.as_deref()).await;
        let mut body = answer.json();
        let value = body["value"].take();
        if answer.status == 200 {
            return Ok(value);
        }
        Err(format!("{method} {path}: {} {}", value["error"], value["message"]))
    }

    async fn command(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        self.try_command(method, path, body).await.unwrap_or_else(|error| panic!("{error}"))
    }

    fn at(&self, path: &str) -> String {
        format!("/session/{}{path}", self.session)
    }

    pub async fn goto(&self, url: &str) {
        self.command("POST", &self.at("/url"), Some(json!({ "url": url }))).await;
    }

    pub async fn url(&self) -> String {
        self.command("GET", &self.at("/url"), None).await.as_str().unwrap().to_string()
    }

    /// The elements `css` matches now.
    async fn find_all(&self, css: &str) -> Vec<String> {
        let query = json!({ "using": "css selector", "value": css });
        let found = self.command("POST", &self.at("/elements"), Some(query)).await;
        let found = found.as_array().expect("a list of elements");
        found.iter().map(|element| element[ELEMENT_KEY].as_str().unwrap().to_string()).collect()
    }

    pub async fn count(&self, css: &str) -> usize {
        self.find_all(css).await.len()
    }

    /// The first element `css` matches, waiting for the page to show it.
    async fn find(&self, css: &str) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(element) = self.find_all(css).await.into_iter().next() {
                return element;
            }
            self.fail_after(deadline, &format!("nothing matches {css}")).await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The rendered text of the first element `css` matches (empty if none does).
    pub async fn text(&self, css: &str) -> String {
        let Some(element) = self.find_all(css).await.into_iter().next() else {
            return String::new();
        };
        // The element may be replaced between the two commands: the console re-renders.
        let path = self.at(&format!("/element/{element}/text"));
        let text = self.try_command("GET", &path, None).await;
        text.ok().and_then(|text| text.as_str().map(str::to_string)).unwrap_or_default()
    }

    pub async fn type_into(&self, css: &str, text: &str) {
        let element = self.find(css).await;
        let keys = json!({ "text": text });
        self.command("POST", &self.at(&format!("/element/{element}/value")), Some(keys)).await;
    }

    /// Clicks the first element `css` matches, as a pointer would (WebDriver refuses a click
    /// another element would intercept). The console re-renders every 2 s, so an element found
    /// may be gone by the click: find it again.
    pub async fn click(&self, css: &str) {
        let deadline = Instant::now() + WAIT;
        loop {
            let element = self.find(css).await;
            let path = self.at(&format!("/element/{element}/click"));
            match self.try_command("POST", &path, Some(json!({}))).await {
                Ok(_) => return,
                Err(error) if error.contains("stale element") => {}
                Err(error) => panic!("clicking {css}: {error}"),
            }
            self.fail_after(deadline, &format!("{css} kept going stale")).await;
        }
    }

    /// Accepts the `confirm()` the page shows, waiting for it to open.
    pub async fn accept_dialog(&self) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Ok(text) = self.try_command("GET", &self.at("/alert/text"), None).await {
                self.command("POST", &self.at("/alert/accept"), Some(json!({}))).await;
                return text.as_str().unwrap_or_default().to_string();
            }
            self.fail_after(deadline, "no dialog opened").await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until the text of `css` satisfies `wanted`; the text it ended with.
    pub async fn wait_text(&self, css: &str, what: &str, wanted: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            let text = self.text(css).await;
            if wanted(&text) {
                return text;
            }
            self.fail_after(deadline, &format!("{css} never showed {what} (last: {text:?})")).await;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits until `css` matches exactly `wanted` elements.
    pub async fn wait_count(&self, css: &str, wanted: usize) {
        let deadline = Instant::now() + WAIT;
        loop {
            let count = self.count(css).await;
            if count == wanted {
                return;
            }
            let why = format!("{css} matched {count}, never {wanted}");
            self.fail_after(deadline, &why).await;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Saves what the browser shows as `<name>.png` in the screenshot folder.
    pub async fn screenshot(&self, name: &str) -> PathBuf {
        let encoded = self.command("GET", &self.at("/screenshot"), None).await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(encoded.as_str().expect("base64 text"))
            .expect("a base64 screenshot");
        assert!(png.starts_with(b"\x89PNG"), "a PNG");
        let path = self.screenshots.join(format!("{name}.png"));
        std::fs::write(&path, png).unwrap();
        path
    }

    /// Past `deadline`: saves what the page shows, for the person reading the failure, and fails.
    async fn fail_after(&self, deadline: Instant, why: &str) {
        if Instant::now() < deadline {
            return;
        }
        let shot = self.screenshot("failure").await;
        panic!("{why}; the page at {} is in {}", self.url().await, shot.display());
    }
}
