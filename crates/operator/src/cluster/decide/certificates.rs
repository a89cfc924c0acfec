//! Step 6's certificates, decided (see [`crate::cluster::pki`] for what each serves and
//! where it is kept): the authorities of the observed Secrets (new ones when there are
//! none) and the certificates, the observed ones while they are still good, else new ones;
//! a server certificate the user brings (`spec.tls.serverSecret`) and the client
//! authorities they add (`spec.tls.clientCASecret`) checked here, after `observe` read
//! them.

use crate::cluster::pki::{
    Error, Kind, MANAGER_CERT_DAYS, RENEW_BEFORE_DAYS, authority_of, ca_secret_name,
    manager_tls_secret_name, text,
};
use crate::cluster::world::UserSecret;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use pgop_api::constants::{
    ANNOTATION_BROUGHT_FROM, ANNOTATION_DNS_NAMES, ANNOTATION_NOT_AFTER, CLUSTER_DOMAIN,
    POSTGRES_CA_SECRET_SUFFIX, REPLICATION_TLS_SECRET_SUFFIX, REPLICATION_USER,
    SERVER_TLS_SECRET_SUFFIX,
};
use pgop_tls::{Authority, Issued, Usage};

/// The DNS names of PostgreSQL's server certificate: `<cluster>-rw` first (the name
/// instances verify when they connect to each other), then every Service's name short,
/// with its namespace, `.svc` and fully qualified (the poolers' Services `poolers` too:
/// PgBouncer serves its clients this certificate), then every instance's (Pod) name.
pub fn server_dns_names(
    cluster: &str,
    namespace: &str,
    instances: &[String],
    poolers: &[String],
) -> Vec<String> {
    let mut names = Vec::new();
    let services = ["rw", "ro", "r"]
        .into_iter()
        .map(|s| format!("{cluster}-{s}"))
        .chain(poolers.iter().cloned());
    for short in services {
        names.push(short.clone());
        names.push(format!("{short}.{namespace}"));
        names.push(format!("{short}.{namespace}.svc"));
        names.push(format!("{short}.{namespace}.svc.{CLUSTER_DOMAIN}"));
    }
    let mut pods = instances.to_vec();
    pods.sort();
    pods.dedup();
    names.extend(pods);
    names
}

/// The authority in Secret `name`, or a new one when there is none.
fn authority(
    secrets: &[Secret],
    name: &str,
    kind: Kind,
    now: jiff::Timestamp,
) -> Result<Authority, Error> {
    match secrets.iter().find(|s| s.name_any() == name) {
        Some(secret) => authority_of(secret, kind),
        None => match kind {
            Kind::Managers => Authority::generate(now),
            Kind::Postgres => Authority::generate_postgres(now),
        }
        .map_err(Error::Issue),
    }
}

/// The certificate in Secret `name` (`tls.crt`, `tls.key`, `ca.crt`, annotated with its
/// expiry and, for `names`, its DNS names), while it is `authority`'s, names what is
/// wanted and has more than [`RENEW_BEFORE_DAYS`] left.
fn current(
    secrets: &[Secret],
    name: &str,
    authority: &Authority,
    names: Option<&str>,
    now: jiff::Timestamp,
) -> Option<Issued> {
    let s = secrets.iter().find(|s| s.name_any() == name)?;
    let not_after: jiff::Timestamp = s.annotations().get(ANNOTATION_NOT_AFTER)?.parse().ok()?;
    let issued = Issued {
        cert_pem: text(s, "tls.crt").ok()?,
        key_pem: text(s, "tls.key").ok()?,
        not_after,
    };
    let ours = text(s, "ca.crt").ok()? == authority.cert_pem();
    let fresh =
        not_after.duration_since(now) > jiff::SignedDuration::from_hours(24 * RENEW_BEFORE_DAYS);
    let named = names.is_none_or(|n| {
        s.annotations()
            .get(ANNOTATION_DNS_NAMES)
            .map(String::as_str)
            == Some(n)
    });
    (ours && fresh && named).then_some(issued)
}

/// A cluster's authorities and current certificates.
pub struct Pki {
    /// The managers' channel.
    pub authority: Authority,
    pub manager: Issued,
    /// PostgreSQL's.
    pub postgres_authority: Authority,
    /// The server certificate and key (`not_after` means nothing for a brought one).
    pub server: Issued,
    /// The authority that verifies `server` (the app Secret's `ca.crt`).
    pub server_ca: String,
    /// The annotations of the server certificate's Secret.
    pub server_annotations: Vec<(&'static str, String)>,
    pub replication: Issued,
    /// The authorities whose client certificates PostgreSQL accepts: its own, then
    /// `spec.tls.clientCASecret`'s.
    pub client_ca: String,
    /// What the user should hear about (a brought certificate refused).
    pub warnings: Vec<String>,
}

/// A server certificate a user brings (`spec.tls.serverSecret`): the Secret's name and
/// its `tls.crt`, `tls.key` and `ca.crt`, or why they cannot serve.
pub struct Brought {
    pub secret: String,
    pub pems: Result<[String; 3], String>,
}

/// Checks `spec.tls.serverSecret` as read: its `tls.crt`, `tls.key` and `ca.crt`, the key
/// the certificate's, verifying against `ca.crt` for `<cluster>-rw`.
pub fn check_brought(secret: &UserSecret, cluster: &str) -> Brought {
    let pems = secret
        .read
        .as_ref()
        .map_err(Clone::clone)
        .and_then(|found| {
            let get = |key: &'static str| text(found, key).map_err(|e| e.to_string());
            let (cert, key, ca) = (get("tls.crt")?, get("tls.key")?, get("ca.crt")?);
            pgop_tls::postgres::check_server_certificate(
                &cert,
                &key,
                &ca,
                &format!("{cluster}-rw"),
            )
            .map_err(|e| e.to_string())?;
            Ok([cert, key, ca])
        });
    Brought {
        secret: secret.name.clone(),
        pems,
    }
}

/// `ca.crt` of `spec.tls.clientCASecret` as read, checked to hold certificates, or why
/// not (naming the Secret).
pub fn check_client_ca(secret: &UserSecret) -> Result<String, String> {
    let checked = secret
        .read
        .as_ref()
        .map_err(Clone::clone)
        .and_then(|found| {
            let ca = text(found, "ca.crt").map_err(|e| e.to_string())?;
            pgop_tls::postgres::PostgresTls::verify_full(&ca, None).map_err(|e| e.to_string())?;
            Ok(ca)
        });
    checked.map_err(|why| format!("Secret {} {why}", secret.name))
}

/// The authorities of the observed Secrets (new ones when there are none) and the
/// certificates: the observed ones while they are still good (see [`current`]), else new
/// ones. `instances`: the names of the cluster's instances, in the server certificate.
pub fn plan(
    secrets: &[Secret],
    cluster: &str,
    namespace: &str,
    instances: &[String],
    poolers: &[String],
    (brought, client_ca): (Option<Brought>, Option<Result<String, String>>),
    now: jiff::Timestamp,
) -> Result<Pki, Error> {
    let managers = authority(secrets, &ca_secret_name(cluster), Kind::Managers, now)?;
    let manager = match current(
        secrets,
        &manager_tls_secret_name(cluster),
        &managers,
        None,
        now,
    ) {
        Some(issued) => issued,
        None => managers
            .issue(Usage::ManagerServer, now, MANAGER_CERT_DAYS)
            .map_err(Error::Issue)?,
    };
    let postgres = authority(
        secrets,
        &format!("{cluster}{POSTGRES_CA_SECRET_SUFFIX}"),
        Kind::Postgres,
        now,
    )?;
    let names = server_dns_names(cluster, namespace, instances, poolers);
    let server_names = names.join(",");
    let mut warnings = Vec::new();
    let server_secret = format!("{cluster}{SERVER_TLS_SECRET_SUFFIX}");
    // A brought certificate that cannot serve leaves the one served so far (any, as its
    // Secret holds it), or pgop's own for a cluster that has none yet.
    let kept = |why: &str, from: &str| {
        let s = secrets.iter().find(|s| s.name_any() == server_secret)?;
        let issued = Issued {
            cert_pem: text(s, "tls.crt").ok()?,
            key_pem: text(s, "tls.key").ok()?,
            not_after: now,
        };
        let annotations = [
            ANNOTATION_NOT_AFTER,
            ANNOTATION_DNS_NAMES,
            ANNOTATION_BROUGHT_FROM,
        ]
        .into_iter()
        .filter_map(|k| Some((k, s.annotations().get(k)?.clone())))
        .collect::<Vec<_>>();
        tracing::debug!(why, from, "keeping the server certificate served so far");
        Some((issued, text(s, "ca.crt").ok()?, annotations))
    };
    let chosen = match brought {
        Some(Brought {
            secret,
            pems: Ok([cert_pem, key_pem, ca]),
        }) => Some((
            Issued {
                cert_pem,
                key_pem,
                not_after: now,
            },
            ca,
            vec![(ANNOTATION_BROUGHT_FROM, secret)],
        )),
        Some(Brought {
            secret,
            pems: Err(why),
        }) => {
            warnings.push(format!(
                "spec.tls.serverSecret: Secret {secret} {why}; PostgreSQL keeps serving the \
                 certificate it served so far"
            ));
            kept(&why, &secret)
        }
        None => None,
    };
    let (server, server_ca, server_annotations) = match chosen {
        Some(chosen) => chosen,
        None => {
            let server = match current(secrets, &server_secret, &postgres, Some(&server_names), now)
            {
                Some(issued) => issued,
                None => postgres
                    .issue_postgres_server(&names, now, pgop_tls::postgres::CERT_DAYS)
                    .map_err(Error::Issue)?,
            };
            let annotations = vec![
                (ANNOTATION_NOT_AFTER, server.not_after.to_string()),
                (ANNOTATION_DNS_NAMES, server_names),
            ];
            (server, postgres.cert_pem().to_string(), annotations)
        }
    };
    let mut client_cas = postgres.cert_pem().to_string();
    match client_ca {
        Some(Ok(ca)) => {
            if !client_cas.ends_with('\n') {
                client_cas.push('\n');
            }
            client_cas.push_str(&ca);
        }
        Some(Err(why)) => warnings.push(format!(
            "spec.tls.clientCASecret: {why}; PostgreSQL accepts only the replication \
             certificate's authority"
        )),
        None => {}
    }
    let replication = match current(
        secrets,
        &format!("{cluster}{REPLICATION_TLS_SECRET_SUFFIX}"),
        &postgres,
        None,
        now,
    ) {
        Some(issued) => issued,
        None => postgres
            .issue_postgres_client(REPLICATION_USER, now, pgop_tls::postgres::CERT_DAYS)
            .map_err(Error::Issue)?,
    };
    Ok(Pki {
        authority: managers,
        manager,
        postgres_authority: postgres,
        server,
        server_ca,
        server_annotations,
        replication,
        client_ca: client_cas,
        warnings,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;
    use std::collections::BTreeMap;

    fn secret(name: &str, data: &[(&str, &str)], not_after: Option<&str>) -> Secret {
        let mut s = Secret::default();
        s.metadata.name = Some(name.to_string());
        if let Some(at) = not_after {
            s.metadata.annotations = Some(BTreeMap::from([(
                ANNOTATION_NOT_AFTER.to_string(),
                at.to_string(),
            )]));
        }
        s.data = Some(
            data.iter()
                .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                .collect(),
        );
        s
    }

    fn ts(s: &str) -> jiff::Timestamp {
        s.parse().expect("timestamp")
    }

    #[test]
    fn a_new_cluster_gets_an_authority_and_a_certificate_kept_until_renewal_is_due() {
        let now = ts("2026-12-01T12:00:00Z");
        let first = plan(&[], "db", "ns", &[], &[], (None, None), now).expect("plan");
        assert_eq!(first.manager.not_after, ts("2027-03-01T00:00:00Z"));
        let stored = [
            secret(
                "db-ca",
                &[
                    ("ca.crt", first.authority.cert_pem()),
                    ("ca.key", first.authority.key_pem()),
                ],
                None,
            ),
            secret(
                "db-manager-tls",
                &[
                    ("tls.crt", &first.manager.cert_pem),
                    ("tls.key", &first.manager.key_pem),
                    ("ca.crt", first.authority.cert_pem()),
                ],
                Some(&first.manager.not_after.to_string()),
            ),
        ];
        // Read back: the same authority and the same certificate, until 30 days are left.
        let again = plan(
            &stored,
            "db",
            "ns",
            &[],
            &[],
            (None, None),
            ts("2027-01-29T23:59:59Z"),
        )
        .expect("plan");
        assert_eq!(again.authority.cert_pem(), first.authority.cert_pem());
        assert_eq!(again.manager, first.manager);
        let renewed = plan(
            &stored,
            "db",
            "ns",
            &[],
            &[],
            (None, None),
            ts("2027-01-30T00:00:00Z"),
        )
        .expect("plan");
        assert_eq!(renewed.authority.cert_pem(), first.authority.cert_pem());
        assert_ne!(renewed.manager.cert_pem, first.manager.cert_pem);
        assert_eq!(renewed.manager.not_after, ts("2027-04-30T00:00:00Z"));
    }

    #[test]
    fn a_certificate_of_another_authority_or_without_its_expiry_is_replaced() {
        let now = ts("2026-12-01T12:00:00Z");
        let first = plan(&[], "db", "ns", &[], &[], (None, None), now).expect("plan");
        let ca = secret(
            "db-ca",
            &[
                ("ca.crt", first.authority.cert_pem()),
                ("ca.key", first.authority.key_pem()),
            ],
            None,
        );
        let other = plan(&[], "db", "ns", &[], &[], (None, None), now).expect("another authority");
        let foreign = secret(
            "db-manager-tls",
            &[
                ("tls.crt", &other.manager.cert_pem),
                ("tls.key", &other.manager.key_pem),
                ("ca.crt", other.authority.cert_pem()),
            ],
            Some(&other.manager.not_after.to_string()),
        );
        let p = plan(
            &[ca.clone(), foreign],
            "db",
            "ns",
            &[],
            &[],
            (None, None),
            now,
        )
        .expect("plan");
        assert_ne!(p.manager.cert_pem, other.manager.cert_pem);
        let unannotated = secret(
            "db-manager-tls",
            &[
                ("tls.crt", &first.manager.cert_pem),
                ("tls.key", &first.manager.key_pem),
                ("ca.crt", first.authority.cert_pem()),
            ],
            None,
        );
        let p = plan(&[ca, unannotated], "db", "ns", &[], &[], (None, None), now).expect("plan");
        assert_ne!(p.manager.cert_pem, first.manager.cert_pem);
    }

    #[test]
    fn a_broken_authority_is_an_error_naming_its_secret() {
        let broken = secret("db-ca", &[("ca.crt", "junk"), ("ca.key", "junk")], None);
        let err = plan(
            &[broken],
            "db",
            "ns",
            &[],
            &[],
            (None, None),
            jiff::Timestamp::now(),
        )
        .err()
        .expect("an error");
        assert!(err.to_string().contains("db-ca"), "{err}");
        let partial = secret("db-ca", &[("ca.crt", "junk")], None);
        let err = plan(
            &[partial],
            "db",
            "ns",
            &[],
            &[],
            (None, None),
            jiff::Timestamp::now(),
        )
        .err()
        .expect("an error");
        assert_eq!(err.to_string(), "Secret db-ca lacks ca.key");
    }

    #[test]
    fn the_server_certificate_follows_the_instances_and_postgres_has_its_own_authority() {
        let now = ts("2026-12-01T12:00:00Z");
        let instances = ["db-1".to_string(), "db-2".to_string()];
        let first = plan(&[], "db", "ns", &instances, &[], (None, None), now).expect("plan");
        assert_ne!(
            first.postgres_authority.cert_pem(),
            first.authority.cert_pem(),
            "PostgreSQL's authority is not the managers'"
        );
        let names = |p: &Pki| {
            p.server_annotations
                .iter()
                .find(|(k, _)| *k == ANNOTATION_DNS_NAMES)
                .map(|(_, v)| v.clone())
                .unwrap_or_default()
        };
        let first_names = names(&first);
        assert!(
            first_names
                .starts_with("db-rw,db-rw.ns,db-rw.ns.svc,db-rw.ns.svc.cluster.local,db-ro,"),
            "{first_names}"
        );
        assert!(first_names.ends_with(",db-1,db-2"), "{first_names}");
        let tls = |name: &str, issued: &Issued, names: Option<&str>| {
            let mut s = secret(
                name,
                &[
                    ("tls.crt", &issued.cert_pem),
                    ("tls.key", &issued.key_pem),
                    ("ca.crt", first.postgres_authority.cert_pem()),
                ],
                Some(&issued.not_after.to_string()),
            );
            if let Some(names) = names {
                s.metadata
                    .annotations
                    .get_or_insert_default()
                    .insert(ANNOTATION_DNS_NAMES.to_string(), names.to_string());
            }
            s
        };
        let stored = [
            secret(
                "db-postgres-ca",
                &[
                    ("ca.crt", first.postgres_authority.cert_pem()),
                    ("ca.key", first.postgres_authority.key_pem()),
                ],
                None,
            ),
            tls("db-server-tls", &first.server, Some(&first_names)),
            tls("db-replication-tls", &first.replication, None),
        ];
        let same = plan(&stored, "db", "ns", &instances, &[], (None, None), now).expect("plan");
        assert_eq!(same.server, first.server);
        assert_eq!(same.replication, first.replication);
        let scaled = plan(
            &stored,
            "db",
            "ns",
            &["db-1".to_string(), "db-2".to_string(), "db-3".to_string()],
            &[],
            (None, None),
            now,
        )
        .expect("plan");
        assert_ne!(scaled.server, first.server, "a new name, a new certificate");
        assert!(names(&scaled).ends_with(",db-3"));
        assert_eq!(scaled.replication, first.replication);
    }

    #[test]
    fn a_brought_server_certificate_is_served_and_a_refused_one_keeps_the_one_served() {
        let now = ts("2026-12-01T12:00:00Z");
        let theirs = Authority::generate_postgres(now).expect("their authority");
        let cert = theirs
            .issue_postgres_server(&["db-rw".to_string()], now, 30)
            .expect("their certificate");
        let brought = |pems: Result<[String; 3], String>| Brought {
            secret: "db-cert".into(),
            pems,
        };
        let good = brought(Ok([
            cert.cert_pem.clone(),
            cert.key_pem.clone(),
            theirs.cert_pem().to_string(),
        ]));
        let client_ca = Authority::generate_postgres(now).expect("a client authority");
        let p = plan(
            &[],
            "db",
            "ns",
            &[],
            &[],
            (Some(good), Some(Ok(client_ca.cert_pem().to_string()))),
            now,
        )
        .expect("plan");
        assert_eq!(p.server.cert_pem, cert.cert_pem);
        assert_eq!(p.server_ca, theirs.cert_pem());
        assert_eq!(
            p.server_annotations,
            vec![(ANNOTATION_BROUGHT_FROM, "db-cert".to_string())]
        );
        assert!(p.client_ca.starts_with(p.postgres_authority.cert_pem()));
        assert!(p.client_ca.ends_with(client_ca.cert_pem()));
        assert!(p.warnings.is_empty(), "{:?}", p.warnings);

        // Refused with a certificate served so far: that one stays, and the user hears why.
        let served = secret(
            "db-server-tls",
            &[
                ("tls.crt", &cert.cert_pem),
                ("tls.key", &cert.key_pem),
                ("ca.crt", theirs.cert_pem()),
            ],
            None,
        );
        let refused = || brought(Err("does not exist".into()));
        let p = plan(
            &[served],
            "db",
            "ns",
            &[],
            &[],
            (Some(refused()), None),
            now,
        )
        .expect("plan");
        assert_eq!(p.server.cert_pem, cert.cert_pem);
        assert_eq!(p.server_ca, theirs.cert_pem());
        assert_eq!(p.warnings.len(), 1);
        assert!(
            p.warnings[0].contains("spec.tls.serverSecret") && p.warnings[0].contains("db-cert"),
            "{:?}",
            p.warnings
        );
        // Refused with none served yet: pgop's own, so that the cluster can start.
        let p = plan(
            &[],
            "db",
            "ns",
            &[],
            &[],
            (
                Some(refused()),
                Some(Err("Secret ca does not exist".into())),
            ),
            now,
        )
        .expect("plan");
        assert_eq!(p.server_ca, p.postgres_authority.cert_pem());
        assert_eq!(p.client_ca, p.postgres_authority.cert_pem());
        assert_eq!(p.warnings.len(), 2, "{:?}", p.warnings);
    }
}
