//! TLS to Postgres: a private cluster with `ssl=on` and a certificate made
//! here (a test CA signing one for `localhost`), reached through
//! `DATABASE_URL` with each `sslmode`, as a managed Postgres would be.

use crate::support;

use std::path::Path;

use crate::support::{get, send, stat_uri, ADMIN_TOKEN};
use axum::http::StatusCode;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use server::db::{self, Database, Postgres};
use server::settings::{DbSettings, Settings};

/// A CA's PEM certificate and an issuer for it.
fn ca(name: &str) -> (String, Issuer<'static, KeyPair>) {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    let key = KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    (cert.pem(), Issuer::new(params, key))
}

/// A server certificate for `localhost` signed by `issuer`, and its key.
fn server_cert(issuer: &Issuer<'static, KeyPair>) -> (String, String) {
    let mut params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    params
        .distinguished_name
        .push(DnType::CommonName, "localhost");
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

async fn open(url: String) -> anyhow::Result<(Database, Postgres)> {
    let database = Database::open(&DbSettings {
        url: Some(url),
        ..DbSettings::default()
    })
    .await?;
    let target = Postgres::from(&database);
    Ok((database, target))
}

/// Why a connection to `url` is refused: opening the database connects
/// (to find out whether a pooler is in between, `--pooler auto`), so the
/// refusal comes from there, or else from the first connection after.
async fn refusal(url: String) -> String {
    match open(url).await {
        Err(err) => format!("{err:#} {err:?}"),
        Ok((_, target)) => {
            let err = target.connect().await.unwrap_err();
            format!("{err:#} {err:?}")
        }
    }
}

/// Whether the session of `client` is encrypted.
async fn encrypted(client: &tokio_postgres::Client) -> bool {
    client
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

#[tokio::test]
async fn each_sslmode_connects_or_refuses_as_libpq_would() {
    let (ca_pem, issuer) = ca("pgbatch test CA");
    let (cert, key) = server_cert(&issuer);
    let cluster =
        match embedded_pg::testing::private_cluster_with(|o| o.listen_tcp(true).tls(cert, key))
            .await
        {
            Ok(cluster) => cluster,
            // PyPI's PostgreSQL 18 build (PGBATCH_PG_VERSION=18) has no
            // OpenSSL; CI runs this test on Debian's 15, which has.
            Err(e) if e.to_string().contains("SSL is not supported by this build") => {
                eprintln!("not run: this PostgreSQL was built without SSL ({e})");
                return;
            }
            Err(e) => panic!("a private cluster with TLS: {e}"),
        };
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, &ca_pem).unwrap();
    let (other_ca, _) = ca("some other CA");
    let other_ca_file = dir.path().join("other-ca.pem");
    std::fs::write(&other_ca_file, other_ca).unwrap();

    let tcp = cluster.tcp_config("postgres").expect("TCP is on");
    let user = tcp.get_user().unwrap().to_owned();
    let port = cluster.tcp_addr().unwrap().port();
    let url = |host: &str, query: &str| {
        // `hostaddr` keeps `localhost` from resolving to ::1, where the
        // cluster does not listen; the certificate is checked against
        // `host`.
        format!("postgres://{user}@{host}:{port}/postgres?hostaddr=127.0.0.1&{query}")
    };
    let with_ca = |ca: &Path, mode: &str| format!("sslmode={mode}&sslrootcert={}", ca.display());

    // verify-full with the right CA: the service's whole start-up works,
    // and its pools are encrypted.
    let (database, target) = open(url("localhost", &with_ca(&ca_file, "verify-full")))
        .await
        .expect("verify-full with the signing CA");
    server::testing::prepare(&database, 10, 10, ADMIN_TOKEN)
        .await
        .unwrap();
    let app = support::app_on(&target, &Settings::default()).await;
    let (status, body) = send(
        &app.router,
        get(&stat_uri("demo", &db::seed::object_path(1))),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let client = target.connect().await.unwrap();
    assert!(encrypted(&client).await);
    let plain_tcp_sessions: i64 = client
        .query_one(
            "SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
             WHERE a.client_addr IS NOT NULL AND NOT s.ssl",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        plain_tcp_sessions, 0,
        "every pooled connection is encrypted"
    );

    // A certificate from another CA is refused, with a clear error.
    let text = refusal(url("localhost", &with_ca(&other_ca_file, "verify-full"))).await;
    assert!(
        text.contains("UnknownIssuer") || text.contains("certificate"),
        "{text}"
    );

    // The certificate names `localhost`, not 127.0.0.1: verify-full
    // refuses the name, verify-ca only checks the chain.
    let text = refusal(url("127.0.0.1", &with_ca(&ca_file, "verify-full"))).await;
    assert!(
        text.contains("NotValidForName") || text.contains("not valid for name"),
        "{text}"
    );
    let (_, chain_only) = open(url("127.0.0.1", &with_ca(&ca_file, "verify-ca")))
        .await
        .unwrap();
    assert!(encrypted(&chain_only.connect().await.unwrap()).await);

    // require encrypts without checking, as libpq does; disable does not
    // encrypt.
    let (_, required) = open(url("127.0.0.1", "sslmode=require")).await.unwrap();
    assert!(encrypted(&required.connect().await.unwrap()).await);
    let (_, plain) = open(url("localhost", "sslmode=disable")).await.unwrap();
    assert!(!encrypted(&plain.connect().await.unwrap()).await);
}
