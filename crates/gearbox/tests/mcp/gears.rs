//! Safety gears end to end: `gearbox serve` over real stdio (rmcp's client), real sandboxes,
//! a real TCP listener on the host that a granted network reaches and an ungranted one does
//! not, human approval out of band (`gearbox approve`/`reject`, `POST /approvals/ID`) and
//! through MCP elicitation (stateful and the stateless 2026-07-28 input-required flow).
//! Run with `cargo test --workspace --test mcp -- gears::`.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientCapabilities, ElicitRequestParams, ElicitResult,
    ElicitationAction, ElicitationCapability, Implementation, InitializeRequestParams,
};
use rmcp::service::{RequestContext, RunningService};
use rmcp::transport::{ConfigureCommandExt, TokioChildProcess};
use rmcp::{ClientHandler, ErrorData, RoleClient, ServiceExt};
use serde_json::{Value, json};

use crate::support::{TempDir, obj, structured, text};

/// A host TCP service on the host's loopback that answers every connection with `pong`:
/// never reachable from a sandbox, granted or not (a granted run's proxy refuses it).
struct Pong {
    port: u16,
}

impl Pong {
    fn start() -> Pong {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = l.local_addr().expect("addr").port();
        std::thread::spawn(move || {
            for mut s in l.incoming().flatten() {
                let _ = s.write_all(b"pong\n");
            }
        });
        Pong { port }
    }
}

/// A program per language that asks the run's egress proxy (`127.0.0.1:3128`, there only
/// when network was granted) for the host's `pong` service and prints the first line of
/// the answer: `HTTP/1.1 403 Forbidden` from a granted run (the host's loopback is never
/// reachable, grant or not), `ERR` from a run without network.
fn connect_code(language: &str, port: u16) -> String {
    let req = format!("GET http://127.0.0.1:{port}/ HTTP/1.0\\r\\n\\r\\n");
    match language {
        "python" => format!(
            "import socket\ntry:\n    s = socket.create_connection(('127.0.0.1', 3128), timeout=5)\n    s.sendall(b'{req}')\n    print(s.recv(200).decode().splitlines()[0])\nexcept OSError as e:\n    print('ERR', e)\n"
        ),
        "javascript" => format!(
            "const net = require('net');\nconst c = net.connect(3128, '127.0.0.1', () => c.write('{req}'));\nc.on('data', d => {{ console.log(d.toString().split('\\r\\n')[0]); c.destroy(); }});\nc.on('error', e => console.log('ERR', e.code));\n"
        ),
        "go" => format!(
            "package main\n\nimport (\n\t\"bufio\"\n\t\"fmt\"\n\t\"net\"\n)\n\nfunc main() {{\n\tc, err := net.Dial(\"tcp\", \"127.0.0.1:3128\")\n\tif err != nil {{\n\t\tfmt.Println(\"ERR\", err)\n\t\treturn\n\t}}\n\tfmt.Fprint(c, \"{req}\")\n\tl, _ := bufio.NewReader(c).ReadString('\\n')\n\tfmt.Println(l[:len(l)-2])\n}}\n"
        ),
        "bash" => format!(
            "if exec 3<>/dev/tcp/127.0.0.1/3128; then printf '{req}' >&3; head -n1 <&3; else echo ERR; fi\n"
        ),
        other => panic!("no program for {other}"),
    }
}

/// What a model would write when it wants the network, per language (for analysis).
fn network_code(language: &str) -> &'static str {
    match language {
        "python" => {
            "import urllib.request\nprint(urllib.request.urlopen('https://example.com').status)\n"
        }
        "javascript" => "fetch('https://example.com').then(r => console.log(r.status));\n",
        "go" => {
            "package main\n\nimport \"net/http\"\n\nfunc main() { http.Get(\"https://example.com\") }\n"
        }
        "bash" => "curl -s https://example.com | head -c 100\n",
        other => panic!("no program for {other}"),
    }
}

const LANGUAGES: [&str; 4] = ["python", "javascript", "go", "bash"];

/// Answers elicitations as told, and records the questions.
#[derive(Clone)]
struct Human {
    answer: ElicitationAction,
    approve: bool,
    asked: Arc<Mutex<Vec<String>>>,
}

impl Human {
    fn new(answer: ElicitationAction, approve: bool) -> Human {
        Human {
            answer,
            approve,
            asked: Arc::default(),
        }
    }
}

impl ClientHandler for Human {
    fn get_info(&self) -> rmcp::model::ClientConfig {
        let mut caps = ClientCapabilities::default();
        caps.elicitation = Some(ElicitationCapability::default());
        InitializeRequestParams::new(caps, Implementation::new("gears-test", "0"))
    }

    async fn create_elicitation(
        &self,
        request: ElicitRequestParams,
        _ctx: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        let message = match &request {
            ElicitRequestParams::FormElicitationParams { message, .. } => message.clone(),
            other => format!("{other:?}"),
        };
        self.asked.lock().expect("lock").push(message);
        let r = ElicitResult::new(self.answer.clone());
        Ok(if self.answer == ElicitationAction::Accept {
            r.with_content(json!({"approve": self.approve, "reason": "test says so"}))
        } else {
            r
        })
    }
}

struct Server<C: ClientHandler> {
    session: RunningService<RoleClient, C>,
    config: PathBuf,
    _dir: TempDir,
}

fn write_config(dir: &TempDir, extra: &str) -> PathBuf {
    let sockets = dir.0.join("approvals");
    let config = dir.0.join("gearbox.toml");
    std::fs::write(
        &config,
        format!(
            "pool = {{}}\n[approvals]\nsocket_dir = {:?}\n{extra}",
            sockets.display().to_string()
        ),
    )
    .expect("write config");
    config
}

async fn start_with<C: ClientHandler + Clone>(client: C, gear: &str) -> Server<C> {
    start_configured_with(client, gear, "").await
}

/// A server under `gear` with `extra` appended to its configuration, talking to `client`.
async fn start_configured_with<C: ClientHandler + Clone>(
    client: C,
    gear: &str,
    extra: &str,
) -> Server<C> {
    let dir = TempDir::new("srv");
    let config = write_config(&dir, extra);
    let gear = gear.to_string();
    let cfg = config.clone();
    let transport = TokioChildProcess::new(
        tokio::process::Command::new(env!("CARGO_BIN_EXE_gearbox")).configure(move |c| {
            c.arg("--config").arg(&cfg).args(["serve", "--gear", &gear]);
        }),
    )
    .expect("spawn gearbox serve");
    let session = client.serve(transport).await.expect("initialize");
    Server {
        session,
        config,
        _dir: dir,
    }
}

#[derive(Clone, Default)]
struct Plain;
impl ClientHandler for Plain {}

async fn start(gear: &str) -> Server<Plain> {
    start_with(Plain, gear).await
}

/// A server with `extra` appended to its configuration.
async fn start_configured(gear: &str, extra: &str) -> Server<Plain> {
    start_configured_with(Plain, gear, extra).await
}

async fn call<C: ClientHandler>(s: &Server<C>, tool: &str, args: Value) -> CallToolResult {
    s.session
        .call_tool(CallToolRequestParams::new(tool.to_string()).with_arguments(obj(args)))
        .await
        .unwrap_or_else(|e| panic!("{tool}: {e}"))
}

/// `gearbox approve|reject ID` against the server of `config`.
fn decide(config: &PathBuf, verb: &str, id: &str, reason: Option<&str>) -> (bool, String) {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_gearbox"));
    cmd.arg("--config").arg(config).args([verb, id]);
    if let Some(r) = reason {
        cmd.args(["--reason", r]);
    }
    let out = cmd.output().expect("run gearbox approve");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[tokio::test]
async fn read_only_runs_nothing_but_discovery_works() {
    let s = start("read_only").await;
    for lang in LANGUAGES {
        let r = call(&s, "execute_code", json!({"language": lang, "code": "x"})).await;
        assert_eq!(structured(&r)["status"], "denied", "{lang}: {r:?}");
        assert!(
            structured(&r)["reason"]
                .as_str()
                .unwrap_or("")
                .contains("read_only"),
            "{r:?}"
        );
    }
    let tools = s.session.list_all_tools().await.expect("tools/list");
    assert!(tools.iter().any(|t| t.name == "execute_code"));
    let env = s
        .session
        .read_resource(rmcp::model::ReadResourceRequestParams::new("gearbox://env"))
        .await
        .expect("resources work in read_only");
    assert!(!env.contents.is_empty());
}

#[tokio::test]
async fn restricted_refuses_network_with_findings_and_runs_plain_code() {
    let s = start("restricted").await;
    for lang in LANGUAGES {
        let r = call(
            &s,
            "execute_code",
            json!({"language": lang, "code": network_code(lang)}),
        )
        .await;
        let v = structured(&r);
        assert_eq!(v["status"], "denied", "{lang}: {v}");
        assert_eq!(r.is_error, Some(true));
        let reason = v["reason"].as_str().unwrap_or("");
        assert!(reason.contains("network"), "{lang}: {reason}");
        let ext = match lang {
            "python" => "py",
            "javascript" => "js",
            "go" => "go",
            _ => "sh",
        };
        assert!(
            reason.contains(&format!("main.{ext}:")),
            "{lang}: findings with file and line: {reason}"
        );
        assert_eq!(v["policy"]["gear"], "restricted");
        assert!(
            v["policy"]["findings"]
                .as_array()
                .is_some_and(|f| f.iter().any(|f| f["category"] == "network")),
            "{lang}: {v}"
        );
        // Asking for it explicitly is refused too.
        let r = call(
            &s,
            "execute_code",
            json!({"language": lang, "code": "x", "network": true}),
        )
        .await;
        assert_eq!(structured(&r)["status"], "denied", "{lang}");
    }
    let r = call(
        &s,
        "execute_code",
        json!({"language": "python", "code": "# import socket\nprint('import socket')"}),
    )
    .await;
    assert_eq!(
        structured(&r)["status"],
        "ok",
        "comments and strings are not findings: {r:?}"
    );
}

#[tokio::test]
async fn a_call_may_lower_the_gear_never_raise_it() {
    let s = start("restricted").await;
    let r = call(
        &s,
        "execute_code",
        json!({"language": "bash", "code": "echo hi", "gear": "full_trust"}),
    )
    .await;
    assert_eq!(structured(&r)["status"], "denied");
    assert!(
        structured(&r)["reason"]
            .as_str()
            .unwrap_or("")
            .contains("above")
    );
    let r = call(
        &s,
        "execute_code",
        json!({"language": "bash", "code": "echo hi", "gear": "read_only"}),
    )
    .await;
    assert_eq!(structured(&r)["status"], "denied");
    assert!(
        structured(&r)["reason"]
            .as_str()
            .unwrap_or("")
            .contains("read_only")
    );
}

#[tokio::test]
async fn full_trust_grants_a_network_that_works_and_only_when_asked() {
    let pong = Pong::start();
    let s = start("full_trust").await;
    for lang in LANGUAGES {
        let code = connect_code(lang, pong.port);
        let r = call(
            &s,
            "execute_code",
            json!({"language": lang, "code": code, "network": true}),
        )
        .await;
        let v = structured(&r);
        assert_eq!(v["status"], "ok", "{lang}: {v}");
        assert!(
            v["stdout"].as_str().unwrap_or("").contains("403 Forbidden"),
            "{lang}: granted network must reach the host service: {v}"
        );
        assert_eq!(v["policy"]["granted"], json!(["network"]), "{lang}");
        // The same code without asking: no network, although analysis sees the need.
        let r = call(&s, "execute_code", json!({"language": lang, "code": code})).await;
        let v = structured(&r);
        assert!(
            !v["stdout"].as_str().unwrap_or("").contains("403 Forbidden"),
            "{lang}: an ungranted network must not work: {v}"
        );
        assert_eq!(v["policy"]["granted"], json!([]), "{lang}");
    }
}

#[tokio::test]
async fn user_confirmed_out_of_band_approve_reject_and_hash_binding() {
    let pong = Pong::start();
    let s = start("user_confirmed").await;
    for lang in LANGUAGES {
        let code = connect_code(lang, pong.port);
        let args = json!({"language": lang, "code": code, "network": true});
        let r = call(&s, "execute_code", args.clone()).await;
        let v = structured(&r).clone();
        assert_eq!(v["status"], "pending_approval", "{lang}: {v}");
        assert_ne!(r.is_error, Some(true), "pending is not an error");
        let id = v["operation_id"]
            .as_str()
            .expect("operation_id")
            .to_string();
        assert_eq!(id.len(), 36);
        // Not yet approved: still pending, nothing ran.
        let mut again = args.clone();
        again["operation_id"] = json!(id);
        let r = call(&s, "execute_code", again.clone()).await;
        assert_eq!(structured(&r)["status"], "pending_approval", "{lang}");

        let (ok, out) = decide(&s.config, "approve", &id, Some("go ahead"));
        assert!(ok, "{lang}: gearbox approve: {out}");
        // A different program with the approved id is not run.
        let mut changed = again.clone();
        changed["code"] = json!(format!("{code}\n"));
        let r = call(&s, "execute_code", changed).await;
        assert_eq!(
            structured(&r)["status"],
            "denied",
            "{lang}: changed code must not run"
        );
        assert!(
            structured(&r)["reason"]
                .as_str()
                .unwrap_or("")
                .contains("differ")
        );
        // The approved one runs, with a network that works.
        let r = call(&s, "execute_code", again.clone()).await;
        let v = structured(&r);
        assert_eq!(v["status"], "ok", "{lang}: {v}");
        assert!(
            v["stdout"].as_str().unwrap_or("").contains("403 Forbidden"),
            "{lang}: {v}"
        );
        assert_eq!(v["policy"]["decided_by"], "human");
        // An approval is good for one run.
        let r = call(&s, "execute_code", again).await;
        assert_eq!(structured(&r)["status"], "denied", "{lang}: second use");
    }

    // Rejection carries the human's words.
    let r = call(
        &s,
        "execute_code",
        json!({"language": "python", "code": "print(1)", "network": true}),
    )
    .await;
    let id = structured(&r)["operation_id"]
        .as_str()
        .expect("id")
        .to_string();
    let (ok, out) = decide(&s.config, "reject", &id, Some("no network today"));
    assert!(ok, "{out}");
    let r = call(&s, "approval_status", json!({"operation_id": id})).await;
    assert_eq!(structured(&r)["status"], "denied");
    assert!(
        structured(&r)["reason"]
            .as_str()
            .unwrap_or("")
            .contains("no network today"),
        "{r:?}"
    );

    // approval_status runs the approved request itself.
    let r = call(
        &s,
        "execute_code",
        json!({"language": "bash", "code": connect_code("bash", pong.port), "network": true}),
    )
    .await;
    let id = structured(&r)["operation_id"]
        .as_str()
        .expect("id")
        .to_string();
    let r = call(&s, "approval_status", json!({"operation_id": id})).await;
    assert_eq!(structured(&r)["status"], "pending_approval");
    assert!(decide(&s.config, "approve", &id, None).0);
    let r = call(&s, "approval_status", json!({"operation_id": id})).await;
    assert_eq!(structured(&r)["status"], "ok", "{r:?}");
    assert!(
        structured(&r)["stdout"]
            .as_str()
            .unwrap_or("")
            .contains("403 Forbidden")
    );

    // Hostile or unknown ids.
    for bad in ["../../etc/passwd", "00000000-0000-4000-8000-000000000000"] {
        let (ok, out) = decide(&s.config, "approve", bad, None);
        assert!(!ok, "{bad}: {out}");
        let r = call(&s, "approval_status", json!({"operation_id": bad})).await;
        assert_eq!(structured(&r)["status"], "denied", "{bad}");
    }
}

#[tokio::test]
async fn user_confirmed_asks_about_high_risk_but_not_about_suspected_network() {
    let s = start("user_confirmed").await;
    let r = call(
        &s,
        "execute_code",
        json!({"language": "python", "code": "print(1)"}),
    )
    .await;
    assert_eq!(structured(&r)["status"], "ok", "plain code needs nobody");
    let r = call(
        &s,
        "execute_code",
        json!({"language": "python", "code": "exec(input())", "stdin": "print(2)"}),
    )
    .await;
    assert_eq!(
        structured(&r)["status"],
        "pending_approval",
        "dynamic evaluation: {r:?}"
    );
    assert!(
        structured(&r)["reason"]
            .as_str()
            .unwrap_or("")
            .contains("approve"),
        "says how to approve: {r:?}"
    );
    // Code that seems to use the network, from a call that did not ask for it: it would
    // not get the network whatever a human said, so nobody is asked; it runs without, and
    // the result says what was found and how to ask.
    for lang in LANGUAGES {
        let r = call(
            &s,
            "execute_code",
            json!({"language": lang, "code": network_code(lang)}),
        )
        .await;
        let v = structured(&r);
        assert!(
            v["status"] == "ok" || v["status"] == "error",
            "{lang}: it ran: {v}"
        );
        assert_eq!(v["policy"]["detected"], json!(["network"]), "{lang}: {v}");
        assert_eq!(v["policy"]["granted"], json!([]), "{lang}: {v}");
        assert!(
            text(&r).contains("call again with `network` (the hosts it needs, or `true`)"),
            "{lang}: {}",
            text(&r)
        );
    }
}

#[tokio::test]
async fn elicitation_accept_decline_cancel() {
    let pong = Pong::start();
    let code = connect_code("python", pong.port);
    let args = json!({"language": "python", "code": code, "network": true});

    let human = Human::new(ElicitationAction::Accept, true);
    let s = start_with(human.clone(), "user_confirmed").await;
    let r = call(&s, "execute_code", args.clone()).await;
    let v = structured(&r);
    assert_eq!(v["status"], "ok", "{v}");
    assert!(
        v["stdout"].as_str().unwrap_or("").contains("403 Forbidden"),
        "{v}"
    );
    assert_eq!(v["policy"]["decided_by"], "elicitation");
    let asked = human.asked.lock().expect("lock").clone();
    assert_eq!(asked.len(), 1);
    assert!(asked[0].contains("network"), "{asked:?}");
    assert!(asked[0].contains("main.py:"), "findings shown: {asked:?}");

    for (action, approve, word) in [
        (ElicitationAction::Accept, false, "declined"),
        (ElicitationAction::Decline, false, "declined"),
        (ElicitationAction::Cancel, false, "dismissed"),
    ] {
        let s = start_with(Human::new(action.clone(), approve), "user_confirmed").await;
        let r = call(&s, "execute_code", args.clone()).await;
        let v = structured(&r);
        assert_eq!(v["status"], "denied", "{action:?}: {v}");
        assert!(
            v["reason"].as_str().unwrap_or("").contains(word),
            "{action:?}: {v}"
        );
        assert!(!v["stdout"].as_str().unwrap_or("").contains("403 Forbidden"));
    }
}

/// The stateless revision forbids server-to-client requests: the server answers
/// `input_required` with an elicitation and a sealed request state; rmcp's client asks its
/// handler and retries. A tampered state or a changed request is refused.
#[tokio::test]
async fn stateless_input_required_elicitation() {
    use rmcp::model::ProtocolVersion;
    use rmcp::{ClientLifecycleMode, ClientServiceExt};
    let pong = Pong::start();
    let dir = TempDir::new("stateless");
    let config = write_config(&dir, "");
    for (approve, expect) in [(true, "ok"), (false, "denied")] {
        let cfg = config.clone();
        let transport = TokioChildProcess::new(
            tokio::process::Command::new(env!("CARGO_BIN_EXE_gearbox")).configure(move |c| {
                c.arg("--config")
                    .arg(&cfg)
                    .args(["serve", "--gear", "user_confirmed"]);
            }),
        )
        .expect("spawn");
        let human = Human::new(ElicitationAction::Accept, approve);
        let session = human
            .clone()
            .serve_with_lifecycle(
                transport,
                ClientLifecycleMode::Discover {
                    preferred_versions: vec![ProtocolVersion::V_2026_07_28],
                },
            )
            .await
            .expect("server/discover");
        let args = json!({"language": "python", "code": connect_code("python", pong.port), "network": true});
        let r = session
            .call_tool(CallToolRequestParams::new("execute_code").with_arguments(obj(args.clone())))
            .await
            .expect("call");
        let v = r.structured_content.clone().expect("structured");
        assert_eq!(v["status"], expect, "{v}");
        assert_eq!(human.asked.lock().expect("lock").len(), 1);
        if approve {
            assert!(
                v["stdout"].as_str().unwrap_or("").contains("403 Forbidden"),
                "{v}"
            );
            // A forged request state is refused.
            let once = session
                .peer()
                .call_tool_once(
                    CallToolRequestParams::new("execute_code")
                        .with_arguments(obj(args))
                        .with_request_state("rs1.forged.state")
                        .with_input_responses(
                            [(
                                "approval".to_string(),
                                json!({"action": "accept", "content": {"approve": true}}),
                            )]
                            .into(),
                        ),
                )
                .await
                .expect("call once");
            let text = format!("{once:?}");
            assert!(text.contains("denied"), "{text}");
            assert!(!text.contains("403 Forbidden"), "{text}");
        }
    }
}

#[tokio::test]
async fn cli_run_follows_the_gear() {
    let dir = TempDir::new("cli");
    let prog = dir.0.join("net.py");
    std::fs::write(&prog, network_code("python")).expect("write");
    let run = |gear: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_gearbox"))
            .args(["run", "--gear", gear, "--json"])
            .arg(&prog)
            .stdin(std::process::Stdio::null())
            .output()
            .expect("gearbox run")
    };
    let out = run("restricted");
    assert_eq!(out.status.code(), Some(126));
    let v: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert!(
        v["reason"].as_str().unwrap_or("").contains("network"),
        "{v}"
    );
    let no_terminal = |extra: &[&str]| {
        std::process::Command::new("setsid")
            .args([
                "-w",
                env!("CARGO_BIN_EXE_gearbox"),
                "run",
                "--gear",
                "user_confirmed",
                "--json",
            ])
            .args(extra)
            .arg(&prog)
            .stdin(std::process::Stdio::null())
            .output()
            .expect("gearbox run")
    };
    // Network asked for and no terminal to ask: refused with how to proceed.
    let out = no_terminal(&["--network"]);
    assert_eq!(out.status.code(), Some(126), "{out:?}");
    let v: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert!(
        v["reason"].as_str().unwrap_or("").contains("terminal"),
        "{v}"
    );
    // Network only suspected by analysis: nobody is asked, the run goes ahead without it
    // (the program's own lookup fails) instead of being refused.
    let out = no_terminal(&[]);
    let v: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["status"], "error", "{v}");
    assert!(
        v["stderr"]
            .as_str()
            .unwrap_or("")
            .contains("name resolution"),
        "{v}"
    );
}

/// `POST /approvals/ID` needs an approver key of the asking tenant, or an admin key: the
/// agent's own key cannot approve; an approver of another tenant neither sees nor decides
/// the operation ("not found"); an admin sees every tenant's; an approver capped below the
/// run's gear cannot approve it; another tenant's agent can neither resume the operation
/// nor learn that it exists.
#[tokio::test]
async fn http_approvals_need_an_approver_key() {
    use rmcp::transport::StreamableHttpClientTransport;
    use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
    let dir = TempDir::new("http");
    let config = write_config(
        &dir,
        "http_approvers = [\"human\", \"stranger\", \"junior\"]\n\
         [http.keys.human]\ntenant = \"agent\"\n\
         [http.keys.junior]\ntenant = \"agent\"\nmax_gear = \"restricted\"\n\
         [http.keys.boss]\nadmin = true\n",
    );
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_gearbox"))
        .arg("--config")
        .arg(&config)
        .args(["serve", "--gear", "user_confirmed", "--http"])
        .arg(format!("127.0.0.1:{port}"))
        .env(
            "GEARBOX_API_KEYS",
            "agent:agent-key-123456,human:human-key-654321,other:other-key-777777,\
             stranger:stranger-key-88888,boss:boss-key-9999999,junior:junior-key-000000",
        )
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn");
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    for _ in 0..100 {
        if http.get(format!("{base}/healthz")).send().await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(format!("{base}/mcp"))
            .auth_header("agent-key-123456"),
    );
    let session = Plain.serve(transport).await.expect("initialize over HTTP");
    let args =
        json!({"language": "python", "code": "print('approved over http')", "network": true});
    let r = session
        .call_tool(CallToolRequestParams::new("execute_code").with_arguments(obj(args.clone())))
        .await
        .expect("call");
    let v = r.structured_content.clone().expect("s");
    assert_eq!(v["status"], "pending_approval", "{v}");
    let id = v["operation_id"].as_str().expect("id").to_string();
    let post = |key: &'static str, body: Value| {
        http.post(format!("{base}/approvals/{id}"))
            .bearer_auth(key)
            .json(&body)
            .send()
    };
    let r = post("agent-key-123456", json!({"decision": "approve"}))
        .await
        .expect("post");
    assert_eq!(r.status().as_u16(), 403, "the agent's key cannot approve");
    let r = http
        .post(format!("{base}/approvals/{id}"))
        .json(&json!({"decision": "approve"}))
        .send()
        .await
        .expect("post");
    assert_eq!(r.status().as_u16(), 401, "no key");
    // The operator's CLI (the local socket) lists every tenant's, filtered by --tenant.
    let cli = |tenant: &str| -> Value {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_gearbox"))
            .arg("--config")
            .arg(&config)
            .args(["approvals", "--json", "--tenant", tenant])
            .output()
            .expect("gearbox approvals");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("json")
    };
    let mine = cli("agent");
    assert_eq!(mine[0]["operation_id"], json!(id), "{mine}");
    assert_eq!(mine[0]["tenant"], "agent", "{mine}");
    assert_eq!(cli("other"), json!([]));
    // An approver of another tenant: not in its list, "not found" by id, cannot decide.
    let get =
        |key: &'static str, path: String| http.get(format!("{base}{path}")).bearer_auth(key).send();
    let listed: Value = get("stranger-key-88888", "/approvals".into())
        .await
        .expect("list")
        .json()
        .await
        .expect("json");
    assert_eq!(listed, json!([]), "another tenant's approver sees nothing");
    let r = get("stranger-key-88888", format!("/approvals/{id}"))
        .await
        .expect("show");
    assert_eq!(r.status().as_u16(), 404);
    let r = post("stranger-key-88888", json!({"decision": "approve"}))
        .await
        .expect("post");
    assert_eq!(
        r.status().as_u16(),
        404,
        "another tenant's approver cannot decide"
    );
    // An admin (not in http_approvers) sees it, with its tenant and gear.
    let listed: Value = get("boss-key-9999999", "/approvals".into())
        .await
        .expect("list")
        .json()
        .await
        .expect("json");
    assert_eq!(listed[0]["operation_id"], json!(id), "{listed}");
    assert_eq!(listed[0]["tenant"], "agent", "{listed}");
    assert_eq!(listed[0]["gear"], "user_confirmed", "{listed}");
    let r = get("boss-key-9999999", format!("/approvals/{id}"))
        .await
        .expect("show");
    assert_eq!(r.status().as_u16(), 200);
    // An approver of the tenant capped at restricted cannot approve a user_confirmed run.
    let r = post("junior-key-000000", json!({"decision": "approve"}))
        .await
        .expect("post");
    assert_eq!(r.status().as_u16(), 403, "capped approver");
    let r = post("human-key-654321", json!({"decision": "maybe"}))
        .await
        .expect("post");
    assert_eq!(r.status().as_u16(), 400);
    let r = post(
        "human-key-654321",
        json!({"decision": "approve", "reason": "ok"}),
    )
    .await
    .expect("post");
    assert_eq!(r.status().as_u16(), 200);
    let body: Value = r.json().await.expect("json");
    assert_eq!(body["state"], "approved");
    assert_eq!(body["decided_by"], "http:human");
    let r = post("human-key-654321", json!({"decision": "reject"}))
        .await
        .expect("post");
    assert_eq!(r.status().as_u16(), 409, "decided already");
    let mut again = args;
    again["operation_id"] = json!(id);
    // Another tenant cannot resume it, nor learn that it exists.
    let other = Plain
        .serve(StreamableHttpClientTransport::from_config(
            StreamableHttpClientTransportConfig::with_uri(format!("{base}/mcp"))
                .auth_header("other-key-777777"),
        ))
        .await
        .expect("initialize over HTTP");
    for (tool, a) in [
        ("approval_status", json!({"operation_id": id})),
        ("execute_code", again.clone()),
    ] {
        let r = other
            .call_tool(CallToolRequestParams::new(tool).with_arguments(obj(a)))
            .await
            .expect("call");
        let t = text(&r);
        assert_eq!(r.is_error, Some(true), "{tool}: {t}");
        assert!(t.contains("no such operation"), "{tool}: {t}");
        assert!(!t.contains("approved over http"), "{tool}: {t}");
    }
    let _ = other.cancel().await;
    let r = session
        .call_tool(CallToolRequestParams::new("execute_code").with_arguments(obj(again)))
        .await
        .expect("call");
    let v = r.structured_content.clone().expect("s");
    assert_eq!(v["status"], "ok", "{v}");
    assert_eq!(v["stdout"], "approved over http\n");
    let _ = session.cancel().await;
    let _ = child.kill();
    let _ = child.wait();
    let mut sink = String::new();
    let _ = std::io::empty().read_to_string(&mut sink);
}

/// `network` as a list: `user_confirmed` asks about the exact list and the approval binds to
/// it; `[network] full_trust` caps what that gear grants; a bad pattern is an error naming it.
#[tokio::test]
async fn a_network_list_is_asked_about_exactly_bound_and_capped() {
    let cap = "[network]\nfull_trust = [\"*.example.com\"]\n";
    let s = start_configured("user_confirmed", cap).await;
    let args = json!({"language": "python", "code": "print(1)", "network": ["pkgs.example.org", "*.pkgsfiles.example.org"]});
    let r = call(&s, "execute_code", args.clone()).await;
    let v = structured(&r).clone();
    assert_eq!(v["status"], "pending_approval", "{v}");
    assert!(
        text(&r).contains("pkgs.example.org, *.pkgsfiles.example.org"),
        "{}",
        text(&r)
    );
    let id = v["operation_id"]
        .as_str()
        .expect("operation_id")
        .to_string();
    let (ok, out) = decide(&s.config, "approve", &id, None);
    assert!(ok, "{out}");
    let mut wider = args.clone();
    wider["network"] = json!([
        "pkgs.example.org",
        "*.pkgsfiles.example.org",
        "evil.example"
    ]);
    wider["operation_id"] = json!(id);
    let r = call(&s, "execute_code", wider).await;
    assert_eq!(
        structured(&r)["status"],
        "denied",
        "another list is another approval"
    );
    let mut same = args.clone();
    same["operation_id"] = json!(id);
    let r = call(&s, "execute_code", same).await;
    let v = structured(&r);
    assert_eq!(v["status"], "ok", "{v}");
    assert_eq!(
        v["egress"]["granted"],
        json!(["pkgs.example.org", "*.pkgsfiles.example.org"]),
        "{v}"
    );

    let f = start_configured("full_trust", cap).await;
    for (network, want) in [
        (json!(["pkgs.example.org"]), "denied"),
        (json!(true), "denied"),
        (json!(["a.example.com", "*.b.example.com"]), "ok"),
    ] {
        let r = call(
            &f,
            "execute_code",
            json!({"language": "python", "code": "print(1)", "network": network}),
        )
        .await;
        let v = structured(&r);
        assert_eq!(v["status"], want, "{network}: {v}");
        if want == "denied" {
            assert!(
                v["reason"]
                    .as_str()
                    .unwrap_or("")
                    .contains("full_trust gear cannot grant"),
                "{v}"
            );
        }
    }
    let r = call(
        &f,
        "execute_code",
        json!({"language": "python", "code": "print(1)", "network": ["ok.org", "not a host"]}),
    )
    .await;
    assert_eq!(r.is_error, Some(true));
    assert!(text(&r).contains("network[1]"), "{}", text(&r));
}
