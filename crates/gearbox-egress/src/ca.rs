//! The CA of a run with secrets, its trust store in the sandbox, and the client side of
//! connections re-encrypted upstream (`intercept.rs` uses all three).
//!
//! The CA is made when the run starts: its key stays in the proxy, its certificate goes into
//! the sandbox's trust store, and it is name-constrained to the secrets' hosts, so even its
//! holder could sign for nothing else.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// Where a host keeps its trusted roots, first found wins (`SSL_CERT_FILE` before these).
const SYSTEM_ROOTS: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
];

/// rustls's ring provider. It offers no post-quantum key exchange (hence rustls's
/// deprecation note); aws-lc-rs would, at the price of a cmake and C build on every fresh
/// machine. Both ends here are short-lived connections of one run.
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    #[allow(deprecated)]
    let p = rustls::crypto::ring::default_provider();
    Arc::new(p)
}

/// The system's root bundle (PEM), as this server finds it.
pub(crate) fn system_roots_file() -> Option<PathBuf> {
    std::env::var_os("SSL_CERT_FILE")
        .map(PathBuf::from)
        .into_iter()
        .chain(SYSTEM_ROOTS.iter().map(PathBuf::from))
        .find(|p| p.is_file())
}

/// The client side of re-encrypted connections: the system's roots and `extra`.
pub(crate) fn upstream_config(extra: &[PathBuf]) -> Result<Arc<rustls::ClientConfig>, String> {
    let mut roots = rustls::RootCertStore::empty();
    let mut files: Vec<PathBuf> = system_roots_file().into_iter().collect();
    files.extend(extra.iter().cloned());
    for file in &files {
        let certs = CertificateDer::pem_file_iter(file)
            .map_err(|e| format!("reading {}: {e}", file.display()))?
            .filter_map(Result::ok);
        let (added, _) = roots.add_parsable_certificates(certs);
        if added == 0 && extra.contains(file) {
            return Err(format!(
                "[network] extra_roots: {} holds no certificate",
                file.display()
            ));
        }
    }
    if roots.is_empty() {
        return Err(
            "no trusted roots: install ca-certificates or set SSL_CERT_FILE, so that \
             connections carrying a secret can be verified upstream"
                .into(),
        );
    }
    let mut config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The CA of one run.
pub(crate) struct RunCa {
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    pem: String,
    /// Server configurations made so far, by host name.
    made: Mutex<HashMap<String, Arc<rustls::ServerConfig>>>,
}

impl RunCa {
    /// A CA that may sign only for `patterns` (host patterns; `*.` and ports dropped).
    pub fn new(patterns: &[String]) -> Result<RunCa, String> {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new())
            .map_err(|e| format!("run CA: {e}"))?;
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
        params.distinguished_name.push(
            rcgen::DnType::CommonName,
            format!("gearbox run {}", uuid::Uuid::new_v4().simple()),
        );
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let mut permitted = Vec::new();
        for p in patterns {
            let host = strip_port(p);
            let host = host.strip_prefix("*.").unwrap_or(host);
            let bare = host.trim_start_matches('[').trim_end_matches(']');
            match bare.parse::<std::net::IpAddr>() {
                Ok(ip) => permitted.push(rcgen::GeneralSubtree::IpAddress(
                    rcgen::CidrSubnet::from_addr_prefix(ip, if ip.is_ipv4() { 32 } else { 128 }),
                )),
                Err(_) => permitted.push(rcgen::GeneralSubtree::DnsName(host.to_string())),
            }
        }
        params.name_constraints = Some(rcgen::NameConstraints {
            permitted_subtrees: permitted,
            excluded_subtrees: Vec::new(),
        });
        let key = rcgen::KeyPair::generate().map_err(|e| format!("run CA key: {e}"))?;
        let cert = params
            .self_signed(&key)
            .map_err(|e| format!("run CA: {e}"))?;
        Ok(RunCa {
            pem: cert.pem(),
            issuer: rcgen::Issuer::new(params, key),
            made: Mutex::new(HashMap::new()),
        })
    }

    /// The CA's certificate (PEM), for the sandbox's trust store.
    pub fn pem(&self) -> &str {
        &self.pem
    }

    /// A server configuration presenting a certificate for `name`, signed by this CA.
    pub(crate) fn server_config(&self, name: &str) -> Result<Arc<rustls::ServerConfig>, String> {
        let mut made = self.made.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = made.get(name) {
            return Ok(c.clone());
        }
        let mut params = rcgen::CertificateParams::new(vec![name.to_string()])
            .map_err(|e| format!("certificate for {name}: {e}"))?;
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.use_authority_key_identifier_extension = true;
        params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        let key = rcgen::KeyPair::generate().map_err(|e| format!("key for {name}: {e}"))?;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(|e| format!("certificate for {name}: {e}"))?;
        let private = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_no_client_auth()
            .with_single_cert(vec![cert.der().clone()], private)
            .map_err(|e| format!("certificate for {name}: {e}"))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let config = Arc::new(config);
        made.insert(name.to_string(), config.clone());
        Ok(config)
    }
}

fn strip_port(pattern: &str) -> &str {
    if pattern.starts_with('[') {
        return match pattern.find(']') {
            Some(i) => &pattern[..=i],
            None => pattern,
        };
    }
    match pattern.rsplit_once(':') {
        Some((h, p)) if p.chars().all(|c| c.is_ascii_digit()) => h,
        _ => pattern,
    }
}

/// Write the run's trust store into `dir`: `ca.pem` (the run's CA alone, for
/// `NODE_EXTRA_CA_CERTS`) and `trust.pem` (the system's roots and the run's CA). Returns the
/// variables that point the usual clients at them.
pub(crate) fn write_trust(dir: &Path, ca: &RunCa) -> Result<Vec<(String, String)>, String> {
    let mut bundle = match system_roots_file() {
        Some(f) => {
            std::fs::read_to_string(&f).map_err(|e| format!("reading {}: {e}", f.display()))?
        }
        None => String::new(),
    };
    if !bundle.is_empty() && !bundle.ends_with('\n') {
        bundle.push('\n');
    }
    bundle.push_str(ca.pem());
    let ca_file = dir.join("ca.pem");
    let trust = dir.join("trust.pem");
    for (path, text) in [(&ca_file, ca.pem()), (&trust, bundle.as_str())] {
        std::fs::write(path, text).map_err(|e| format!("writing {}: {e}", path.display()))?;
    }
    let trust = trust.display().to_string();
    let mut env: Vec<(String, String)> = [
        "SSL_CERT_FILE",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
        "PIP_CERT",
        "GIT_SSL_CAINFO",
    ]
    .iter()
    .map(|k| (k.to_string(), trust.clone()))
    .collect();
    env.push(("NODE_EXTRA_CA_CERTS".into(), ca_file.display().to_string()));
    Ok(env)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_stripped_from_patterns() {
        assert_eq!(strip_port("api.example.com:8443"), "api.example.com");
        assert_eq!(strip_port("*.example.com"), "*.example.com");
        assert_eq!(strip_port("[2001:db8::1]:443"), "[2001:db8::1]");
        assert_eq!(strip_port("[2001:db8::1]"), "[2001:db8::1]");
    }

    #[test]
    fn a_run_ca_signs_for_its_hosts() {
        let ca = RunCa::new(&["api.example.com".into(), "*.example.org:8443".into()]).expect("CA");
        assert!(ca.pem().starts_with("-----BEGIN CERTIFICATE-----"));
        let a = ca.server_config("api.example.com").expect("config");
        let b = ca.server_config("api.example.com").expect("config");
        assert!(Arc::ptr_eq(&a, &b), "made once per name");
        let other = RunCa::new(&["api.example.com".into()]).expect("CA");
        assert_ne!(ca.pem(), other.pem(), "a CA per run");
    }
}
