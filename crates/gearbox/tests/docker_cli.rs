//! `gearbox run --backend docker` and `gearbox doctor` with the real binary and a real Docker
//! engine. Skips loudly without an engine, unless `GEARBOX_DOCKER_REQUIRED` is set (then it
//! fails): scripts/test.sh sets it once scripts/setup-docker.sh started the engine.

use std::process::Command;

fn gearbox() -> Command {
    Command::new(env!("CARGO_BIN_EXE_gearbox"))
}

/// Whether the engine answers with the default image present, per `gearbox doctor --json`.
fn docker_ready() -> bool {
    let out = gearbox()
        .args(["doctor", "--json"])
        .output()
        .expect("gearbox doctor runs");
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("doctor prints JSON");
    let docker = v["backends"]
        .as_array()
        .and_then(|b| b.iter().find(|b| b["backend"] == "docker"))
        .cloned()
        .expect("doctor reports the docker backend");
    let details = docker["details"].to_string();
    if docker["available"] == true && details.contains("gearbox/python:bookworm present") {
        return true;
    }
    if std::env::var_os("GEARBOX_DOCKER_REQUIRED").is_some() {
        panic!("GEARBOX_DOCKER_REQUIRED is set but doctor says: {details}");
    }
    eprintln!("DOCKER TESTS SKIPPED: gearbox doctor says {details}");
    false
}

#[test]
fn run_with_the_docker_backend_end_to_end() {
    if !docker_ready() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("gearbox-docker-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let prog = dir.join("hello.py");
    std::fs::write(
        &prog,
        "import os, sys\nprint('in', os.getcwd(), 'as', os.getuid(), sys.argv[1:], sys.stdin.read().strip())\nsys.exit(4)\n",
    )
    .expect("write");
    let input = dir.join("in.txt");
    std::fs::write(&input, "from stdin\n").expect("write");
    let out = gearbox()
        .args(["run", "--backend", "docker", "--json", "--stdin"])
        .arg(&input)
        .arg(&prog)
        .args(["--", "arg1"])
        .output()
        .expect("gearbox run");
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(out.status.code(), Some(4), "{out:?}");
    let o: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON outcome");
    assert_eq!(o["backend"], "docker");
    assert_eq!(o["exit_code"], 4);
    assert_eq!(
        o["stdout"], "in /workspace as 65534 ['arg1'] from stdin\n",
        "{o}"
    );

    // The human-readable doctor names the engine and the image.
    let out = gearbox().arg("doctor").output().expect("doctor");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("[ok ] docker"), "{text}");
    assert!(
        text.contains("engine: unix:///var/run/docker.sock answers"),
        "{text}"
    );
    assert!(text.contains("gearbox/python:bookworm present"), "{text}");
    assert!(text.contains("gearbox/runtimes:bookworm present"), "{text}");
}

/// `gearbox run --backend docker` serves every built-in language with the default
/// configuration, not only Python.
#[test]
fn every_language_runs_with_the_docker_backend() {
    if !docker_ready() {
        return;
    }
    for (lang, code) in [
        ("bash", "echo docker $((6*7))"),
        ("javascript", "console.log('docker', 6*7)"),
        (
            "go",
            "package main\n\nimport \"fmt\"\n\nfunc main() { fmt.Println(\"docker\", 6*7) }\n",
        ),
    ] {
        let mut child = gearbox()
            .args([
                "run",
                "--backend",
                "docker",
                "--json",
                "--language",
                lang,
                "-",
            ])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("gearbox run");
        {
            use std::io::Write;
            let mut stdin = child.stdin.take().expect("stdin");
            stdin.write_all(code.as_bytes()).expect("write the program");
        }
        let out = child.wait_with_output().expect("wait");
        let o: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON outcome");
        assert_eq!(o["status"], "ok", "{lang}: {o}");
        assert_eq!(o["backend"], "docker", "{lang}: {o}");
        assert_eq!(o["stdout"], "docker 42\n", "{lang}: {o}");
    }
}
