//! Step 6, decided: the passwords pgop keeps in its credentials Secrets (`<cluster>-app`,
//! `<cluster>-replication` and, with `spec.credentials.superuserAccess`,
//! `<cluster>-superuser`), generated once or copied at every pass from a Secret the user
//! names (`spec.credentials.appSecret`, `.superuserSecret`: read only, by `observe`, into
//! [`UserSecrets`]); and the certificates ([`super::certificates`]).
//!
//! A user's Secret that cannot be used (missing, no `password`, another `username`) is
//! refused with a warning naming the field; the password in force stays (or, for a new
//! cluster, a generated one is used until the Secret is fixed). New passwords and keys are
//! the decisions' one source of randomness.

use super::certificates;
use crate::cluster::build::{self, Passwords};
use crate::cluster::error::Error;
use crate::cluster::notes::Note;
use crate::cluster::world::{UserSecret, UserSecrets};
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::runtime::events::EventType;
use pgop_api::constants::{
    APP_SECRET_SUFFIX, REPLICATION_SECRET_SUFFIX, SUPERUSER, SUPERUSER_SECRET_SUFFIX,
};
use pgop_api::v1beta1::PostgresClusterSpec;

/// Longest password accepted from a user's Secret, in bytes.
pub const MAX_PASSWORD_LENGTH: usize = 1024;

/// The application owner's name: `spec.bootstrap.initdb.owner` (`app` by default).
pub fn app_owner(spec: &PostgresClusterSpec) -> String {
    spec.bootstrap
        .as_ref()
        .and_then(|b| b.initdb.as_ref())
        .map(|i| i.owner.clone())
        .unwrap_or_else(|| "app".to_string())
}

/// Step 6: the passwords ([`passwords`]) and the certificates ([`certificates::plan`]),
/// and a Warning for each Secret of the user's refused (in the order found), to publish
/// before anything else the pass writes.
pub(in crate::cluster) fn credentials(
    input: Input<'_>,
) -> Result<(build::Credentials, Vec<Note>), Error> {
    let Input {
        cluster,
        namespace,
        spec,
        instances,
        secrets,
        users,
        now,
    } = input;
    let (passwords, warnings) = passwords(cluster, spec, secrets, users)?;
    let mut notes: Vec<Note> = warnings
        .iter()
        .map(|w| Note::new(EventType::Warning, "CredentialsSecretRefused", w))
        .collect();
    let instance_names: Vec<String> = instances.iter().map(|(n, _)| n.clone()).collect();
    let brought = users
        .server
        .as_ref()
        .map(|s| certificates::check_brought(s, cluster));
    let client_ca = users.client_ca.as_ref().map(certificates::check_client_ca);
    let pooler_services: Vec<String> = spec
        .poolers
        .iter()
        .map(|p| pgop_api::pooler::pooler_name(cluster, &p.name))
        .collect();
    let pki = certificates::plan(
        secrets,
        cluster,
        namespace,
        &instance_names,
        &pooler_services,
        (brought, client_ca),
        now,
    )?;
    notes.extend(
        pki.warnings
            .iter()
            .map(|w| Note::new(EventType::Warning, "TLSSecretRefused", w)),
    );
    let decided = build::Credentials {
        passwords,
        certificates: build::Certificates {
            ca_cert: pki.authority.cert_pem().to_string(),
            ca_key: pki.authority.key_pem().to_string(),
            manager_cert: pki.manager.cert_pem,
            manager_key: pki.manager.key_pem,
            manager_not_after: pki.manager.not_after.to_string(),
            postgres_ca_cert: pki.postgres_authority.cert_pem().to_string(),
            postgres_ca_key: pki.postgres_authority.key_pem().to_string(),
            server: pki.server,
            server_ca_cert: pki.server_ca,
            server_annotations: pki.server_annotations,
            replication: pki.replication,
            client_ca_cert: pki.client_ca,
        },
    };
    Ok((decided, notes))
}

/// What step 6 decides with.
#[derive(Clone, Copy)]
pub(in crate::cluster) struct Input<'a> {
    /// The cluster's name and namespace, and its spec with defaults.
    pub cluster: &'a str,
    pub namespace: &'a str,
    pub spec: &'a PostgresClusterSpec,
    /// Step 4's instances (name and serial): the server certificate names each.
    pub instances: &'a [(String, i32)],
    /// The cluster's own Secrets (step 3), and the user's it names.
    pub secrets: &'a [Secret],
    pub users: &'a UserSecrets,
    pub now: jiff::Timestamp,
}

/// Every password, and a warning for each Secret of the user's refused: a usable one is
/// copied, else the password in force (in the cluster's own Secret) stays, else a new one.
pub fn passwords(
    cluster: &str,
    spec: &PostgresClusterSpec,
    secrets: &[Secret],
    users: &UserSecrets,
) -> Result<(Passwords, Vec<String>), Error> {
    let mut warnings = Vec::new();
    let mut chosen = |field: &str,
                      brought: Option<&UserSecret>,
                      own: String,
                      username: &str|
     -> Result<(String, bool), Error> {
        if let Some(UserSecret { name, read }) = brought {
            let checked = read
                .as_ref()
                .map_err(Clone::clone)
                .and_then(|found| check_password(found, username));
            match checked {
                Ok(password) => return Ok((password, true)),
                Err(why) => warnings.push(format!(
                    "{field}: the Secret {name} {why}; the password in force stays"
                )),
            }
        }
        Ok((password_of(secrets, &own)?, false))
    };
    let (app, app_copied) = chosen(
        "spec.credentials.appSecret",
        users.app.as_ref(),
        format!("{cluster}{APP_SECRET_SUFFIX}"),
        &app_owner(spec),
    )?;
    let superuser = if spec.credentials.superuser_access {
        Some(chosen(
            "spec.credentials.superuserSecret",
            users.superuser.as_ref(),
            format!("{cluster}{SUPERUSER_SECRET_SUFFIX}"),
            SUPERUSER,
        )?)
    } else {
        None
    };
    let passwords = Passwords {
        app,
        app_copied,
        replication: password_of(secrets, &format!("{cluster}{REPLICATION_SECRET_SUFFIX}"))?,
        superuser,
        pooler: if spec.poolers.is_empty() {
            None
        } else {
            Some(password_of(
                secrets,
                &pgop_api::pooler::identity_name(cluster),
            )?)
        },
    };
    Ok((passwords, warnings))
}

/// The `password` of a user's Secret: UTF-8, not empty, no NUL (PostgreSQL cannot store
/// one), at most [`MAX_PASSWORD_LENGTH`] bytes; its `username`, if any, must be
/// `username`. Messages never quote the password.
pub fn check_password(secret: &Secret, username: &str) -> Result<String, String> {
    let data = secret.data.clone().unwrap_or_default();
    if let Some(given) = data.get("username") {
        let given = String::from_utf8_lossy(&given.0);
        if given != username {
            return Err(format!(
                "has username {given:?}, but the role is {username:?} (remove the key or make \
                 it {username:?})"
            ));
        }
    }
    let raw = data
        .get("password")
        .ok_or_else(|| "has no key `password`".to_string())?;
    let password = String::from_utf8(raw.0.clone())
        .map_err(|_| "has a `password` that is not UTF-8".to_string())?;
    if password.is_empty() {
        return Err("has an empty `password`".to_string());
    }
    if password.contains('\0') {
        return Err("has a `password` with a NUL character".to_string());
    }
    if password.len() > MAX_PASSWORD_LENGTH {
        return Err(format!(
            "has a `password` longer than {MAX_PASSWORD_LENGTH} bytes"
        ));
    }
    Ok(password)
}

/// The password in an existing Secret, or a new one when the Secret does not exist yet.
fn password_of(secrets: &[Secret], name: &str) -> Result<String, Error> {
    let existing = secrets
        .iter()
        .find(|s| s.name_any() == name)
        .and_then(|s| s.data.as_ref())
        .and_then(|d| d.get("password"))
        .and_then(|p| String::from_utf8(p.0.clone()).ok());
    match existing {
        Some(p) => Ok(p),
        None => generate_password(),
    }
}

/// 32 random characters from [A-Za-z0-9] (about 190 bits).
fn generate_password() -> Result<String, Error> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let mut out = String::with_capacity(32);
    while out.len() < 32 {
        let mut buf = [0u8; 64];
        getrandom::fill(&mut buf).map_err(Error::GeneratePassword)?;
        // Rejection sampling keeps every character equally likely.
        for b in buf {
            if (b as usize) < 248 && out.len() < 32 {
                out.push(ALPHABET[b as usize % ALPHABET.len()] as char);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    #[test]
    fn passwords_are_32_alphanumerics_and_differ() {
        let a = generate_password().expect("password");
        let b = generate_password().expect("password");
        assert_eq!(a.len(), 32);
        assert!(a.chars().all(|c| c.is_ascii_alphanumeric()));
        assert_ne!(a, b);
    }

    fn secret(pairs: &[(&str, &[u8])]) -> Secret {
        Secret {
            data: Some(
                pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), ByteString(v.to_vec())))
                    .collect(),
            ),
            ..Secret::default()
        }
    }

    #[test]
    fn a_users_password_is_checked_and_never_quoted() {
        let hostile = "p'w\"$(id)\n#=..";
        assert_eq!(
            check_password(&secret(&[("password", hostile.as_bytes())]), "app"),
            Ok(hostile.to_string()),
            "any characters but NUL: quoted where used"
        );
        assert_eq!(
            check_password(&secret(&[("username", b"app"), ("password", b"x")]), "app"),
            Ok("x".to_string())
        );
        for (data, expected) in [
            (
                secret(&[("username", b"shop"), ("password", b"s3cret")]),
                "has username \"shop\", but the role is \"app\"",
            ),
            (secret(&[("user", b"app")]), "has no key `password`"),
            (secret(&[("password", b"")]), "empty"),
            (secret(&[("password", b"s3\0cret")]), "NUL"),
            (secret(&[("password", &[0xff, 0xfe])]), "not UTF-8"),
            (secret(&[("password", &[b'a'; 1025])]), "longer than 1024"),
        ] {
            let err = check_password(&data, "app").expect_err(expected);
            assert!(err.contains(expected), "{err}");
            assert!(
                !err.contains("s3cret"),
                "the password is never quoted: {err}"
            );
        }
    }

    fn named(name: &str, password: &[u8]) -> Secret {
        let mut s = secret(&[("password", password)]);
        s.metadata.name = Some(name.to_string());
        s
    }

    #[test]
    fn a_users_password_is_copied_and_a_refused_one_keeps_the_one_in_force() {
        let spec: PostgresClusterSpec = serde_json::from_value(serde_json::json!({
            "instances": 1,
            "storage": {"size": "1Gi"},
            "credentials": {"appSecret": "shop", "superuserSecret": "root"}
        }))
        .expect("spec");
        let read = |name: &str, read: Result<Secret, String>| {
            Some(UserSecret {
                name: name.to_string(),
                read,
            })
        };
        let users = UserSecrets {
            app: read("shop", Ok(named("shop", b"s3cret"))),
            // Named, but superuserAccess is off: never used.
            superuser: read("root", Ok(named("root", b"r00t"))),
            ..UserSecrets::default()
        };
        let (copied, warnings) = passwords("db", &spec, &[], &users).expect("passwords");
        assert_eq!((copied.app.as_str(), copied.app_copied), ("s3cret", true));
        assert_eq!(copied.superuser, None);
        assert!(warnings.is_empty(), "{warnings:?}");

        let own = [
            named("db-app", b"in-force"),
            named("db-replication", b"repl"),
        ];
        for (refused, why) in [
            (Err("does not exist".to_string()), "does not exist"),
            (Ok(named("shop", b"")), "has an empty `password`"),
        ] {
            let users = UserSecrets {
                app: read("shop", refused),
                ..UserSecrets::default()
            };
            let (kept, warnings) = passwords("db", &spec, &own, &users).expect("passwords");
            assert_eq!((kept.app.as_str(), kept.app_copied), ("in-force", false));
            assert_eq!(kept.replication, "repl");
            assert_eq!(
                warnings,
                vec![format!(
                    "spec.credentials.appSecret: the Secret shop {why}; the password in force \
                     stays"
                )]
            );
        }
    }
}
