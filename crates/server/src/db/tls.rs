//! TLS to Postgres on rustls, with libpq's `sslmode` and `sslrootcert`.
//!
//! tokio-postgres understands `sslmode` `disable`, `prefer` and `require`
//! only, and takes no CA. libpq's meanings are kept here:
//!
//! | `sslmode` | encrypted | certificate checked |
//! |---|---|---|
//! | `disable` | never | - |
//! | `prefer` (the default) | if the server offers it | no |
//! | `require` | always | no (as `verify-ca` when `sslrootcert` is given, as libpq does) |
//! | `verify-ca` | always | chain to a trusted CA |
//! | `verify-full` | always | chain, and the name matches the host |
//!
//! The trusted CAs are the `sslrootcert` file (PEM) when given, else the
//! system's (`/etc/ssl/certs`).

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use anyhow::{bail, Context as _};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio_postgres::config::SslMode as PgSslMode;

pub use crate::settings::SslMode;
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres_rustls::MakeRustlsConnect;

/// The connector every connection of the service goes through: rustls,
/// with the certificate policy of its [`TlsSettings`]. Cheap to clone.
#[derive(Clone)]
pub struct Tls(MakeRustlsConnect);

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tls").finish_non_exhaustive()
    }
}

impl<S> MakeTlsConnect<S> for Tls
where
    MakeRustlsConnect: MakeTlsConnect<S>,
{
    type Stream = <MakeRustlsConnect as MakeTlsConnect<S>>::Stream;
    type TlsConnect = <MakeRustlsConnect as MakeTlsConnect<S>>::TlsConnect;
    type Error = <MakeRustlsConnect as MakeTlsConnect<S>>::Error;

    fn make_tls_connect(&mut self, domain: &str) -> Result<Self::TlsConnect, Self::Error> {
        self.0.make_tls_connect(domain)
    }
}

impl SslMode {
    /// The mode tokio-postgres is told: the verifying modes are `require`
    /// there, and the connector does the checking.
    pub fn for_tokio_postgres(self) -> PgSslMode {
        match self {
            Self::Disable => PgSslMode::Disable,
            Self::Prefer => PgSslMode::Prefer,
            Self::Require | Self::VerifyCa | Self::VerifyFull => PgSslMode::Require,
        }
    }
}

/// How connections to Postgres use TLS.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsSettings {
    /// libpq's `sslmode`.
    pub mode: SslMode,
    /// A PEM file of the CAs to trust instead of the system's.
    pub root_cert: Option<PathBuf>,
}

/// Parses a connection string (URL or `key=value` form), taking out
/// `sslmode` and `sslrootcert`, which tokio-postgres does not fully
/// understand, and applying the mode to the returned config.
///
/// # Errors
///
/// A malformed string, or an unknown `sslmode`.
pub fn parse_url(url: &str) -> anyhow::Result<(tokio_postgres::Config, TlsSettings)> {
    let (config, tls, _) = parse_url_with_target(url)?;
    Ok((config, tls))
}

/// As [`parse_url`], also taking out libpq's `target_session_attrs`
/// (tokio-postgres refuses `primary`, `standby` and `prefer-standby`):
/// `None` when the string has none.
///
/// # Errors
///
/// As [`parse_url`], and an unknown `target_session_attrs`.
pub fn parse_url_with_target(
    url: &str,
) -> anyhow::Result<(
    tokio_postgres::Config,
    TlsSettings,
    Option<pgbatch::pg::TargetSessionAttrs>,
)> {
    let mut tls = TlsSettings::default();
    let mut attrs = None;
    let mut take = |key: &str, value: &str| -> anyhow::Result<bool> {
        match key {
            "sslmode" => tls.mode = SslMode::parse(value)?,
            "sslrootcert" => tls.root_cert = Some(PathBuf::from(value)),
            "target_session_attrs" => attrs = Some(value.parse()?),
            _ => return Ok(false),
        }
        Ok(true)
    };
    let rest = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        match url.split_once('?') {
            Some((base, query)) => {
                let mut kept = Vec::new();
                for pair in query.split('&').filter(|p| !p.is_empty()) {
                    let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
                    let value = percent_encoding::percent_decode_str(value)
                        .decode_utf8()
                        .context("DATABASE_URL: a parameter is not valid UTF-8")?;
                    if !take(key, &value)? {
                        kept.push(pair);
                    }
                }
                if kept.is_empty() {
                    base.to_owned()
                } else {
                    format!("{base}?{}", kept.join("&"))
                }
            }
            None => url.to_owned(),
        }
    } else {
        // `key=value` pairs; values with spaces would be quoted, and these
        // two keys never need that.
        let mut kept = Vec::new();
        for pair in url.split_whitespace() {
            match pair.split_once('=') {
                Some((key, value)) if take(key, value.trim_matches('\''))? => {}
                _ => kept.push(pair),
            }
        }
        kept.join(" ")
    };
    let mut config: tokio_postgres::Config = rest
        .parse()
        .context("DATABASE_URL is not a valid Postgres connection string")?;
    config.ssl_mode(tls.mode.for_tokio_postgres());
    Ok((config, tls, attrs))
}

/// The connector for `settings`.
///
/// # Errors
///
/// When the CA file cannot be read or holds no certificate, or a mode that
/// checks certificates finds no trusted CA at all.
pub fn connector(settings: &TlsSettings) -> anyhow::Result<Tls> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verify = match (settings.mode, &settings.root_cert) {
        (SslMode::VerifyFull, _) => Verify::Full,
        (SslMode::VerifyCa, _) | (SslMode::Require, Some(_)) => Verify::Chain,
        _ => Verify::Nothing,
    };
    let verifier: Arc<dyn ServerCertVerifier> = match verify {
        Verify::Nothing => Arc::new(AcceptAny(Arc::clone(&provider))),
        Verify::Chain | Verify::Full => {
            let roots = match &settings.root_cert {
                Some(path) => roots_from(path)?,
                None => system_roots()?,
            };
            let webpki =
                WebPkiServerVerifier::builder_with_provider(Arc::new(roots), Arc::clone(&provider))
                    .build()
                    .context("could not set up certificate verification")?;
            if verify == Verify::Full {
                webpki
            } else {
                Arc::new(AnyName(webpki))
            }
        }
    };
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("no TLS protocol version available")?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    Ok(Tls(MakeRustlsConnect::new(config)))
}

/// A connector for configs that did not name a TLS policy: libpq's
/// default, `prefer`, encrypting when the server offers it. Built once.
pub fn default_connector() -> Tls {
    static DEFAULT: OnceLock<Tls> = OnceLock::new();
    DEFAULT
        .get_or_init(|| connector(&TlsSettings::default()).expect("prefer needs no CA file"))
        .clone()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verify {
    Nothing,
    Chain,
    Full,
}

fn roots_from(path: &Path) -> anyhow::Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(path)
        .with_context(|| format!("could not read sslrootcert {}", path.display()))?;
    for cert in certs {
        let cert = cert.with_context(|| format!("sslrootcert {} is not PEM", path.display()))?;
        roots
            .add(cert)
            .with_context(|| format!("sslrootcert {}: unusable certificate", path.display()))?;
    }
    if roots.is_empty() {
        bail!("sslrootcert {} holds no certificate", path.display());
    }
    Ok(roots)
}

fn system_roots() -> anyhow::Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    let found = rustls_native_certs::load_native_certs();
    let (added, _ignored) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        bail!(
            "certificate verification needs trusted CAs, and none were found on this system: \
             give sslrootcert, or install the ca-certificates package"
        );
    }
    Ok(roots)
}

/// `verify-ca`: the chain is checked, the name is not (libpq's meaning).
#[derive(Debug)]
struct AnyName(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// `prefer` and `require` without a CA: encrypted, the certificate taken
/// as presented (libpq's meaning). The handshake's signatures are still
/// checked, so the server must hold the certificate's key.
#[derive(Debug)]
struct AcceptAny(Arc<CryptoProvider>);

impl ServerCertVerifier for AcceptAny {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libpq_modes_and_the_ca_are_taken_out_of_urls() {
        let (config, tls) = parse_url(
            "postgres://u@db.example.com:6543/app?sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem&application_name=x",
        )
        .unwrap();
        assert_eq!(tls.mode, SslMode::VerifyFull);
        assert_eq!(tls.root_cert.as_deref(), Some(Path::new("/etc/ca.pem")));
        assert_eq!(config.get_ssl_mode(), PgSslMode::Require);
        assert_eq!(config.get_application_name(), Some("x"));
        assert_eq!(config.get_ports(), &[6543]);

        let (config, tls) =
            parse_url("host=db user=u sslmode=verify-ca sslrootcert=/ca.pem").unwrap();
        assert_eq!(tls.mode, SslMode::VerifyCa);
        assert_eq!(config.get_user(), Some("u"));
        assert_eq!(config.get_ssl_mode(), PgSslMode::Require);

        let (config, tls) = parse_url("postgres://u@db/app").unwrap();
        assert_eq!(tls, TlsSettings::default());
        assert_eq!(config.get_ssl_mode(), PgSslMode::Prefer);
        let (config, _) = parse_url("postgres://u@db/app?sslmode=disable").unwrap();
        assert_eq!(config.get_ssl_mode(), PgSslMode::Disable);

        let err = parse_url("postgres://u@db/app?sslmode=sometimes").unwrap_err();
        assert!(
            err.to_string().contains("unknown sslmode `sometimes`"),
            "{err}"
        );
    }

    #[test]
    fn a_missing_or_empty_ca_file_is_a_clear_error() {
        let missing = TlsSettings {
            mode: SslMode::VerifyFull,
            root_cert: Some("/no/such/ca.pem".into()),
        };
        let err = connector(&missing).unwrap_err();
        assert!(format!("{err:#}").contains("/no/such/ca.pem"), "{err:#}");
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "").unwrap();
        let err = connector(&TlsSettings {
            mode: SslMode::VerifyCa,
            root_cert: Some(empty),
        })
        .unwrap_err();
        assert!(err.to_string().contains("holds no certificate"), "{err:#}");
        // Modes that check nothing need no CA at all.
        connector(&TlsSettings {
            mode: SslMode::Require,
            root_cert: None,
        })
        .unwrap();
    }
}
