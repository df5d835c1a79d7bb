//! The files a run without a session leaves under `/work/outputs/` come back with its
//! outcome, on every path a run can take (`integrity::paths`: cold; a fork server for Python
//! and JavaScript where the host has root and cgroups; a helper-built warm sandbox for bash,
//! which has no fork server). Each check names the path in its failure message.

use gearbox_core::{Outcome, OutputFile, Status};

use crate::integrity::{on, paths};
use crate::support::run;

/// Writes `outputs/a.csv` and `outputs/sub/b.png` (binary) in each language.
fn writer(language: &str) -> &'static str {
    match language {
        "python" => {
            "import os\nos.makedirs('/work/outputs/sub')\n\
             open('/work/outputs/a.csv', 'w').write('x,y\\n1,2\\n')\n\
             open('/work/outputs/sub/b.png', 'wb').write(bytes(range(256)) * 4)\nprint('done')\n"
        }
        "javascript" => {
            "const fs = require('fs');\nfs.mkdirSync('/work/outputs/sub', { recursive: true });\n\
             fs.writeFileSync('/work/outputs/a.csv', 'x,y\\n1,2\\n');\n\
             const b = Buffer.alloc(1024); for (let i = 0; i < 1024; i++) b[i] = i % 256;\n\
             fs.writeFileSync('/work/outputs/sub/b.png', b);\nconsole.log('done');\n"
        }
        _ => {
            "mkdir -p /work/outputs/sub\nprintf 'x,y\\n1,2\\n' > /work/outputs/a.csv\n\
             for n in $(seq 0 255); do printf \"\\\\$(printf %03o $n)\"; done > /tmp/b\n\
             cat /tmp/b /tmp/b /tmp/b /tmp/b > /work/outputs/sub/b.png\necho done\n"
        }
    }
}

fn names(o: &Outcome) -> Vec<(&str, &str, u64)> {
    o.outputs
        .iter()
        .map(|f: &OutputFile| (f.path.as_str(), f.mime_type.as_str(), f.size))
        .collect()
}

#[tokio::test]
async fn outputs_come_back_on_every_path() {
    let png: Vec<u8> = (0..4).flat_map(|_| 0..=255u8).collect();
    for language in ["python", "javascript", "bash"] {
        for (path, engine) in paths(language) {
            let o = on(&path, &engine, run(language, writer(language))).await;
            let path = format!("{language} {path}");
            assert_eq!(o.status, Status::Ok, "{path}: {o:?}");
            assert_eq!(o.stdout, "done\n", "{path}");
            assert_eq!(
                names(&o),
                [
                    ("outputs/a.csv", "text/csv", 8),
                    ("outputs/sub/b.png", "image/png", 1024)
                ],
                "{path}: {:?}",
                o.outputs_skipped
            );
            assert_eq!(o.outputs[0].content, b"x,y\n1,2\n", "{path}");
            assert_eq!(o.outputs[1].content, png, "{path}");
            assert!(
                o.outputs_skipped.is_empty(),
                "{path}: {:?}",
                o.outputs_skipped
            );
            // The structured outcome names them, without their bytes.
            let v = serde_json::to_value(&o).expect("json");
            assert_eq!(v["outputs"][1]["size"], 1024, "{path}: {v}");
            assert!(v["outputs"][1].get("content").is_none(), "{path}: {v}");
        }
    }
}

#[tokio::test]
async fn a_run_without_outputs_brings_none() {
    for language in ["python", "bash"] {
        for (path, engine) in paths(language) {
            let code = if language == "python" {
                "import os\nos.makedirs('/work/outputs')\nprint('hi')\n"
            } else {
                "echo hi > /work/not-outputs.txt; echo hi\n"
            };
            let o = on(&path, &engine, run(language, code)).await;
            assert_eq!(
                (o.status, o.stdout.as_str()),
                (Status::Ok, "hi\n"),
                "{path}"
            );
            assert!(
                o.outputs.is_empty() && o.outputs_skipped.is_empty(),
                "{path}: {o:?}"
            );
        }
    }
}

/// A symlink to /etc/passwd, a fifo, a file larger than the bounds and more files than
/// they allow: skipped with a note, never followed, never blocking; what fits comes back.
#[tokio::test]
async fn links_fifos_and_oversized_outputs_are_skipped_with_a_note() {
    let python = "import os\nos.makedirs('/work/outputs/many')\n\
         os.symlink('/etc/passwd', '/work/outputs/passwd')\n\
         os.symlink('/', '/work/outputs/root')\n\
         os.mkfifo('/work/outputs/fifo')\n\
         open('/work/outputs/huge.bin', 'wb').write(b'h' * (9 << 20))\n\
         open('/work/outputs/a.txt', 'w').write('small')\n\
         for i in range(20):\n    open('/work/outputs/many/%02d.txt' % i, 'w').write(str(i))\n";
    let bash = "mkdir -p /work/outputs/many\nln -s /etc/passwd /work/outputs/passwd\n\
         ln -s / /work/outputs/root\nmkfifo /work/outputs/fifo\n\
         head -c $((9 << 20)) /dev/zero > /work/outputs/huge.bin\nprintf small > /work/outputs/a.txt\n\
         for i in $(seq -w 0 19); do printf $i > /work/outputs/many/$i.txt; done\n";
    for (language, code) in [("python", python), ("bash", bash)] {
        for (path, engine) in paths(language) {
            let o = on(&path, &engine, run(language, code)).await;
            let path = format!("{language} {path}");
            assert_eq!(o.status, Status::Ok, "{path}: {o:?}");
            let got: Vec<&str> = o.outputs.iter().map(|f| f.path.as_str()).collect();
            assert_eq!(got.len(), 16, "{path}: {got:?}");
            assert_eq!(got[0], "outputs/a.txt", "{path}: {got:?}");
            assert!(
                got.iter()
                    .all(|p| *p == "outputs/a.txt" || p.starts_with("outputs/many/")),
                "{path}: {got:?}"
            );
            assert!(
                o.outputs.iter().all(|f| !f.content.starts_with(b"root:")),
                "{path}: /etc/passwd came back"
            );
            let notes = o.outputs_skipped.join("\n");
            for (name, why) in [
                ("outputs/passwd", "symlink"),
                ("outputs/root", "symlink"),
                ("outputs/fifo", "fifo"),
                ("outputs/huge.bin", "past the limit"),
                ("outputs/many/19.txt", "past the limit of 16 files"),
            ] {
                assert!(
                    o.outputs_skipped
                        .iter()
                        .any(|n| n.contains(name) && n.contains(why)),
                    "{path}: no note for {name} ({why}): {notes}"
                );
            }
        }
    }
}

/// A process the program leaves behind, still writing into `/work/outputs` and deaf to
/// SIGTERM, is stopped when the program ends: the run ends by itself (not by its wall
/// clock) and what is read is a settled tree.
#[tokio::test]
async fn a_background_writer_does_not_keep_the_run_alive() {
    let python = "import os, signal, time\nos.makedirs('/work/outputs')\n\
         open('/work/outputs/first.txt', 'w').write('first')\n\
         if os.fork() == 0:\n    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n    os.setsid()\n\
         \x20   n = 0\n    while True:\n        n += 1\n\
         \x20       open('/work/outputs/bg.txt', 'w').write(str(n))\n\
         time.sleep(0.2)\nprint('parent done')\n";
    let bash = "mkdir -p /work/outputs\nprintf first > /work/outputs/first.txt\n\
         ( trap '' TERM; n=0; while true; do n=$((n+1)); echo $n > /work/outputs/bg.txt; done ) &\n\
         sleep 0.2\necho parent done\n";
    for (language, code) in [("python", python), ("bash", bash)] {
        for (path, engine) in paths(language) {
            let o = on(&path, &engine, run(language, code)).await;
            let path = format!("{language} {path}");
            assert_eq!(o.status, Status::Ok, "{path}: {o:?}");
            assert_eq!(o.stdout, "parent done\n", "{path}");
            let first = o.outputs.iter().find(|f| f.path == "outputs/first.txt");
            assert_eq!(
                first.map(|f| f.content.as_slice()),
                Some(&b"first"[..]),
                "{path}: {:?}",
                o.outputs_skipped
            );
        }
    }
}

/// `gearbox run --outputs DIR` writes the outputs into DIR; an existing file there is not
/// overwritten.
#[test]
fn gearbox_run_writes_outputs_into_a_directory() {
    use std::io::Write;
    let dir = std::env::temp_dir().join(format!("gearbox-run-outputs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let run = |dir: &std::path::Path| {
        let mut child = std::process::Command::new(crate::support::gearbox_bin())
            .args(["run", "--language", "python", "--outputs"])
            .arg(dir)
            .arg("-")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn gearbox run");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(writer("python").as_bytes())
            .expect("write");
        child.wait_with_output().expect("wait")
    };
    let out = run(&dir);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(out.stdout, b"done\n");
    assert_eq!(
        std::fs::read(dir.join("a.csv")).expect("a.csv"),
        b"x,y\n1,2\n"
    );
    let png: Vec<u8> = (0..4).flat_map(|_| 0..=255u8).collect();
    assert_eq!(std::fs::read(dir.join("sub/b.png")).expect("b.png"), png);
    // Again into the same directory: refused, the file kept.
    std::fs::write(dir.join("a.csv"), "mine").expect("write");
    let out = run(&dir);
    assert!(!out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("a.csv"),
        "{out:?}"
    );
    assert_eq!(std::fs::read(dir.join("a.csv")).expect("a.csv"), b"mine");
    std::fs::remove_dir_all(&dir).expect("rm");
}

/// `gearbox run --files DIR` takes DIR's regular files, named relative to it, and leaves out
/// what is neither a file nor a directory (a FIFO, which a read would block on, a symlink);
/// a tree larger than a run takes stops the walk with an error naming where, instead of
/// reading it all.
#[test]
fn gearbox_run_files_takes_regular_files_and_stops_at_the_limit() {
    let dir = std::env::temp_dir().join(format!("gearbox-run-files-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("b")).expect("mkdir");
    std::fs::write(dir.join("a.txt"), "A").expect("write");
    std::fs::write(dir.join("b/c.txt"), "C").expect("write");
    std::os::unix::fs::symlink("/etc/hostname", dir.join("link")).expect("symlink");
    let fifo = std::ffi::CString::new(dir.join("fifo").into_os_string().into_encoded_bytes())
        .expect("path");
    // SAFETY: mkfifo reads the NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0, "mkfifo");
    let run = |files: &std::path::Path| {
        let script = std::env::temp_dir().join(format!("gearbox-files-{}.py", std::process::id()));
        std::fs::write(
            &script,
            "import os\nfor d, _, fs in sorted(os.walk('.')):\n    for f in sorted(fs):\n        p = os.path.join(d, f)[2:]\n        print(p, open(p).read())\n",
        )
        .expect("script");
        std::process::Command::new(crate::support::gearbox_bin())
            .args(["run", "--files"])
            .arg(files)
            .arg(&script)
            .output()
            .expect("gearbox run")
    };
    let out = run(&dir);
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("a.txt A\n"), "{stdout}");
    assert!(stdout.contains("b/c.txt C\n"), "{stdout}");
    assert!(
        !stdout.contains("fifo") && !stdout.contains("link"),
        "{stdout}"
    );
    // More files than a run takes: an error at once, naming the limit.
    let many = dir.join("many");
    std::fs::create_dir(&many).expect("mkdir");
    for i in 0..300 {
        std::fs::write(many.join(format!("f{i}")), "x").expect("write");
    }
    let out = run(&many);
    assert!(!out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("more than 256 files"), "{stderr}");
    // The bytes are counted as read, against the workspace's size: three binary files of 300
    // KiB fit a 1 MiB workspace (base64 they would be 1.2 MB), a fourth does not.
    let config = dir.join("small.toml");
    std::fs::write(&config, "[limits]\ndisk_mb = 1\n").expect("config");
    let binary = dir.join("binary");
    std::fs::create_dir(&binary).expect("mkdir");
    let blob: Vec<u8> = (0..300 * 1024).map(|i| (i % 251) as u8 | 0x80).collect();
    let script = dir.join("sizes.py");
    std::fs::write(
        &script,
        "import os\nprint(sorted(os.path.getsize(f) for f in os.listdir('.') if f.startswith('blob')))\n",
    )
    .expect("script");
    let sized = |files: &std::path::Path| {
        std::process::Command::new(crate::support::gearbox_bin())
            .arg("--config")
            .arg(&config)
            .args(["run", "--files"])
            .arg(files)
            .arg(&script)
            .output()
            .expect("gearbox run")
    };
    for name in ["blob1", "blob2", "blob3"] {
        std::fs::write(binary.join(name), &blob).expect("blob");
    }
    let out = sized(&binary);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "[307200, 307200, 307200]\n"
    );
    std::fs::write(binary.join("blob4"), &blob).expect("blob");
    let out = sized(&binary);
    assert!(!out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("more than 1 MiB"), "{stderr}");
    std::fs::remove_dir_all(&dir).expect("rm");
}
