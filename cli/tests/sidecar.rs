//! The sidecar sheds what it should (DESIGN.md invariant 7; issue 11, items 8 and 9): idle connections and slow
//! headers are cut, open connections stay under the open-file limit, a client that hangs up while it waits gives
//! its slot back, an oversized body is refused before it is sent, and a SIGHUP reload parses off the request path.
//! Each test runs the real `tokenlease serve` process and talks to it over raw TCP.

#[path = "../../tests/common/mod.rs"]
mod common;
mod serve;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

use serve::Serve;

/// Longest a test waits for an answer it expects; a guard against hanging, never a measure of speed.
const PATIENCE: Duration = Duration::from_secs(60);

/// A `tokenlease serve` process on a free loopback port, SIGKILLed on drop.
struct Sidecar {
    serve: Serve,
    port: u16,
}

impl Sidecar {
    /// Starts the sidecar on `config`, its command line behind `wrapper` (e.g. `prlimit --nofile=256`), with
    /// `env` set, and waits for it to answer `/healthz`.
    fn start(config: &str, wrapper: &[&str], env: &[(&str, &str)]) -> Self {
        let port = common::free_port();
        Self::start_on(config, (wrapper, env), (port, Some(port)))
    }

    /// As [`Sidecar::start`], waiting for it on `port`, with `--listen` on `flag` (none: the config's address).
    fn start_on(config: &str, (wrapper, env): (&[&str], &[(&str, &str)]), (port, flag): (u16, Option<u16>)) -> Self {
        let serve = Serve::spawn(config, wrapper, |c| {
            if let Some(flag) = flag {
                c.args(["--listen", &format!("127.0.0.1:{flag}")]);
            }
            c.envs(env.iter().copied());
        });
        let sidecar = Self { serve, port };
        let up = common::wait_for(Duration::from_secs(20), || {
            sidecar.try_get("/healthz").filter(|(status, _)| *status == 200)
        });
        assert!(up.is_some(), "the sidecar did not answer: {}", sidecar.log());
        sidecar
    }

    fn connect(&self) -> TcpStream {
        let stream = TcpStream::connect(("127.0.0.1", self.port)).expect("connect");
        stream.set_read_timeout(Some(PATIENCE)).expect("read timeout");
        stream
    }

    /// Sends `raw` (which must close the connection after its answer) and returns the status and body.
    fn exchange(&self, raw: &str) -> Option<(u16, String)> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        stream.set_read_timeout(Some(PATIENCE)).ok()?;
        stream.write_all(raw.as_bytes()).ok()?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).ok()?;
        let status = answer.split(' ').nth(1)?.parse().ok()?;
        let body = answer.split_once("\r\n\r\n").map(|(_, b)| b.to_owned())?;
        Some((status, body))
    }

    fn try_get(&self, path: &str) -> Option<(u16, String)> {
        self.exchange(&format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"))
    }

    fn post(&self, path: &str, body: &str) -> (u16, serde_json::Value) {
        let (status, body) = self
            .exchange(&post_request(path, body, "Connection: close\r\n"))
            .unwrap_or_else(|| panic!("no answer to {path}: {}", self.log()));
        let json = serde_json::from_str(&body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"));
        (status, json)
    }

    fn log(&self) -> String {
        self.serve.log()
    }
}

fn post_request(path: &str, body: &str, headers: &str) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{headers}\r\n{body}",
        body.len()
    )
}

/// Whether the server closed `stream`: a read that ends (EOF or reset) rather than times out.
fn closed_by_server(stream: &mut TcpStream) -> bool {
    let mut rest = Vec::new();
    match stream.read_to_end(&mut rest) {
        Ok(_) => true,
        Err(e) => !matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
    }
}

const LIKE: &str = "[[rule]]\nname = \"like\"\nalgorithm = \"fixed_window\"\nlimit = 1000\nwindow = \"60s\"\n";

#[test]
fn idle_connections_beyond_the_open_file_limit_do_not_keep_the_sidecar_from_answering() {
    let config = format!("[serve]\nidle_timeout = \"1s\"\nheader_read_timeout = \"1s\"\n\n{LIKE}");
    let serve = Sidecar::start(&config, &["prlimit", "--nofile=256:256", "--"], &[]);
    // The bound on connections follows the open-file limit, less what Redis and the config file need.
    assert!(serve.log().contains("at most 192 connections"), "{}", serve.log());

    // 400 connections that send nothing: more than the process may open; the rest wait in the listen backlog.
    let mut idle: Vec<TcpStream> = (0..400).map(|_| serve.connect()).collect();
    // Answered once the idle ones are cut (1 s each round), however many rounds the backlog takes.
    let health = serve.try_get("/livez");
    assert_eq!(health.map(|(status, _)| status), Some(200), "{}", serve.log());
    for stream in &mut idle {
        assert!(closed_by_server(stream), "an idle connection stayed open");
    }

    // A kept-alive connection is cut too once it has waited that long for its next request.
    let mut kept = serve.connect();
    kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .expect("write");
    let mut first = [0u8; 12];
    kept.read_exact(&mut first).expect("an answer");
    assert_eq!(&first, b"HTTP/1.1 200");
    assert!(closed_by_server(&mut kept), "a kept-alive connection stayed open");
}

#[test]
fn a_client_sending_its_headers_slowly_is_cut_after_the_header_timeout() {
    // idle_timeout ≤ header_read_timeout; the first bytes come at once, so only the header timeout applies.
    let config = format!("[serve]\nidle_timeout = \"1s\"\nheader_read_timeout = \"2s\"\n\n{LIKE}");
    let serve = Sidecar::start(&config, &[], &[]);
    let mut slow = serve.connect();
    slow.write_all(b"GET /healthz HTTP/1.1\r\nX-Slow: ").expect("write");
    // One byte every 100 ms, for at most a minute (the guard): the server must close the connection first.
    let cut = (0..600).any(|_| {
        std::thread::sleep(Duration::from_millis(100)); // real time: the sidecar process's header timeout
        slow.write_all(b"a").is_err()
    });
    assert!(cut, "a client sending a header byte every 100 ms was kept for a minute");
    // The sidecar still answers others.
    assert_eq!(serve.try_get("/healthz").map(|(s, _)| s), Some(200));
}

#[test]
fn an_oversized_body_announced_with_expect_100_continue_is_refused_before_it_is_sent() {
    let serve = Sidecar::start(LIKE, &[], &[]);
    // The limit the README states: 16 KiB plus [process] max_key_bytes (512 by default).
    let limit = 16 * 1024 + 512;
    let head = |length: usize| {
        format!(
            "POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nExpect: 100-continue\r\n\
             Content-Length: {length}\r\nConnection: close\r\n\r\n"
        )
    };
    let status_line = |stream: &mut TcpStream| {
        let mut line = [0u8; 12];
        stream.read_exact(&mut line).expect("a status line");
        String::from_utf8_lossy(&line).into_owned()
    };

    // Over the limit: 413 at once, without asking for (or reading) the body.
    let mut over = serve.connect();
    over.write_all(head(limit + 1).as_bytes()).expect("write");
    assert_eq!(status_line(&mut over), "HTTP/1.1 413");
    let mut huge = serve.connect();
    huge.write_all(head(1 << 30).as_bytes()).expect("write");
    assert_eq!(status_line(&mut huge), "HTTP/1.1 413");

    // At the limit: 100 Continue, then the body (a JSON object padded with spaces) is read and decided.
    let mut at = serve.connect();
    at.write_all(head(limit).as_bytes()).expect("write");
    assert_eq!(status_line(&mut at), "HTTP/1.1 100");
    let json = r#"{"rule": "like", "key": "u"}"#;
    let body = format!("{json}{}", " ".repeat(limit - json.len()));
    at.write_all(body.as_bytes()).expect("write the body");
    let mut answer = String::new();
    at.read_to_string(&mut answer).expect("the answer");
    assert!(answer.contains("HTTP/1.1 200"), "{answer}");
}

/// The pacing of the rule `nightly` below: one job an hour, far longer than the test waits, so that a slot kept
/// by a client that left shows as more than an hour to wait, however long the test takes.
const PACE_MS: u64 = 3_600_000;

/// The `retry_after_ms` a `check` (never waits) of the paced rule gets: when its next free slot comes.
fn next_slot_ms(serve: &Sidecar) -> u64 {
    let (status, json) = serve.post("/v1/check", r#"{"rule": "nightly", "key": "db"}"#);
    assert_eq!(status, 429, "{json}");
    json["retry_after_ms"].as_u64().expect("retry_after_ms")
}

#[test]
fn a_client_that_hangs_up_while_queued_gives_its_slot_back() {
    let config =
        "[[rule]]\nname = \"nightly\"\nalgorithm = \"leaky_bucket\"\nrate = 1\nper = \"1h\"\nmax_wait = \"1d\"\n";
    let serve = Sidecar::start(config, &[], &[]);
    let acquire = post_request("/v1/acquire", r#"{"rule": "nightly", "key": "db"}"#, "");
    let (status, json) = serve.post("/v1/acquire", r#"{"rule": "nightly", "key": "db"}"#);
    assert_eq!((status, json["waited_ms"].as_u64()), (200, Some(0)));
    // The honest caller's own pacing: its slot is at most an hour away.
    assert!(next_slot_ms(&serve) <= PACE_MS);

    for _ in 0..20 {
        let mut client = serve.connect();
        client.write_all(acquire.as_bytes()).expect("write");
        // Queued: its reservation took the next slot, so the one after is more than an hour away.
        let queued = common::wait_for(PATIENCE, || (next_slot_ms(&serve) > PACE_MS).then_some(()));
        assert!(queued.is_some(), "the acquire was not queued: {}", serve.log());
        drop(client);
        // Hung up: its slot comes back, and an honest caller waits only for its own turn again.
        let back = common::wait_for(PATIENCE, || (next_slot_ms(&serve) <= PACE_MS).then_some(()));
        assert!(back.is_some(), "a hung-up client kept its slot: {}", serve.log());
    }
}

#[test]
fn a_request_is_answered_while_a_sighup_reload_reads_and_parses() {
    // One worker thread: a reload that parsed on it would hold every request until it ended.
    let serve = Sidecar::start(LIKE, &[], &[("TOKIO_WORKER_THREADS", "1")]);
    // The config file becomes a FIFO: the reload reads it until the test has written the whole file, so the
    // requests below are answered while the reload is under way, whatever the machine's speed.
    std::fs::remove_file(serve.serve.config()).expect("remove config");
    let fifo = Command::new("mkfifo")
        .arg(serve.serve.config())
        .status()
        .expect("mkfifo");
    assert!(fifo.success());
    serve.serve.signal("-HUP");
    let reading = common::wait_for(PATIENCE, || serve.log().contains("reloading").then_some(()));
    assert!(reading.is_some(), "no reload started: {}", serve.log());

    for n in 0..5 {
        let (status, json) = serve.post("/v1/check", &format!(r#"{{"rule": "like", "key": "{n}"}}"#));
        assert_eq!(status, 200, "{json}");
    }
    assert!(!serve.log().contains("reloaded"), "{}", serve.log());

    // A large file: 10 000 rules, the last of them new.
    let mut text = String::from(LIKE);
    for i in 0..10_000 {
        text.push_str(&format!(
            "[[rule]]\nname = \"r{i}\"\nalgorithm = \"token_bucket\"\ncapacity = 10\nrate = 1\nper = \"1s\"\n"
        ));
    }
    std::fs::write(serve.serve.config(), text).expect("write the FIFO");
    let reloaded = common::wait_for(PATIENCE, || serve.log().contains("reloaded").then_some(()));
    assert!(reloaded.is_some(), "the reload did not end: {}", serve.log());
    let (status, json) = serve.post("/v1/check", r#"{"rule": "r9999", "key": "k"}"#);
    assert_eq!(status, 200, "{json}");
}

#[test]
fn a_cost_of_zero_peeks_and_reset_forgets_the_key() {
    let config = "[[rule]]\nname = \"post\"\nalgorithm = \"fixed_window\"\nlimit = 2\nwindow = \"60s\"\n";
    let serve = Sidecar::start(config, &[], &[]);
    let check = |cost: u64| {
        serve.post(
            "/v1/check",
            &format!(r#"{{"rule": "post", "key": "u1", "cost": {cost}}}"#),
        )
    };
    let (status, json) = check(0);
    assert_eq!((status, json["remaining"].as_u64()), (200, Some(2)), "{json}");
    for _ in 0..2 {
        assert_eq!(check(1).0, 200);
    }
    let (status, json) = check(0);
    assert_eq!(
        (status, json["remaining"].as_u64()),
        (429, Some(0)),
        "a peek at a full window: {json}"
    );
    assert_eq!(check(1).0, 429, "the peeks took nothing and the window is full");
    let (status, json) = serve.post("/v1/reset", r#"{"rule": "post", "key": "u1"}"#);
    assert_eq!(status, 200, "{json}");
    let (status, json) = check(0);
    assert_eq!((status, json["remaining"].as_u64()), (200, Some(2)), "{json}");
    let (status, json) = serve.post("/v1/reset", r#"{"rule": "nope", "key": "u1"}"#);
    assert_eq!(status, 404, "{json}");
}

/// `[serve] listen` says where the sidecar listens; `--listen` overrides it.
#[test]
fn serve_listens_where_the_config_says_unless_the_flag_says_otherwise() {
    let (configured, flagged) = (common::free_port(), common::free_port());
    let config = format!("[serve]\nlisten = \"127.0.0.1:{configured}\"\n{LIKE}");
    let serve = Sidecar::start_on(&config, (&[], &[]), (configured, None));
    assert!(
        serve
            .log()
            .contains(&format!("listening on http://127.0.0.1:{configured}")),
        "{}",
        serve.log()
    );
    drop(serve);
    let serve = Sidecar::start_on(&config, (&[], &[]), (flagged, Some(flagged)));
    assert!(
        serve
            .log()
            .contains(&format!("listening on http://127.0.0.1:{flagged}")),
        "{}",
        serve.log()
    );
    assert!(
        TcpStream::connect(("127.0.0.1", configured)).is_err(),
        "the flag overrides the config: nothing listens on the configured port"
    );
}

/// `POST /v1/check/batch` decides many checks in one round trip, each as `/v1/check` would, in their order; a
/// check that fails is answered in its place; a batch over the bound, or not a batch, is refused 400.
#[test]
fn a_batch_decides_each_check_in_its_order() {
    let serve = Sidecar::start(LIKE, &[], &[]);
    let checks: Vec<serde_json::Value> = (0..1_001)
        .map(|i| serde_json::json!({ "rule": "like", "key": format!("user:{i}") }))
        .collect();
    let (status, body) = serve.post("/v1/check/batch", &serde_json::json!({ "checks": checks }).to_string());
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"].as_str().is_some_and(|e| e.contains("at most 1000")),
        "{body}"
    );
    let (status, body) = serve.post("/v1/check/batch", r#"{"rule": "like", "key": "k"}"#);
    assert_eq!(status, 400, "{body}");

    let few = r#"{"checks": [
        {"rule": "like", "key": "batch", "cost": 999},
        {"rule": "like", "key": "batch"},
        {"rule": "like", "key": "batch"},
        {"rule": "nope", "key": "batch"},
        {"rule": "like", "key": "other", "cost": 0}
    ]}"#;
    let (status, body) = serve.post("/v1/check/batch", few);
    assert_eq!(status, 200, "{body}");
    let decisions = body["decisions"].as_array().expect("decisions");
    let allowed: Vec<Option<bool>> = decisions.iter().map(|d| d["allowed"].as_bool()).collect();
    assert_eq!(
        allowed,
        [Some(true), Some(true), Some(false), None, Some(true)],
        "{body}"
    );
    assert_eq!(decisions[1]["remaining"], 0, "{body}");
    assert_eq!(decisions[3]["status"], 404, "{body}");
    assert!(
        decisions[3]["error"].as_str().is_some_and(|e| e.contains("nope")),
        "{body}"
    );
    assert_eq!(decisions[4]["remaining"], 1000, "a peek: {body}");
}

/// HTTP and gRPC (Envoy's RLS) share `[serve] max_connections`: with two allowed, one HTTP client and one gRPC
/// client in, a second HTTP client waits in the backlog (no answer) until the gRPC one leaves. (Each listener
/// takes its slot before it accepts, so a gRPC connection gets in with one HTTP client in.)
#[test]
fn http_and_grpc_share_one_connection_bound() {
    let (http, grpc) = (common::free_port(), common::free_port());
    let config = format!("[serve]\ngrpc_listen = \"127.0.0.1:{grpc}\"\nmax_connections = 2\n{LIKE}");
    let serve = Sidecar::start_on(&config, (&[], &[]), (http, Some(http)));
    let _first = TcpStream::connect(("127.0.0.1", http)).expect("an HTTP connection");
    // HTTP/2's connection preface and an empty SETTINGS frame; an accepted connection answers with its own SETTINGS.
    let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";
    let mut rls = TcpStream::connect(("127.0.0.1", grpc)).expect("the gRPC port");
    rls.write_all(preface).expect("preface");
    rls.set_read_timeout(Some(PATIENCE)).expect("timeout");
    let mut frame = [0_u8; 9];
    rls.read_exact(&mut frame).expect("the gRPC connection is served");
    assert_eq!(frame[3], 0x4, "a SETTINGS frame: {frame:?}");
    // Two connections are in: a second HTTP client is not served.
    let mut second = TcpStream::connect(("127.0.0.1", http)).expect("the HTTP port");
    second
        .write_all(b"GET /livez HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .expect("request");
    second.set_read_timeout(Some(Duration::from_secs(1))).expect("timeout");
    let mut answer = String::new();
    let early = second.read_to_string(&mut answer);
    assert!(
        answer.is_empty() && early.is_err(),
        "served beside an HTTP and a gRPC connection with a bound of two: {answer:?}; {}",
        serve.log()
    );
    drop(rls);
    second.set_read_timeout(Some(PATIENCE)).expect("timeout");
    second
        .read_to_string(&mut answer)
        .expect("served once the gRPC client left");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}
