//! The network gear: a private network namespace for every run, granted runs reach out only
//! through the egress proxy, and only to the hosts of their grant.
//!
//! The stand-in internet is a network namespace this test binary creates (root only): a veth
//! pair, `198.51.100.254` inside (a /30 of a documentation range, so the route it adds covers
//! four addresses; a host that already routes them elsewhere is refused, not hijacked), an HTTP server on port 80 and an HTTPS one on 443 whose
//! certificate (for `inet.test` and `other.test`) a test CA made here signs. Checks that
//! need no internet (what is never reachable) run unprivileged too.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::os::linux::net::SocketAddrExt;
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, OnceLock};

use gearbox_core::{Network, Outcome, Status};
use gearbox_engine::{Config, Engine};

use crate::support::{Run, is_root, run};

const INET: &str = "198.51.100.254";
const INET_HOST_SIDE: &str = "198.51.100.253/30";

/// The names the proxy resolves for these tests.
fn test_config() -> Config {
    let mut config = Config::default();
    config.pool.languages.clear();
    let hosts: BTreeMap<String, IpAddr> = [
        ("inet.test", INET),
        ("other.test", INET),
        ("private.test", "10.1.2.3"),
        ("meta.test", "169.254.169.254"),
    ]
    .into_iter()
    .map(|(h, a)| (h.to_string(), a.parse().expect("address")))
    .collect();
    config.network.hosts = hosts;
    config
}

fn engine() -> &'static Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    ENGINE.get_or_init(|| {
        let _guard = crate::support::runtime().enter();
        Engine::new(test_config(), crate::support::gearbox_bin())
    })
}

async fn go(r: Run, network: Network) -> Outcome {
    on_path(engine(), test_config, r, network).await
}

/// With `GEARBOX_TEST_POOL` (the suite's pooled pass), the warm path: an engine of its own
/// keeps warm sandboxes of the run's language, and a run that can be served warm (no
/// variables or limits of its own) must be: a granted run by a sandbox built for granted
/// runs (one granted run misses first, which makes the pool keep one), any other by the
/// fork server or warm pool. Otherwise, `cold` serves it.
async fn on_path(
    cold: &'static Engine,
    config: fn() -> Config,
    r: Run,
    network: Network,
) -> Outcome {
    let mut req = r.req;
    req.network = network;
    let exec = |engine: Arc<Engine>, req: gearbox_core::ExecRequest| async move {
        crate::support::runtime()
            .spawn(async move { engine.execute(req, None).await })
            .await
            .expect("run task")
    };
    if std::env::var_os("GEARBOX_TEST_POOL").is_none() {
        return crate::support::runtime()
            .spawn(cold.execute(req, None))
            .await
            .expect("run task");
    }
    let language = req.language.clone();
    let mut c = config();
    c.pool.languages = [(language.clone(), gearbox_engine::PoolSize::from(1))].into();
    let engine = {
        let _guard = crate::support::runtime().enter();
        Arc::new(Engine::new(c, crate::support::gearbox_bin()))
    };
    let granted = req.network.is_on();
    let warm = req.env.is_empty() && req.limits == Default::default();
    let stats = |e: &Engine| {
        e.pool_stats()
            .into_iter()
            .find(|s| s.language == language && s.network == granted)
    };
    if warm {
        if granted {
            let mut first = run(&language, "").req;
            first.network = Network::Any;
            exec(engine.clone(), first).await;
        }
        let until = std::time::Instant::now() + std::time::Duration::from_secs(120);
        while stats(&engine).is_none_or(|s| s.ready == 0) {
            assert!(
                std::time::Instant::now() < until,
                "no warm sandbox: {:?}",
                engine.pool_stats()
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }
    let before = stats(&engine).map(|s| s.hits).unwrap_or_default();
    let o = exec(engine.clone(), req).await;
    if warm {
        let after = stats(&engine).map(|s| s.hits).unwrap_or_default();
        assert_eq!(after, before + 1, "not served warm: {o:?}");
    }
    o
}

fn hosts(list: &[&str]) -> Network {
    Network::hosts(list).expect("patterns")
}

struct Internet {
    ca: String,
    /// Where the servers run: `ca.pem`, and `requests.log` (what `/log/ID` requests carried).
    dir: PathBuf,
    /// The servers; they exit when this test process does.
    _server: std::process::Child,
}

/// The stand-in internet, once per test binary; `None` (skipped loudly) without root,
/// a failure when `GEARBOX_SANDBOX_REQUIRED` is set.
fn internet() -> Option<&'static Internet> {
    static NET: OnceLock<Option<Internet>> = OnceLock::new();
    NET.get_or_init(|| {
        if !is_root() {
            if std::env::var_os("GEARBOX_SANDBOX_REQUIRED").is_some() {
                panic!("the stand-in internet needs root, and GEARBOX_SANDBOX_REQUIRED is set");
            }
            eprintln!("SKIPPED network checks that need the stand-in internet: not root");
            return None;
        }
        Some(start_internet())
    })
    .as_ref()
}

static NS_NAME: OnceLock<String> = OnceLock::new();

extern "C" fn remove_internet() {
    if let Some(ns) = NS_NAME.get() {
        let _ = Command::new("ip").args(["netns", "del", ns]).status();
    }
}

fn sh(cmd: &str) {
    let st = Command::new("sh").arg("-c").arg(cmd).status().expect("sh");
    assert!(st.success(), "{cmd}");
}

fn start_internet() -> Internet {
    // Namespaces of earlier test processes that are gone.
    let list = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip");
    for line in String::from_utf8_lossy(&list.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or_default();
        if let Some(pid) = name.strip_prefix("gbxnet-")
            && !std::path::Path::new(&format!("/proc/{pid}")).exists()
        {
            let _ = Command::new("ip").args(["netns", "del", name]).status();
        }
    }
    // The route this adds must not take traffic the host sends elsewhere (a documentation
    // range can be in real use on a test machine: a package mirror, say).
    let routes = Command::new("ip")
        .args(["-o", "route", "show", "match", INET])
        .output()
        .expect("ip route");
    let routes = String::from_utf8_lossy(&routes.stdout).to_string();
    assert!(
        routes.lines().all(|l| l.starts_with("default")),
        "{INET} is already routed on this host ({routes:?}); the stand-in internet would hijack it"
    );
    let pid = std::process::id();
    let ns = format!("gbxnet-{pid}");
    // Removed when this test process exits (with the namespace go the veth pair and its route).
    NS_NAME.set(ns.clone()).expect("one stand-in internet");
    // SAFETY: registering a plain extern "C" function without arguments.
    unsafe { libc::atexit(remove_internet) };
    let (host_if, inner_if) = (
        format!("gbh{}", pid % 100_000),
        format!("gbi{}", pid % 100_000),
    );
    sh(&format!(
        "ip netns add {ns} && ip link add {host_if} type veth peer name {inner_if} && \
         ip link set {inner_if} netns {ns} && ip addr add {INET_HOST_SIDE} dev {host_if} && \
         ip link set {host_if} up && ip -n {ns} addr add {INET}/30 dev {inner_if} && \
         ip -n {ns} link set {inner_if} up && ip -n {ns} link set lo up"
    ));
    let dir = PathBuf::from(format!("/tmp/gearbox-inet-{pid}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let d = dir.display();
    sh(&format!(
        "cd {d} && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
         -keyout ca.key -out ca.pem -days 2 -subj /CN=gearbox-test-ca 2>/dev/null && \
         openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout srv.key \
         -out srv.csr -subj /CN=inet.test 2>/dev/null && \
         printf 'subjectAltName=DNS:inet.test,DNS:other.test\\n' > ext && \
         openssl x509 -req -in srv.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out srv.pem \
         -days 2 -extfile ext 2>/dev/null"
    ));
    let script = r#"
import http.server, os, socketserver, ssl, sys, threading, time
import json
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        auth = self.headers.get('Authorization', '')
        if self.path.startswith('/log/'):
            with open('requests.log', 'a') as f:
                f.write(json.dumps({'id': self.path[5:], 'host': self.headers.get('Host', ''), 'auth': auth}) + '\n')
        if self.path.startswith('/echo'):
            body = ('auth=' + auth + '\n').encode()
            self.send_response(200); self.send_header('Content-Length', str(len(body)))
            self.send_header('X-Echo', auth); self.end_headers()
            self.wfile.write(body)
            return
        body = ('hello from ' + self.headers.get('Host', '?') + '\n').encode()
        self.send_response(200); self.send_header('Content-Length', str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
class S(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
plain = S((sys.argv[1], 80), H)
tls = S((sys.argv[1], 443), H)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER); ctx.load_cert_chain('srv.pem', 'srv.key')
tls.socket = ctx.wrap_socket(tls.socket, server_side=True)
for s in (plain, tls): threading.Thread(target=s.serve_forever, daemon=True).start()
parent = os.getppid()
while os.getppid() == parent: time.sleep(0.3)
"#;
    std::fs::write(dir.join("server.py"), script).expect("server.py");
    let server = Command::new("ip")
        .args(["netns", "exec", &ns, "python3", "server.py", INET])
        .current_dir(&dir)
        .spawn()
        .expect("start the stand-in internet");
    let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while std::net::TcpStream::connect((INET, 443)).is_err() {
        assert!(
            std::time::Instant::now() < until,
            "the stand-in internet did not start"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    Internet {
        ca: std::fs::read_to_string(dir.join("ca.pem")).expect("ca"),
        dir: dir.clone(),
        _server: server,
    }
}

/// Fetch each URL through the proxy settings the sandbox gives; print the body or the error.
const FETCH: &str = r#"
import ssl, sys, urllib.request, urllib.error
ctx = ssl.create_default_context(cafile='ca.pem')
for url in sys.argv[1:]:
    try:
        print(url, 'OK', urllib.request.urlopen(url, context=ctx, timeout=20).read().decode().strip())
    except urllib.error.HTTPError as e:
        print(url, 'HTTP', e.code, e.read().decode().strip())
    except Exception as e:
        print(url, 'ERR', type(e).__name__, e)
"#;

fn fetch(ca: &str, urls: &[&str]) -> Run {
    run("python", FETCH).file("ca.pem", ca).args(urls)
}

#[tokio::test]
async fn an_allowed_host_is_reached_over_http_and_https_and_counted() {
    let Some(net) = internet() else { return };
    let o = go(
        fetch(&net.ca, &["http://inet.test/", "https://inet.test/"]),
        hosts(&["inet.test"]),
    )
    .await;
    assert_eq!(o.status, Status::Ok, "{o:?}");
    assert!(
        o.stdout
            .contains("http://inet.test/ OK hello from inet.test"),
        "{o:?}"
    );
    assert!(
        o.stdout
            .contains("https://inet.test/ OK hello from inet.test"),
        "{o:?}"
    );
    let ledger = o.egress.expect("a ledger");
    assert_eq!(ledger.granted, vec!["inet.test"]);
    for key in ["inet.test:80", "inet.test:443"] {
        let h = ledger.hosts.iter().find(|h| h.host == key).expect(key);
        assert_eq!(h.requests, 1, "{ledger:?}");
        assert!(h.bytes_up > 0 && h.bytes_down > 0, "{ledger:?}");
    }
    assert_eq!(ledger.refused_total, 0, "{ledger:?}");
}

#[tokio::test]
async fn a_host_outside_the_grant_is_refused_with_the_rule() {
    let Some(net) = internet() else { return };
    let o = go(
        fetch(
            &net.ca,
            &[
                "http://other.test/",
                "https://other.test/",
                "http://inet.test:8080/",
            ],
        ),
        hosts(&["inet.test"]),
    )
    .await;
    assert!(
        o.stdout.contains("http://other.test/ HTTP 403 gearbox egress proxy: other.test:80 refused: other.test:80 is not in this run's network grant (inet.test"),
        "{o:?}"
    );
    assert!(o.stdout.contains("https://other.test/ ERR"), "{o:?}");
    assert!(
        o.stdout.contains("http://inet.test:8080/ HTTP 403"),
        "{o:?}"
    );
    let ledger = o.egress.expect("a ledger");
    assert_eq!(ledger.refused_total, 3, "{ledger:?}");
    assert!(ledger.hosts.is_empty(), "{ledger:?}");
    assert!(
        ledger.refused.iter().any(|r| r.host == "other.test:443"),
        "{ledger:?}"
    );
}

#[tokio::test]
async fn a_tls_server_name_outside_the_grant_ends_the_tunnel() {
    let Some(net) = internet() else { return };
    let code = r#"
import socket, ssl
s = socket.create_connection(('127.0.0.1', 3128))
s.sendall(b'CONNECT inet.test:443 HTTP/1.1\r\nHost: inet.test:443\r\n\r\n')
print(s.recv(200).split(b'\r\n')[0].decode())
ctx = ssl.create_default_context(cafile='ca.pem')
try:
    t = ctx.wrap_socket(s, server_hostname='other.test')
    t.sendall(b'GET / HTTP/1.0\r\nHost: other.test\r\n\r\n')
    print('GOT', t.recv(200))
except Exception as e:
    print('tunnel ended', type(e).__name__)
"#;
    let o = go(
        run("python", code).file("ca.pem", &net.ca),
        hosts(&["inet.test"]),
    )
    .await;
    assert!(o.stdout.starts_with("HTTP/1.1 200"), "{o:?}");
    assert!(o.stdout.contains("tunnel ended"), "{o:?}");
    let ledger = o.egress.expect("a ledger");
    assert!(
        ledger
            .refused
            .iter()
            .any(|r| r.reason.contains("TLS server name other.test")),
        "{ledger:?}"
    );
}

#[tokio::test]
async fn dialing_out_without_the_proxy_fails_closed() {
    let code = r#"
import socket
for target in [('198.51.100.254', 80), ('1.1.1.1', 443)]:
    try:
        socket.create_connection(target, timeout=5); print(target, 'CONNECTED')
    except OSError as e:
        print(target, 'errno', e.errno)
try:
    socket.getaddrinfo('inet.test', 443); print('RESOLVED')
except OSError as e:
    print('no resolver')
print(sorted(n for _, n in socket.if_nameindex()))
"#;
    for network in [Network::Any, Network::Off] {
        let o = go(run("python", code), network.clone()).await;
        assert_eq!(o.status, Status::Ok, "{o:?}");
        assert!(!o.stdout.contains("CONNECTED"), "{network:?}: {o:?}");
        assert!(!o.stdout.contains("RESOLVED"), "{network:?}: {o:?}");
        assert!(o.stdout.contains("errno 101"), "{network:?}: {o:?}");
        assert!(
            o.stdout.trim_end().ends_with("['lo']"),
            "{network:?}: {o:?}"
        );
    }
}

#[tokio::test]
async fn loopback_metadata_and_private_addresses_are_never_reached() {
    let code = r#"
import sys, urllib.request, urllib.error
for url in sys.argv[1:]:
    try:
        urllib.request.urlopen(url, timeout=20); print(url, 'REACHED')
    except urllib.error.HTTPError as e:
        print(url, e.code, e.read().decode().strip())
    except Exception as e:
        print(url, 'ERR', e)
"#;
    let urls = [
        "http://127.0.0.1:9/",
        "http://[::1]:9/",
        "http://169.254.169.254/latest/meta-data/",
        "http://meta.test/",
        "http://10.1.2.3/",
        "http://private.test/",
        "http://192.168.1.1/",
        "http://localhost:9/",
    ];
    // NO_PROXY covers the run's own loopback; these go through the proxy on purpose.
    let o = go(
        run("python", code)
            .args(&urls)
            .env("NO_PROXY", "")
            .env("no_proxy", ""),
        Network::Any,
    )
    .await;
    assert!(!o.stdout.contains("REACHED"), "{o:?}");
    for (url, class) in [
        ("http://127.0.0.1:9/", "loopback"),
        ("http://[::1]:9/", "loopback"),
        ("http://169.254.169.254/latest/meta-data/", "link-local"),
        ("http://meta.test/", "link-local"),
        ("http://10.1.2.3/", "private 10.0.0.0/8"),
        ("http://private.test/", "private 10.0.0.0/8"),
        ("http://192.168.1.1/", "private 192.168.0.0/16"),
    ] {
        let line = o
            .stdout
            .lines()
            .find(|l| l.starts_with(url))
            .unwrap_or_default();
        assert!(
            line.contains(" 403 ") && line.contains(class),
            "{url}: {line:?} / {o:?}"
        );
    }
    let ledger = o.egress.expect("a ledger");
    assert_eq!(ledger.refused_total, urls.len() as u64, "{ledger:?}");
}

#[tokio::test]
async fn host_loopback_services_abstract_sockets_and_connections_stay_out_of_sight() {
    // A service on the host's loopback and an abstract socket in the host's namespace.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listener");
    let port = listener.local_addr().expect("addr").port();
    let name = format!("gearbox-test-{}", std::process::id());
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).expect("name");
    let _abstract = std::os::unix::net::UnixListener::bind_addr(&addr).expect("abstract");
    let code = format!(
        r#"
import socket, urllib.request, urllib.error
try:
    socket.create_connection(('127.0.0.1', {port}), timeout=5); print('LOOPBACK REACHED')
except OSError as e:
    print('loopback', e.errno)
try:
    urllib.request.urlopen('http://127.0.0.1:{port}/', timeout=20); print('PROXIED TO LOOPBACK')
except urllib.error.HTTPError as e:
    print('proxy', e.code)
u = socket.socket(socket.AF_UNIX)
try:
    u.connect('\0{name}'); print('ABSTRACT REACHED')
except OSError as e:
    print('abstract', e.errno)
tcp = open('/proc/net/tcp').read()
print('host port visible' if ':%04X ' % {port} in tcp else 'host port invisible')
"#
    );
    let o = go(
        run("python", &code).env("NO_PROXY", "").env("no_proxy", ""),
        Network::Any,
    )
    .await;
    assert_eq!(o.status, Status::Ok, "{o:?}");
    assert!(o.stdout.contains("loopback 111"), "{o:?}");
    assert!(o.stdout.contains("proxy 403"), "{o:?}");
    assert!(o.stdout.contains("abstract 111"), "{o:?}");
    assert!(o.stdout.contains("host port invisible"), "{o:?}");
    drop(listener);
}

#[tokio::test]
async fn the_relay_holds_nothing_the_program_can_take() {
    // The relay runs as the program's user: its memory, descriptors and environment must
    // be out of the program's reach, and killing it ends only the program's own network.
    let code = r#"
import os, signal, urllib.request, urllib.error
relay = None
for pid in os.listdir('/proc'):
    if pid.isdigit() and int(pid) not in (1, os.getpid()):
        try:
            if open('/proc/%s/stat' % pid).read().split()[3] == '1':
                relay = int(pid)
        except OSError:
            pass
print('relay found' if relay else 'NO RELAY')
for what in ['mem', 'environ', 'fd/0']:
    try:
        open('/proc/%d/%s' % (relay, what), 'rb').read(1); print(what, 'READABLE')
    except OSError as e:
        print(what, 'refused', e.errno)
try:
    os.kill(relay, signal.SIGKILL); print('killed')
except PermissionError:
    print('kill refused')
try:
    urllib.request.urlopen('http://127.0.0.1:3128/', timeout=5)
except urllib.error.HTTPError:
    print('STILL OUT')
except Exception as e:
    print('network gone')
else:
    print('STILL OUT')
raise SystemExit(3)
"#;
    let o = go(run("python", code), hosts(&["inet.test"])).await;
    assert!(o.stdout.starts_with("relay found"), "{o:?}");
    assert!(!o.stdout.contains("READABLE"), "{o:?}");
    // Where Landlock scopes signals, the relay cannot even be killed; elsewhere killing it
    // ends only the program's own way out.
    assert!(
        o.stdout.contains("kill refused\nSTILL OUT") || o.stdout.contains("killed\nnetwork gone"),
        "{o:?}"
    );
    assert_eq!(o.exit_code, Some(3), "{o:?}");
    assert_eq!(o.status, Status::Error, "{o:?}");
}

/// Only the linux backend confines a run to the proxy: the others refuse a grant rather
/// than run with no network (wasm) or a network of their own (docker).
#[tokio::test]
async fn backends_that_cannot_confine_a_run_refuse_network() {
    for backend in [
        gearbox_core::BackendKind::Wasm,
        gearbox_core::BackendKind::Docker,
    ] {
        let mut req = run("javascript", "console.log(1)").req;
        req.network = hosts(&["inet.test"]);
        let o = crate::support::runtime()
            .spawn(engine().execute(req, Some(backend)))
            .await
            .expect("run task");
        assert_eq!(o.status, Status::Denied, "{backend}: {o:?}");
        assert!(
            o.reason
                .as_deref()
                .unwrap_or("")
                .contains("cannot confine a run to the egress proxy"),
            "{backend}: {o:?}"
        );
    }
}

// Secrets: presented by the proxy on TLS connections to their hosts, never in the sandbox.

/// The value of the test secret: made here, read by the engine from a file in the stand-in
/// internet's directory, never given to a program.
fn secret_value() -> &'static str {
    static VALUE: OnceLock<String> = OnceLock::new();
    VALUE.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or_default();
        format!("real-secret-{}-{nanos:x}", std::process::id())
    })
}

/// An engine with one secret, `INET_TOKEN`, for `inet.test` and `wrongname.test` (a name
/// the stand-in server's certificate does not carry), presented as `Authorization: Bearer`.
/// The proxy trusts the stand-in internet's CA upstream (`extra_roots`).
fn secret_engine() -> &'static Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    ENGINE.get_or_init(|| {
        let _guard = crate::support::runtime().enter();
        Engine::new(secret_config(), crate::support::gearbox_bin())
    })
}

fn secret_config() -> Config {
    let net = internet().expect("the stand-in internet");
    let file = net.dir.join("secret");
    if !file.exists() {
        std::fs::write(&file, format!("{}\n", secret_value())).expect("secret file");
    }
    let mut config = test_config();
    config.network.hosts = [
        ("inet.test", INET),
        ("other.test", INET),
        ("wrongname.test", INET),
    ]
    .into_iter()
    .map(|(h, a)| (h.to_string(), a.parse().expect("address")))
    .collect();
    config.network.extra_roots = vec![net.dir.join("ca.pem")];
    config.secrets = vec![gearbox_engine::gearbox_egress::SecretConfig {
        name: "INET_TOKEN".into(),
        value_env: None,
        value_file: Some(file),
        hosts: vec!["inet.test".into(), "wrongname.test".into()],
        header: Some("Authorization".into()),
        format: Some("Bearer {value}".into()),
    }];
    config
}

async fn go_secret(_net: &Internet, r: Run, network: Network) -> Outcome {
    on_path(secret_engine(), secret_config, r, network).await
}

/// The `Authorization` header the stand-in server received with `/log/{id}`.
fn received(net: &Internet, id: &str) -> Option<String> {
    let log = std::fs::read_to_string(net.dir.join("requests.log")).unwrap_or_default();
    log.lines().find_map(|l| {
        let v: serde_json::Value = serde_json::from_str(l).ok()?;
        (v["id"] == id).then(|| v["auth"].as_str().unwrap_or_default().to_string())
    })
}

#[tokio::test]
async fn a_secret_is_presented_only_to_its_host_and_never_enters_the_sandbox() {
    let Some(net) = internet() else { return };
    let pid = std::process::id();
    let code = format!(
        r#"
import glob, json, os, ssl, urllib.request
tok = os.environ['INET_TOKEN']
print('placeholder', tok.startswith('gbx-placeholder-'))
mine = ssl.create_default_context()
test_ca = ssl.create_default_context(cafile='ca.pem')
def get(url, ctx, auth=None):
    req = urllib.request.Request(url)
    if auth:
        req.add_header('Authorization', auth)
    r = urllib.request.urlopen(req, context=ctx, timeout=20)
    return r.headers.get('X-Echo'), r.read().decode().strip()
print('echo', get('https://inet.test/echo', mine, 'token ' + tok))
print('given', get('https://inet.test/log/{pid}-given', mine, 'token ' + tok))
print('added', get('https://inet.test/log/{pid}-added', mine))
print('other', get('https://other.test/log/{pid}-other', test_ca, 'token ' + tok))
print('plain', get('http://inet.test/log/{pid}-plain', None, 'token ' + tok))
seen = []
for p in glob.glob('/proc/[0-9]*/environ') + glob.glob('/proc/[0-9]*/cmdline'):
    try:
        seen.append(open(p, 'rb').read().decode('latin-1'))
    except OSError as e:
        seen.append('unreadable ' + p)
for var in ('SSL_CERT_FILE', 'NODE_EXTRA_CA_CERTS'):
    seen.append(open(os.environ[var]).read()[-4000:])
    print(var, os.path.basename(os.environ[var]))
print('DUMP', json.dumps(seen))
"#
    );
    let o = go_secret(
        net,
        run("python", &code).file("ca.pem", &net.ca),
        hosts(&["inet.test", "other.test"]),
    )
    .await;
    assert_eq!(o.status, Status::Ok, "{o:?}");
    let value = secret_value();
    // Nowhere in what the program could see or what the run reports.
    let whole = serde_json::to_string(&o).expect("outcome");
    assert!(!whole.contains(value), "the value leaked: {o:?}");
    assert!(o.stdout.contains("placeholder True"), "{o:?}");
    assert!(
        o.stdout
            .contains("SSL_CERT_FILE trust.pem\nNODE_EXTRA_CA_CERTS ca.pem"),
        "{o:?}"
    );
    assert!(o.stdout.contains("DUMP [\""), "{o:?}");
    // An upstream that echoes it back: the program still sees only its placeholder.
    assert!(
        o.stdout.contains("echo ('token gbx-placeholder-")
            && o.stdout.contains("auth=token gbx-placeholder-"),
        "{o:?}"
    );
    // Presented to its host: in place of the placeholder, and added when missing.
    assert_eq!(
        received(net, &format!("{pid}-given")).as_deref(),
        Some(format!("token {value}").as_str())
    );
    assert_eq!(
        received(net, &format!("{pid}-added")).as_deref(),
        Some(format!("Bearer {value}").as_str())
    );
    // Never to another host, nor over plain HTTP even to its own host.
    for id in ["other", "plain"] {
        let got = received(net, &format!("{pid}-{id}")).expect(id);
        assert!(got.starts_with("token gbx-placeholder-"), "{id}: {got}");
    }
    let ledger = o.egress.expect("a ledger");
    let inet = ledger
        .hosts
        .iter()
        .find(|h| h.host == "inet.test:443")
        .expect("inet.test:443");
    assert_eq!(inet.requests, 3, "one per HTTP request: {ledger:?}");
    assert!(inet.bytes_up > 0 && inet.bytes_down > 0, "{ledger:?}");
    assert_eq!(ledger.refused_total, 0, "{ledger:?}");
}

#[tokio::test]
async fn a_secret_bound_connection_is_verified_upstream_and_named_exactly() {
    let Some(net) = internet() else { return };
    let code = r#"
import socket, ssl, urllib.request
try:
    urllib.request.urlopen('https://wrongname.test/', timeout=20); print('wrongname REACHED')
except Exception as e:
    print('wrongname failed', type(e).__name__)
s = socket.create_connection(('127.0.0.1', 3128))
s.sendall(b'CONNECT inet.test:443 HTTP/1.1\r\nHost: inet.test:443\r\n\r\n')
print(s.recv(200).split(b'\r\n')[0].decode())
try:
    t = ssl.create_default_context().wrap_socket(s, server_hostname='other.test')
    t.sendall(b'GET / HTTP/1.0\r\nHost: other.test\r\n\r\n'); print('GOT', t.recv(200))
except Exception as e:
    print('mismatch ended', type(e).__name__)
"#;
    let o = go_secret(
        net,
        run("python", code),
        hosts(&["inet.test", "other.test", "wrongname.test"]),
    )
    .await;
    assert_eq!(o.status, Status::Ok, "{o:?}");
    assert!(o.stdout.contains("wrongname failed"), "{o:?}");
    assert!(o.stdout.contains("mismatch ended"), "{o:?}");
    let ledger = o.egress.clone().expect("a ledger");
    let reasons: Vec<&str> = ledger.refused.iter().map(|r| r.reason.as_str()).collect();
    assert!(
        reasons
            .iter()
            .any(|r| r.contains("TLS with wrongname.test failed")),
        "{ledger:?}"
    );
    assert!(
        reasons
            .iter()
            .any(|r| r.contains("TLS server name other.test differs from the CONNECT host")),
        "{ledger:?}"
    );
    assert!(
        !serde_json::to_string(&o)
            .expect("outcome")
            .contains(secret_value())
    );
}

/// Without a grant, a run gets neither the placeholders nor the trust store: secrets ride
/// only on the network grant.
#[tokio::test]
async fn an_ungranted_run_gets_no_placeholder() {
    let Some(net) = internet() else { return };
    let code = "import os\nprint(sorted(k for k in os.environ if k in ('INET_TOKEN', 'SSL_CERT_FILE', 'HTTPS_PROXY')))";
    let o = go_secret(net, run("python", code), Network::Off).await;
    assert_eq!(o.status, Status::Ok, "{o:?}");
    assert_eq!(o.stdout, "[]\n", "{o:?}");
}

/// curl finds the run's trust store and proxy on its own: the secret reaches its host.
#[tokio::test]
async fn curl_presents_a_secret_through_the_run_trust_store() {
    let Some(net) = internet() else { return };
    if std::process::Command::new("curl")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("SKIPPED: no curl on this host");
        return;
    }
    let id = format!("{}-curl", std::process::id());
    let code =
        format!("curl -sS -H \"Authorization: token $INET_TOKEN\" https://inet.test/log/{id}");
    let o = go_secret(net, run("bash", &code), hosts(&["inet.test"])).await;
    assert_eq!(o.status, Status::Ok, "{o:?}");
    assert_eq!(o.stdout, "hello from inet.test\n", "{o:?}");
    assert_eq!(
        received(net, &id).as_deref(),
        Some(format!("token {}", secret_value()).as_str())
    );
}
