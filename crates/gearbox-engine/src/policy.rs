//! The safety gear applied to one call (the same for `gearbox serve` and `gearbox run`): what the run needs (asked for by the call, or found
//! by static analysis), and what the gear does about it (allow, ask a human, deny).
//!
//! Analysis is advice; the sandbox is the enforcement. A capability the gear does not grant
//! is simply absent from the sandbox (no network namespace interface, no package layer).

use std::collections::BTreeSet;

use gearbox_analysis::{Analysis, Finding, Risk};
use gearbox_core::{Capability, ExecRequest, Gear, LanguageTable};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// What the gear decided for a call, as the caller sees it in the result (`policy`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PolicyReport {
    /// The gear the call ran under (the server's, or the lower one the call passed).
    pub gear: Gear,
    /// Risk as analysis rated it: `low`, `medium` or `high`; `high` includes "cannot tell"
    /// (dynamic evaluation).
    pub risk: Risk,
    /// Capabilities the call asked for.
    pub requested: Vec<Capability>,
    /// Capabilities the code appears to need, by analysis.
    pub detected: Vec<Capability>,
    /// Capabilities the run was given.
    pub granted: Vec<Capability>,
    /// Who decided: `gear` (no human needed), `human` (out-of-band approval), `elicitation`.
    pub decided_by: String,
    /// What analysis found: file, line, category, capability, what.
    pub findings: Vec<Finding>,
    /// The pending (or used) approval, when a human was asked out of band.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub operation_id: Option<String>,
}

/// What the gear does with a call.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Run, with these capabilities.
    Allow(BTreeSet<Capability>),
    /// A human must decide about these capabilities (empty: about high risk alone).
    Ask(BTreeSet<Capability>),
    /// Refused, with the reason (findings included).
    Deny(String),
}

/// The gear's evaluation of one request.
#[derive(Debug, Clone)]
pub struct Evaluation {
    pub report: PolicyReport,
    pub verdict: Verdict,
}

/// Capabilities a request asks for through its arguments.
pub fn requested(req: &ExecRequest) -> BTreeSet<Capability> {
    let mut caps = BTreeSet::new();
    if req.network.is_on() {
        caps.insert(Capability::Network);
    }
    if !req.packages.is_empty() {
        caps.insert(Capability::Packages);
    }
    caps
}

/// Analyse the files of `req` that are written in its language: the entrypoint and the
/// UTF-8 extra files with one of the language's extensions.
pub fn analyse(table: &LanguageTable, req: &ExecRequest) -> Analysis {
    let entry = req.entrypoint.clone().unwrap_or_else(|| {
        table
            .get(&req.language)
            .map(|s| s.entrypoint.clone())
            .unwrap_or_else(|| "main".into())
    });
    let exts: Vec<String> = table
        .get(&req.language)
        .map(|s| s.extensions.clone())
        .unwrap_or_default();
    let mut files: Vec<(&str, &str)> = vec![(entry.as_str(), req.code.as_str())];
    for f in &req.files {
        let same_language = exts.iter().any(|e| {
            f.filename
                .rsplit_once('.')
                .is_some_and(|(_, x)| x.eq_ignore_ascii_case(e.trim_start_matches('.')))
        });
        if same_language && f.encoding == gearbox_core::Encoding::Utf8 {
            files.push((f.filename.as_str(), f.content.as_str()));
        }
    }
    gearbox_analysis::analyze(&req.language, &files)
}

/// Apply `gear` to a request that asks for `requested` and whose code analysis gave
/// `analysis`.
///
/// - `read_only`: nothing runs.
/// - `restricted`: every capability is denied, asked for or detected; the refusal lists the
///   findings so the code can be rewritten. High risk alone runs (the sandbox holds).
/// - `user_confirmed`: a capability the call asked for, and (with `ask_on_high_risk`) high
///   risk, go to a human. A capability only detected is not granted, so it is not asked
///   about either: the run goes ahead without it, and the report names it (`detected`) so
///   the caller can ask for it.
/// - `full_trust`: capabilities the call asked for are granted; detected ones are reported
///   but not granted unasked (least privilege: analysis can be wrong both ways).
pub fn evaluate(
    gear: Gear,
    requested: BTreeSet<Capability>,
    analysis: Analysis,
    ask_on_high_risk: bool,
) -> Evaluation {
    let detected: BTreeSet<Capability> = analysis.needs.clone();
    let mut report = PolicyReport {
        gear,
        risk: analysis.risk,
        requested: requested.iter().copied().collect(),
        detected: detected.iter().copied().collect(),
        granted: Vec::new(),
        decided_by: "gear".into(),
        findings: analysis.findings.clone(),
        operation_id: None,
    };
    let verdict = match gear {
        Gear::ReadOnly => Verdict::Deny(
            "the server runs in the read_only gear: nothing executes (resources and discovery \
             still work)"
                .into(),
        ),
        Gear::Restricted => {
            let needs: BTreeSet<Capability> = requested.union(&detected).copied().collect();
            if needs.is_empty() {
                Verdict::Allow(BTreeSet::new())
            } else {
                Verdict::Deny(refusal(gear, &requested, &detected, &analysis))
            }
        }
        Gear::UserConfirmed => {
            let risky = ask_on_high_risk && analysis.risk == Risk::High;
            if requested.is_empty() && !risky {
                Verdict::Allow(BTreeSet::new())
            } else {
                Verdict::Ask(requested.clone())
            }
        }
        Gear::FullTrust => Verdict::Allow(requested.clone()),
    };
    if let Verdict::Allow(granted) = &verdict {
        report.granted = granted.iter().copied().collect();
    }
    Evaluation { report, verdict }
}

fn refusal(
    gear: Gear,
    requested: &BTreeSet<Capability>,
    detected: &BTreeSet<Capability>,
    analysis: &Analysis,
) -> String {
    let mut text = String::new();
    if !requested.is_empty() {
        text.push_str(&format!(
            "the {gear} gear denies {}, which this call asked for. ",
            names(requested)
        ));
    }
    let only_detected: BTreeSet<Capability> = detected.difference(requested).copied().collect();
    if !only_detected.is_empty() {
        text.push_str(&format!(
            "The code appears to need {}, which the {gear} gear denies; rewrite it without \
             that, or ask the operator for a higher gear. ",
            names(&only_detected)
        ));
    }
    let summary = analysis.summary();
    if !summary.is_empty() {
        text.push_str("Findings:\n");
        text.push_str(&summary);
    }
    text.trim_end().to_string()
}

/// Whether the network a call asks for is within what `gear` may grant (`[network]`'s
/// per-gear caps); the refusal says what is over. `restricted` and `read_only` are left to
/// [`evaluate`], which refuses any capability there with the findings.
pub fn network_within_gear(
    gear: Gear,
    network: &gearbox_core::Network,
    config: &gearbox_egress::NetworkConfig,
) -> Result<(), String> {
    if !network.is_on() || matches!(gear, Gear::ReadOnly | Gear::Restricted) {
        return Ok(());
    }
    let cap = config.cap(gear)?;
    network
        .within(&cap)
        .map_err(|e| format!("the {gear} gear cannot grant this network: {e} ([network] {gear})"))
}

/// `network`, `network and packages`, ...
pub fn names(caps: &BTreeSet<Capability>) -> String {
    let v: Vec<&str> = caps.iter().map(|c| c.as_str()).collect();
    match v.len() {
        0 => "nothing".into(),
        1 => v[0].into(),
        _ => format!("{} and {}", v[..v.len() - 1].join(", "), v[v.len() - 1]),
    }
}

/// The question put to a human: what the code wants and why.
pub fn question(
    language: &str,
    packages: &[String],
    network: &gearbox_core::Network,
    caps: &BTreeSet<Capability>,
    analysis: &PolicyReport,
) -> String {
    let mut q = if caps.is_empty() {
        format!(
            "A {language} program rated {} risk by static analysis wants to run in the \
             sandbox (no extra capabilities).",
            analysis.risk
        )
    } else {
        format!(
            "A {language} program wants {} for one run in the sandbox.",
            names(caps)
        )
    };
    if caps.contains(&Capability::Network) && network.is_on() {
        q.push_str(&format!(
            "\nNetwork, through gearbox's egress proxy only (never the host's loopback or \
             private networks): {}",
            network.describe()
        ));
    }
    if caps.contains(&Capability::Packages) && !packages.is_empty() {
        q.push_str(&format!(
            "\nPackages to install (outside the sandbox, into a read-only layer): {}",
            packages.join(", ")
        ));
    }
    if !analysis.findings.is_empty() {
        q.push_str("\nFindings:");
        for f in analysis.findings.iter().take(12) {
            q.push_str(&format!(
                "\n  {}:{}: {} — {}",
                f.file, f.line, f.category, f.what
            ));
        }
        if analysis.findings.len() > 12 {
            q.push_str(&format!("\n  … {} more", analysis.findings.len() - 12));
        }
    }
    q
}

/// SHA-256 over everything that determines what a run does: the approval binds to it, so a
/// changed program (or its files, arguments, environment, input, limits or capabilities)
/// needs a new approval.
pub fn request_hash(req: &ExecRequest, caps: &BTreeSet<Capability>) -> String {
    let mut h = Sha256::new();
    let mut field = |name: &str, bytes: &[u8]| {
        h.update((name.len() as u64).to_le_bytes());
        h.update(name.as_bytes());
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    };
    field("language", req.language.as_bytes());
    field("code", req.code.as_bytes());
    field(
        "entrypoint",
        req.entrypoint.as_deref().unwrap_or("").as_bytes(),
    );
    for f in &req.files {
        field("file.name", f.filename.as_bytes());
        field("file.content", f.content.as_bytes());
        field(
            "file.encoding",
            match f.encoding {
                gearbox_core::Encoding::Utf8 => b"utf8",
                gearbox_core::Encoding::Base64 => b"base64",
            },
        );
    }
    field("stdin", &req.stdin);
    for a in &req.args {
        field("arg", a.as_bytes());
    }
    for (k, v) in &req.env {
        field("env.name", k.as_bytes());
        field("env.value", v.as_bytes());
    }
    for p in &req.packages {
        field("package", p.as_bytes());
    }
    // The exact grant asked for: approving `data.example.org` is not approving any host.
    for p in req.network.patterns() {
        field("network", p.as_bytes());
    }
    let limits = serde_json::to_vec(&req.limits).unwrap_or_default();
    field("limits", &limits);
    for c in caps {
        field("capability", c.as_str().as_bytes());
    }
    let digest = h.finalize();
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// The hash a human's approval binds to: [`request_hash`], bound also to the downstream
/// tools the run may call (its `allow_tools` and their limits, as text) when it has any.
pub fn approval_hash(
    req: &ExecRequest,
    caps: &BTreeSet<Capability>,
    tools: Option<&str>,
) -> String {
    let base = request_hash(req, caps);
    match tools {
        None => base,
        Some(t) => {
            let digest = Sha256::digest(format!("{base}\n{t}").as_bytes());
            digest.iter().map(|b| format!("{b:02x}")).collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(language: &str, code: &str) -> ExecRequest {
        ExecRequest {
            language: language.into(),
            code: code.into(),
            ..Default::default()
        }
    }

    fn eval(gear: Gear, r: &ExecRequest) -> Evaluation {
        let table = LanguageTable::builtin();
        evaluate(gear, requested(r), analyse(&table, r), true)
    }

    #[test]
    fn read_only_denies_even_harmless_code() {
        let e = eval(Gear::ReadOnly, &req("python", "print(1)"));
        assert!(matches!(e.verdict, Verdict::Deny(ref m) if m.contains("read_only")));
    }

    #[test]
    fn restricted_refuses_detected_network_with_findings() {
        let e = eval(
            Gear::Restricted,
            &req("python", "import requests\nrequests.get('http://x')\n"),
        );
        let Verdict::Deny(msg) = e.verdict else {
            panic!("expected a refusal, got {:?}", e.verdict)
        };
        assert!(msg.contains("network"), "{msg}");
        assert!(msg.contains("main.py:1"), "{msg}");
        assert_eq!(e.report.detected, vec![Capability::Network]);
    }

    #[test]
    fn restricted_refuses_requested_network_and_runs_plain_code() {
        let mut r = req("python", "print(1)");
        assert_eq!(
            eval(Gear::Restricted, &r).verdict,
            Verdict::Allow(BTreeSet::new())
        );
        r.network = gearbox_core::Network::Any;
        assert!(
            matches!(eval(Gear::Restricted, &r).verdict, Verdict::Deny(ref m) if m.contains("asked for"))
        );
    }

    #[test]
    fn user_confirmed_asks_for_requested_capabilities_and_high_risk_only() {
        assert_eq!(
            eval(Gear::UserConfirmed, &req("python", "print(1)")).verdict,
            Verdict::Allow(BTreeSet::new())
        );
        // Network only suspected: not granted, so nobody is asked; the report says it.
        let mut r = req("bash", "curl https://example.com\n");
        let e = eval(Gear::UserConfirmed, &r);
        assert_eq!(e.verdict, Verdict::Allow(BTreeSet::new()));
        assert_eq!(e.report.detected, vec![Capability::Network]);
        assert!(e.report.granted.is_empty());
        r.network = gearbox_core::Network::Any;
        let e = eval(Gear::UserConfirmed, &r);
        assert_eq!(e.verdict, Verdict::Ask([Capability::Network].into()));
        let e = eval(
            Gear::UserConfirmed,
            &req("javascript", "eval(process.argv[2])\n"),
        );
        assert_eq!(e.verdict, Verdict::Ask(BTreeSet::new()));
    }

    #[test]
    fn full_trust_grants_what_was_asked_for_only() {
        let mut r = req("python", "import socket\n");
        assert_eq!(
            eval(Gear::FullTrust, &r).verdict,
            Verdict::Allow(BTreeSet::new())
        );
        r.network = gearbox_core::Network::Any;
        assert_eq!(
            eval(Gear::FullTrust, &r).verdict,
            Verdict::Allow([Capability::Network].into())
        );
    }

    #[test]
    fn comments_do_not_count() {
        let e = eval(
            Gear::Restricted,
            &req("python", "# import socket\nprint(1)\n"),
        );
        assert_eq!(e.verdict, Verdict::Allow(BTreeSet::new()));
    }

    #[test]
    fn the_hash_binds_code_files_and_capabilities() {
        let a = req("python", "print(1)");
        let mut b = a.clone();
        b.code = "print(2)".into();
        let none = BTreeSet::new();
        let net: BTreeSet<_> = [Capability::Network].into();
        assert_eq!(request_hash(&a, &none), request_hash(&a.clone(), &none));
        assert_ne!(request_hash(&a, &none), request_hash(&b, &none));
        assert_ne!(request_hash(&a, &none), request_hash(&a, &net));
        let mut c = a.clone();
        c.env.insert("X".into(), "1".into());
        assert_ne!(request_hash(&a, &none), request_hash(&c, &none));
    }
}
